"""The README's and the pages' Flax blocks and optcore_flax's docstring examples run, and the
API reference has an entry for every public name of optcore_flax."""

from __future__ import annotations

import pytest
from doc_blocks import block_id, blocks_for, documented_names, public_names, run_block
from doctests import failures_in, missing_sections, modules_of

import optcore_flax


def test_the_readme_and_the_pages_have_flax_examples():
  assert {b.page for b in blocks_for("flax")} >= {
    "docs/getting_started.md",
    "docs/migration/flax_optim.md",
  }


@pytest.mark.parametrize("block", blocks_for("flax"), ids=block_id)
def test_flax_block_runs(block):
  run_block(block)


def test_the_api_reference_lists_every_public_name_of_optcore_flax():
  assert documented_names("optcore_flax") == public_names(optcore_flax)


@pytest.mark.parametrize("module", modules_of(optcore_flax), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
  failures = failures_in(module, optcore_flax)
  assert failures == 0, f"{failures} docstring example(s) failed in {module.__name__}"


# The entry points a user calls, with whether each raises on bad input (issue 30).
ENTRY_POINTS = {
  "create_sharded": (optcore_flax.create_sharded, True),
  "optimizer_shardings": (optcore_flax.optimizer_shardings, True),
  "derive_logical_axes": (optcore_flax.derive_logical_axes, True),
  "param_logical_axes": (optcore_flax.param_logical_axes, False),
  "install_legacy_namespace": (optcore_flax.install_legacy_namespace, False),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_points_document_args_returns_raises_and_an_example(name):
  obj, raises = ENTRY_POINTS[name]
  assert missing_sections(obj, raises) == [], name
