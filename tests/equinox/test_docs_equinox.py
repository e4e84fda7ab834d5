"""The README's and the pages' Equinox blocks run, and the API reference lists optcore_equinox."""

from __future__ import annotations

import pytest
from doc_blocks import block_id, blocks_for, documented_names, public_names, run_block

import optcore_equinox


def test_the_pages_have_equinox_examples():
  assert blocks_for("equinox")


@pytest.mark.parametrize("block", blocks_for("equinox"), ids=block_id)
def test_equinox_block_runs(block):
  run_block(block)


def test_the_api_reference_lists_every_public_name_of_optcore_equinox():
  assert documented_names("optcore_equinox") == public_names(optcore_equinox)
