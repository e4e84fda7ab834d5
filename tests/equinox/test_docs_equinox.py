"""The README's Equinox blocks run."""

from __future__ import annotations

import pytest
from readme_blocks import blocks_for, run_block

BLOCKS = blocks_for("optcore_equinox")


def test_readme_has_an_equinox_example():
  assert BLOCKS


@pytest.mark.parametrize("source", BLOCKS, ids=lambda s: s.splitlines()[0][:40])
def test_readme_equinox_block_runs(source):
  run_block(source)
