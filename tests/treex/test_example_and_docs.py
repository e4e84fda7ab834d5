"""examples/treex_quickstart.py, the README's and the pages' treex blocks and the adapter's
docstring examples run as a user runs them."""

from __future__ import annotations

from doc_blocks import blocks_for
from example_runner import run_example
from package_docs import api_reference, docstring_examples, entry_point_sections, page_blocks

import optcore_treex


def test_treex_quickstart_learns_the_map():
  stdout = run_example("treex_quickstart.py")
  assert "w = [1.0, -2.0, 0.5, 3.0], b = 0.70" in stdout
  assert "examples seen: 38400; optimizer steps: 300" in stdout


def test_the_pages_have_treex_examples():
  assert blocks_for("treex")


test_treex_block_runs = page_blocks("treex")
test_the_api_reference_lists_every_public_name_of_optcore_treex = api_reference(optcore_treex)


test_docstring_examples_run = docstring_examples(optcore_treex)


# The entry points a user calls, with whether each raises on bad input (issue 30).
test_entry_points_document_args_returns_raises_and_an_example = entry_point_sections(
  optcore_treex,
  raises="""
  Optimizer.init Optimizer.update Optimizer.state_dict Optimizer.restore_state
  Optimizer.transplant Optimizer.shardings Optimizer.shard
  """,
  quiet="""

  """,
)
