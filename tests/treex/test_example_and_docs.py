"""examples/treex_quickstart.py, the README's and the pages' treex blocks and the adapter's
docstring examples run as a user runs them."""

from __future__ import annotations

import pytest
from doc_blocks import block_id, blocks_for, documented_names, public_names, run_block
from doctests import failures_in, missing_sections, modules_of
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


# The entry points a user calls, with whether each raises on bad input (issue 30).
ENTRY_POINTS = {
  "Optimizer.init": (optcore_treex.Optimizer.init, True),
  "Optimizer.update": (optcore_treex.Optimizer.update, True),
  "Optimizer.state_dict": (optcore_treex.Optimizer.state_dict, True),
  "Optimizer.restore_state": (optcore_treex.Optimizer.restore_state, True),
  "Optimizer.transplant": (optcore_treex.Optimizer.transplant, True),
  "Optimizer.shardings": (optcore_treex.Optimizer.shardings, True),
  "Optimizer.shard": (optcore_treex.Optimizer.shard, True),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_points_document_args_returns_raises_and_an_example(name):
  obj, raises = ENTRY_POINTS[name]
  assert missing_sections(obj, raises) == [], name
