"""The README's Flax blocks and optcore_flax's docstring examples run."""

from __future__ import annotations

import pytest
from doctests import failures_in, modules_of
from readme_blocks import blocks_for, run_block

import optcore_flax


def test_readme_has_a_flax_example():
  assert blocks_for("optcore_flax")


@pytest.mark.parametrize("source", blocks_for("optcore_flax"), ids=lambda s: s.splitlines()[0][:40])
def test_readme_flax_block_runs(source):
  run_block(source)


@pytest.mark.parametrize("module", modules_of(optcore_flax), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
  failures = failures_in(module, optcore_flax)
  assert failures == 0, f"{failures} docstring example(s) failed in {module.__name__}"
