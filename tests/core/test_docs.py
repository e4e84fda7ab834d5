"""The README's and the documentation's Python blocks that need no framework run, every named
block belongs to a guide test, and the API reference has an entry for every public name."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_blocks import (
  BLOCKS,
  GUIDE_BLOCKS,
  ROOT,
  block_id,
  blocks_for,
  documented_names,
  public_names,
  run_block,
)

import optcore
from optcore import contrib

CORE_BLOCKS = blocks_for(None)


def test_the_readme_and_the_pages_have_python_examples():
  pages = {b.page for b in CORE_BLOCKS}
  assert "README.md" in pages and any(p.startswith("docs/") for p in pages)


@pytest.mark.parametrize("block", CORE_BLOCKS, ids=block_id)
def test_block_runs(block):
  run_block(block)


def test_every_named_block_is_run_by_its_guide_test():
  assert {b.name for b in BLOCKS if b.name} == set(GUIDE_BLOCKS)
  for name, test_module in GUIDE_BLOCKS.items():
    assert f'named_block("{name}")' in (ROOT / test_module).read_text(), (name, test_module)


def test_the_api_reference_lists_every_public_name_of_optcore():
  expected = public_names(optcore) | {f"optcore.contrib.{n}" for n in contrib.CONTRIB_OPTIMIZERS}
  expected |= {"optcore.contrib.CONTRIB_OPTIMIZERS"}
  documented = documented_names("optcore")
  assert documented == expected


def test_public_names_sees_a_submodules_names():
  assert "optcore.legacy.Adam" in public_names(optcore)
  assert "optcore.adapter.step" in public_names(optcore)


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path):
  """docs/_tools/check_links.py, which nox -s docs runs on the built site."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "check_links", Path(__file__).resolve().parents[2] / "docs" / "_tools" / "check_links.py"
  )
  check_links = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(check_links)
  (tmp_path / "api").mkdir()
  (tmp_path / "index.html").write_text(
    '<a href="api/page.html#there">ok</a> <a href="api/page.html#gone">anchor</a> '
    '<a href="missing.html">page</a> <a href="https://example.org/x.html">external</a>'
  )
  (tmp_path / "api" / "page.html").write_text('<dt id="there">x</dt><a href="../index.html">up</a>')
  problems = check_links.broken_links(tmp_path)
  assert problems == [
    "index.html: api/page.html#gone (no id 'gone' in page.html)",
    "index.html: missing.html (no file missing.html)",
  ]


def test_contents_names_break_between_their_words_only():
  """docs/_ext/toc_breaks.py, which the site build runs: a name in a contents link may wrap after
  '_', '.', '/' or before a capital that ends a lower-case run, never inside a word; literals
  elsewhere in a page are left alone."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "toc_breaks", Path(__file__).resolve().parents[2] / "docs" / "_ext" / "toc_breaks.py"
  )
  toc_breaks = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(toc_breaks)
  literal = '<code class="docutils literal notranslate"><span class="pre">{}</span></code>'
  entry = '<a class="reference internal nav-link" href="#x">See {}</a>'
  page = entry.format(literal.format("MissingHyperParameterError.apply_gradient()"))
  page += literal.format("apply_gradient")  # in the article: untouched
  assert toc_breaks.add_breaks(page) == entry.format(
    literal.format("Missing<wbr>Hyper<wbr>Parameter<wbr>Error.<wbr>apply_<wbr>gradient()")
  ) + literal.format("apply_gradient")
  assert toc_breaks.add_breaks(entry.format(literal.format("results/suite.md"))) == entry.format(
    literal.format("results/<wbr>suite.<wbr>md")
  )
