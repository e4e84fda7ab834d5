"""Checks that no code block, table or figure of the built site is clipped at a laptop's width.

  python docs/_tools/check_clipping.py docs/_build/html [--width 1280]

Each page is loaded in headless Chromium in a window of ``--width`` pixels (1280: a laptop) and
measured in the browser: every code block must show its lines whole (no scrolling, and a line
of up to 100 characters, ruff's limit, unwrapped; longer ones may wrap), every table must fit
the article or sit in a container that scrolls sideways, every figure must be shown at least at
60% of its drawn width (or the article's), and no name in the page's side contents may be cut
or broken inside a word. A screenshot with hidden scrollbars cannot tell a clipped block from
one that scrolls; the browser's layout can.
Exits 1 naming each page, element and overflow.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Runs inside the page's frame: one finding per element that a reader at this width cannot see.
MEASURE = r"""
const LINE = 100;
function measure(win) {
  const doc = win.document, found = [];
  const article = doc.querySelector('.bd-article') || doc.body;
  const right = article.getBoundingClientRect().right;
  const text = el => (el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60);
  const scrolls = el => {
    for (let a = el; a && a !== article; a = a.parentElement) {
      const o = win.getComputedStyle(a).overflowX;
      if ((o === 'auto' || o === 'scroll') && a !== el) return true;
    }
    return false;
  };
  for (const pre of article.querySelectorAll('pre')) {
    if (pre.scrollWidth > pre.clientWidth + 1) {
      found.push(['code block', pre.scrollWidth - pre.clientWidth, text(pre)]);
      continue;
    }
    // A line of up to LINE characters (ruff's limit) must show whole, unwrapped.
    const longest = Math.min(LINE, Math.max(...pre.textContent.split('\n').map(l => l.length)));
    const probe = doc.createElement('span');
    probe.style.whiteSpace = 'pre';
    probe.textContent = 'M'.repeat(longest);
    pre.appendChild(probe);
    const cs = win.getComputedStyle(pre);
    const room = pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    const need = probe.getBoundingClientRect().width;
    probe.remove();
    const what = `a ${longest}-character line wraps: ${text(pre)}`;
    if (need > room + 1) found.push(['code block', Math.round(need - room), what]);
  }
  for (const table of article.querySelectorAll('table')) {
    const over = Math.round(table.getBoundingClientRect().right - right);
    if (over > 1 && !scrolls(table)) found.push(['table', over, text(table)]);
  }
  for (const img of article.querySelectorAll('img')) {
    const shown = img.getBoundingClientRect().width;
    const room = Math.min(img.naturalWidth, article.clientWidth);
    if (img.naturalWidth && shown < 0.6 * room)
      found.push(['figure', Math.round(room - shown), img.getAttribute('src')]);
  }
  const side = doc.querySelector('.bd-sidebar-secondary');
  for (const code of doc.querySelectorAll('.bd-sidebar-secondary a code')) {
    const breaks = code.querySelector('wbr') || /[\s\-]/.test(code.textContent.trim());
    const lines = [...code.getClientRects()].filter(r => r.width > 1).length;
    if (lines > 1 && !breaks)
      found.push(['side contents', 0, 'a name broken inside a word: ' + code.textContent.trim()]);
    const edge = side.getBoundingClientRect().right;
    const over = Math.round(code.getBoundingClientRect().right - edge);
    if (side.offsetWidth && over > 0) found.push(['side contents', over, code.textContent.trim()]);
  }
  return found;
}
"""

PAGE = """<!doctype html><html><body>
<iframe id="page" style="width:{width}px;height:1000px;border:0"></iframe>
<pre id="result">pending</pre>
<script>{measure}
const frame = document.getElementById('page');
frame.onload = () => {{
  let out;
  try {{ out = JSON.stringify(measure(frame.contentWindow)); }}
  catch (e) {{ out = JSON.stringify([['error', 0, String(e)]]); }}
  document.getElementById('result').textContent = out;
}};
frame.src = decodeURIComponent(location.hash.slice(1));
</script></body></html>"""


def findings(chromium: str, checker: Path, page: Path) -> list[list]:
  """What ``page`` shows clipped, measured by Chromium through ``checker``."""
  dom = subprocess.run(
    [
      chromium,
      "--headless",
      "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
      "--disable-gpu",
      "--allow-file-access-from-files",  # the checker reads the page's frame
      "--window-size=3000,1200",
      "--virtual-time-budget=10000",
      "--dump-dom",
      f"{checker.as_uri()}#{page.resolve().as_uri()}",
    ],
    capture_output=True,
    text=True,
    check=False,
    timeout=120,
  ).stdout
  match = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
  if match is None or match.group(1) == "pending":
    return [["error", 0, "Chromium did not finish measuring the page"]]
  return json.loads(match.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("html", type=Path, help="the built site (docs/_build/html)")
  parser.add_argument("--width", type=int, default=1280)
  parser.add_argument("--chromium", default="chromium")
  args = parser.parse_args(argv)
  pages = sorted(p for p in args.html.rglob("*.html") if "_static" not in p.parts)
  pages = [p for p in pages if p.name not in ("genindex.html", "search.html")]
  with tempfile.TemporaryDirectory() as tmp:
    checker = Path(tmp) / "checker.html"
    checker.write_text(PAGE.format(width=args.width, measure=MEASURE))
    failed = 0
    for page in pages:
      for kind, pixels, what in findings(args.chromium, checker, page):
        failed += 1
        print(f"{page.relative_to(args.html)}: {kind} clipped by {pixels}px: {what}")
  print(f"check_clipping: {len(pages)} pages at {args.width}px, {failed} clipped elements")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
