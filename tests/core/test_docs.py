"""Every Python block in the README that needs no adapter runs (the adapters'
blocks run in their own test folders)."""

from __future__ import annotations

import pytest
from readme_blocks import blocks_for, run_block

CORE_BLOCKS = blocks_for(None)


def test_readme_has_python_examples():
  assert CORE_BLOCKS


@pytest.mark.parametrize("source", CORE_BLOCKS, ids=lambda s: s.splitlines()[0][:40])
def test_readme_block_runs(source):
  run_block(source)
