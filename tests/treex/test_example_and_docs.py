"""examples/treex_quickstart.py, the README's treex blocks and the adapter's
docstring examples run as a user runs them."""

from __future__ import annotations

import pytest
from doctests import failures_in, modules_of
from example_runner import run_example
from readme_blocks import blocks_for, run_block

import optcore_treex


def test_treex_quickstart_learns_the_map():
  stdout = run_example("treex_quickstart.py")
  assert "w = [1.0, -2.0, 0.5, 3.0], b = 0.70" in stdout
  assert "examples seen: 38400; optimizer steps: 300" in stdout


def test_readme_has_a_treex_example():
  assert blocks_for("optcore_treex")


@pytest.mark.parametrize(
  "source", blocks_for("optcore_treex"), ids=lambda s: s.splitlines()[0][:40]
)
def test_readme_treex_block_runs(source):
  run_block(source)


@pytest.mark.parametrize("module", modules_of(optcore_treex), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
  failures = failures_in(module, optcore_treex)
  assert failures == 0, f"{failures} docstring example(s) failed in {module.__name__}"
