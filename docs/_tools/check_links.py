"""Checks every internal link of the built site: each relative ``href`` (and ``src``) names a
file of the build, and its ``#anchor``, where it has one, an ``id`` in that file.

  python docs/_tools/check_links.py docs/_build/html

Prints each broken link with the page it is on and exits 1 if there is any. External links
(http, https, mailto) are not fetched: the site is built offline.
"""

from __future__ import annotations

import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Page(HTMLParser):
  def __init__(self) -> None:
    super().__init__(convert_charrefs=True)
    self.ids: set[str] = set()
    self.links: list[str] = []

  def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    for name, value in attrs:
      if value is None:
        continue
      if name in ("id", "name"):
        self.ids.add(value)
      elif (name == "href" and tag in ("a", "link")) or (
        name == "src" and tag in ("img", "script")
      ):
        self.links.append(value)


def _parse(path: Path) -> _Page:
  page = _Page()
  page.feed(path.read_text(encoding="utf-8", errors="replace"))
  return page


def broken_links(root: Path) -> list[str]:
  """Each broken internal link, as ``'page: link (why)'``."""
  # _static/ holds the theme's template fragments, not pages.
  pages = {
    path: _parse(path) for path in sorted(root.rglob("*.html")) if "_static" not in path.parts
  }
  problems = []
  for path, page in pages.items():
    for link in page.links:
      parts = urlsplit(link)
      if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
        continue
      target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
      if target.is_dir():
        target = target / "index.html"
      where = path.relative_to(root)
      if not target.exists():
        problems.append(f"{where}: {link} (no file {target.relative_to(root.resolve())})")
        continue
      anchor = unquote(parts.fragment)
      if anchor and target.suffix == ".html":
        ids = pages[target].ids if target in pages else _parse(target).ids
        if anchor not in ids:
          problems.append(f"{where}: {link} (no id {anchor!r} in {target.name})")
  return problems


class _Table(HTMLParser):
  """The first cell of each body row of the API index's table, and whether it holds a link."""

  def __init__(self) -> None:
    super().__init__(convert_charrefs=True)
    self.rows: list[tuple[str, bool]] = []
    self._cell = -1
    self._in_body = False

  def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    if tag == "tbody":
      self._in_body = True
    elif tag == "tr" and self._in_body:
      self._cell = -1
    elif tag == "td" and self._in_body:
      self._cell += 1
      if self._cell == 0:
        self.rows.append(("", False))
    elif tag == "a" and self._in_body and self._cell == 0 and self.rows:
      self.rows[-1] = (self.rows[-1][0], True)

  def handle_endtag(self, tag: str) -> None:
    if tag == "tbody":
      self._in_body = False

  def handle_data(self, data: str) -> None:
    if self._in_body and self._cell == 0 and self.rows:
      self.rows[-1] = (self.rows[-1][0] + data, self.rows[-1][1])


def unlinked_index_rows(root: Path) -> list[str]:
  """Each name in the API index's "at a glance" table that links to no entry (an unresolved
  cross-reference renders as plain code, and Sphinx says nothing)."""
  table = _Table()
  table.feed((root / "api" / "index.html").read_text(encoding="utf-8"))
  if not table.rows:
    return ["api/index.html: no table found"]
  return [
    f"api/index.html: {name.strip()!r} links to no entry"
    for name, linked in table.rows
    if not linked
  ]


def main() -> int:
  root = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/_build/html").resolve()
  if not (root / "index.html").exists():
    print(f"check_links: no built site at {root} (run sphinx-build first)")
    return 1
  problems = broken_links(root) + unlinked_index_rows(root)
  for problem in problems:
    print(problem)
  pages = len([p for p in root.rglob("*.html") if "_static" not in p.parts])
  print(f"check_links: {len(problems)} broken internal links in {pages} pages")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
