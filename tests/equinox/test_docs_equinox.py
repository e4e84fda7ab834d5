"""The README's and the pages' Equinox blocks run, and the API reference lists optcore_equinox."""

from __future__ import annotations

from doc_blocks import blocks_for
from package_docs import api_reference, page_blocks

import optcore_equinox


def test_the_pages_have_equinox_examples():
  assert blocks_for("equinox")


test_equinox_block_runs = page_blocks("equinox")
test_the_api_reference_lists_every_public_name_of_optcore_equinox = api_reference(optcore_equinox)
