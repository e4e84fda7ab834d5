"""The Flax pages' blocks that need 8 devices run (docs/concepts/nnx.md: each of Flax's
issues reproduced, with what the NNX face does)."""

from __future__ import annotations

from doc_blocks import blocks_for
from package_docs import page_blocks


def test_the_nnx_page_has_mesh_examples():
  assert {b.page for b in blocks_for("flax-mesh")} == {"docs/concepts/nnx.md"}


test_flax_mesh_block_runs = page_blocks("flax-mesh")
