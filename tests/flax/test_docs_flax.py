"""The README's and the pages' Flax blocks and optcore_flax's docstring examples run, and the
API reference has an entry for every public name of optcore_flax."""

from __future__ import annotations

from doc_blocks import blocks_for
from package_docs import api_reference, docstring_examples, entry_point_sections, page_blocks

import optcore_flax


def test_the_readme_and_the_pages_have_flax_examples():
  assert {b.page for b in blocks_for("flax")} >= {
    "docs/getting_started.md",
    "docs/migration/flax_optim.md",
  }


test_flax_block_runs = page_blocks("flax")
test_the_api_reference_lists_every_public_name_of_optcore_flax = api_reference(optcore_flax)


test_docstring_examples_run = docstring_examples(optcore_flax)


# The entry points a user calls, with whether each raises on bad input (issue 30).
test_entry_points_document_args_returns_raises_and_an_example = entry_point_sections(
  optcore_flax,
  raises="""
  create_sharded optimizer_shardings derive_logical_axes
  """,
  quiet="""
  param_logical_axes install_legacy_namespace
  """,
)
