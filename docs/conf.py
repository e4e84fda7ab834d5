"""Sphinx configuration of optcore's documentation (``nox -s docs``).

Sphinx with MyST Markdown, as optax, Flax, JAX and orbax build theirs: autodoc reads the
docstrings of the installed packages, so the API reference is the code's own text.
"""

from __future__ import annotations

import sys
from pathlib import Path

import optcore

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "_ext"))

project = "optcore"
author = "the optcore authors"
copyright = "2026, the optcore authors"
release = version = optcore.__version__

extensions = [
  "myst_parser",
  "sphinx.ext.autodoc",
  "sphinx.ext.napoleon",
  "sphinx_design",
  "benchmark_report",
  "codediff",
  "optax_alias",
  "toc_breaks",
]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]

autodoc_member_order = "bysource"
# The page contents list a method as `apply_gradient()`, not `Optimizer.apply_gradient()`: the
# class heads its methods there, and the short name fits the column without breaking a word.
toc_object_entries_show_parents = "hide"
autodoc_typehints = "signature"
# No viewcode: its source pages linked back to anchors under the names the code is defined
# at (optcore._src...), not the public names the reference documents.
# No default options: each entry says what it shows (``:members:`` lists a class's public
# methods). A default of ``{"members": False}`` silently overrode every ``:members:``.
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "sphinx_book_theme"
html_title = f"optcore {version}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
  "show_toc_level": 2,
  "navigation_with_keys": False,
  "home_page_in_toc": True,
}
# The site is built offline: no intersphinx inventories, no external fetches.
