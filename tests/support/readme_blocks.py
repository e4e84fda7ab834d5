"""The README's Python blocks, by the adapter they import, and how to run one."""

from __future__ import annotations

import re
from pathlib import Path

import jax

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
ADAPTERS = ("optcore_flax", "optcore_equinox", "optcore_treex")


def blocks_for(adapter: str | None) -> list[str]:
  """The blocks that import ``adapter`` (None: the blocks that import no adapter)."""
  uses = lambda block, name: re.search(rf"^\s*(import|from)\s+{name}\b", block, re.M)
  if adapter is None:
    return [b for b in BLOCKS if not any(uses(b, a) for a in ADAPTERS)]
  return [b for b in BLOCKS if uses(b, adapter)]


def run_block(source: str) -> None:
  # Under JAX's defaults, as a reader runs it (the suite raises on rank promotion).
  with jax.numpy_rank_promotion("allow"):
    exec(compile(source, str(README), "exec"), {})
