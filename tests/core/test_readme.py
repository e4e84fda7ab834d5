"""Every Python block in the README runs."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_python_examples():
  assert BLOCKS


@pytest.mark.parametrize("source", BLOCKS, ids=lambda s: s.splitlines()[0][:40])
def test_readme_block_runs(source):
  # Under JAX's defaults, as a reader runs it (the suite raises on rank promotion).
  with jax.numpy_rank_promotion("allow"):
    exec(compile(source, str(README), "exec"), {})
