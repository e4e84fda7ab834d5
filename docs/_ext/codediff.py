"""Migration guides as diffs: each pair of programs named ``<guide>-before`` and
``<guide>-after`` gets, above the two, a unified diff of what changes, and in each program its
changed lines highlighted (full width, one program under the other).

The programs stay ordinary named code blocks, so the guides' tests run both as they are; the
diff is computed when the site is built and cannot drift from them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from docutils import nodes


def _pairs(
  doctree: nodes.document,
) -> Iterator[tuple[str, nodes.literal_block, nodes.literal_block]]:
  blocks = {name: node for node in doctree.findall(nodes.literal_block) for name in node["names"]}
  for name, before in blocks.items():
    if name.endswith("-before") and (after := blocks.get(name[: -len("before")] + "after")):
      yield name[: -len("-before")], before, after


def _changed_lines(before: list[str], after: list[str]) -> tuple[list[int], list[int]]:
  """1-based numbers of the lines each side changes (replaced, removed or added)."""
  removed: list[int] = []
  added: list[int] = []
  matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
  for tag, i1, i2, j1, j2 in matcher.get_opcodes():
    if tag != "equal":
      removed += range(i1 + 1, i2 + 1)
      added += range(j1 + 1, j2 + 1)
  return removed, added


def _lines(n: int) -> str:
  return f"{n} line" if n == 1 else f"{n} lines"


def _mark(app, doctree: nodes.document) -> None:
  for guide, before, after in list(_pairs(doctree)):
    old, new = before.astext().splitlines(), after.astext().splitlines()
    removed, added = _changed_lines(old, new)
    before.setdefault("highlight_args", {})["hl_lines"] = removed
    after.setdefault("highlight_args", {})["hl_lines"] = added
    diff = "\n".join(difflib.unified_diff(old, new, "before", "after", n=2, lineterm=""))
    shown = nodes.literal_block(diff, diff, language="diff", classes=["codediff"])
    intro = nodes.paragraph(
      "",
      f"What changes ({_lines(len(removed))} out, {len(added)} in; both programs follow in "
      "full, their changed lines highlighted):",
    )
    # Above the "Before" label that introduces the first program.
    anchor = before.parent if isinstance(before.parent, nodes.container) else before
    parent = anchor.parent
    index = parent.index(anchor)
    if index and isinstance(parent[index - 1], nodes.paragraph):
      index -= 1
    parent.insert(index, [intro, shown])
    app.env.metadata.setdefault(app.env.docname, {})[f"codediff-{guide}"] = len(added)


def setup(app):
  app.connect("doctree-read", _mark)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
