"""treeo 0.2.2 on modern JAX, for treeo only.

treeo calls ``jax.tree_map``, ``jax.tree_unflatten`` and friends, which JAX
removed (0.6). Rather than adding them back to the ``jax`` module for every
library in the process, treeo's own modules get a stand-in for ``jax`` that
has them and passes everything else through to the real module.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import jax

# The removed top-level aliases and their jax.tree equivalents.
_REMOVED = {
  "tree_map": jax.tree.map,
  "tree_leaves": jax.tree.leaves,
  "tree_flatten": jax.tree.flatten,
  "tree_unflatten": jax.tree.unflatten,
  "tree_structure": jax.tree.structure,
  "tree_transpose": jax.tree.transpose,
}
_TREEO_MODULES = ("treeo.api", "treeo.tree", "treeo.utils", "treeo.mixins", "treeo.types")


class _JaxForTreeo(types.ModuleType):
  """``jax`` as treeo expects it: the real module plus the removed aliases."""

  def __init__(self):
    super().__init__("jax")
    self.__dict__.update({k: v for k, v in _REMOVED.items() if not hasattr(jax, k)})

  def __getattr__(self, name: str) -> Any:
    return getattr(jax, name)


def install() -> None:
  """Points treeo's modules at the stand-in (idempotent; jax itself is untouched)."""
  stand_in = _JaxForTreeo()
  for name in _TREEO_MODULES:
    module = importlib.import_module(name)
    if getattr(module, "jax", None) is jax:
      setattr(module, "jax", stand_in)  # noqa: B010  (a module attribute treeo reads)
