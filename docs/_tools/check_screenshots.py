"""Checks that each screenshot shows a page: text and figures, not a blank or one colour.

  python docs/_tools/check_screenshots.py docs/_build/screenshots/*.png

A page of text on a white background has a few percent of its pixels dark; a blank render (a
missing file, a page that failed to load) has none. Exits 1 naming each screenshot that fails.
"""

from __future__ import annotations

import sys

import numpy as np
from matplotlib import image


def ink(path: str) -> float:
  """The fraction of the screenshot's pixels that are clearly darker than paper."""
  pixels = np.asarray(image.imread(path), dtype=np.float32)[..., :3]
  return float(np.mean(pixels.mean(axis=-1) < 0.6))


def main(paths: list[str]) -> int:
  if not paths:
    print("check_screenshots: no screenshots given")
    return 1
  failed = 0
  for path in paths:
    share = ink(path)
    shows = 0.005 < share < 0.9
    failed += not shows
    print(f"{path}: {share:.1%} of pixels dark: {'a page' if shows else 'BLANK or one colour'}")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
