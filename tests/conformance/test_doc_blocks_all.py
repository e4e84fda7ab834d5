"""The documentation's blocks that use more than one framework (or orbax) run here, where
every package is installed."""

from __future__ import annotations

import pytest
from doc_blocks import block_id, blocks_for, run_block

BLOCKS = blocks_for("all")


@pytest.mark.parametrize("block", BLOCKS, ids=block_id)
def test_block_runs(block):
  run_block(block)
