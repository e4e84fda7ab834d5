"""Lets a long name in a page's side contents break between its words, never inside one.

The right-hand contents column is 13.5rem wide: ``optimistic_gradient_descent()`` does not fit on
one line, and CSS alone can only cut it or break it anywhere (``apply_gradi ent()``). After the
build, each name in a contents link gets a ``<wbr>`` (a line-break opportunity that shows
nothing) after each underscore, dot and slash and before each capital that ends a lower-case run
(``MissingHyper<wbr>Parameter<wbr>Error``), so it wraps between its words.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# A contents entry: the theme's nav link; the names in it are docutils literals.
ENTRY = re.compile(r'(<a class="reference internal nav-link"[^>]*>)(.*?)(</a>)', re.S)
LITERAL = re.compile(r'(<span class="pre">)([^<]+)(</span>)')
# Where a name's words meet: after '_', '.' or '/', and between a lower-case letter and a capital.
BETWEEN_WORDS = re.compile(r"(?<=[_./])(?=.)|(?<=[a-z])(?=[A-Z])")


def add_breaks(html: str) -> str:
  """``html`` with a ``<wbr>`` between the words of every name in a contents entry."""

  def literal(m: re.Match) -> str:
    return m[1] + BETWEEN_WORDS.sub("<wbr>", m[2]) + m[3]

  return ENTRY.sub(lambda m: m[1] + LITERAL.sub(literal, m[2]) + m[3], html)


def _rewrite(app: Any, exception: Exception | None) -> None:
  if exception is not None or app.builder.format != "html":
    return
  for page in Path(app.outdir).rglob("*.html"):
    text = page.read_text(encoding="utf-8")
    new = add_breaks(text)
    if new != text:
      page.write_text(new, encoding="utf-8")


def setup(app: Any) -> dict[str, Any]:
  app.connect("build-finished", _rewrite)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
