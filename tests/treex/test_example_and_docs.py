"""examples/treex_quickstart.py, the README's and the pages' treex blocks and the adapter's
docstring examples run as a user runs them."""

from __future__ import annotations

import pytest
from doc_blocks import block_id, blocks_for, documented_names, public_names, run_block
from doctests import failures_in, modules_of
from example_runner import run_example

import optcore_treex


def test_treex_quickstart_learns_the_map():
  stdout = run_example("treex_quickstart.py")
  assert "w = [1.0, -2.0, 0.5, 3.0], b = 0.70" in stdout
  assert "examples seen: 38400; optimizer steps: 300" in stdout


def test_the_pages_have_treex_examples():
  assert blocks_for("treex")


@pytest.mark.parametrize("block", blocks_for("treex"), ids=block_id)
def test_treex_block_runs(block):
  run_block(block)


def test_the_api_reference_lists_every_public_name_of_optcore_treex():
  assert documented_names("optcore_treex") == public_names(optcore_treex)


@pytest.mark.parametrize("module", modules_of(optcore_treex), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
  failures = failures_in(module, optcore_treex)
  assert failures == 0, f"{failures} docstring example(s) failed in {module.__name__}"
