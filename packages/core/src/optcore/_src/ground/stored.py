"""State leaves stored in a format of their own (`low_bit_state`'s `QuantizedArray`: codes and
scales), declared once by the type that stores them.

Every module that walks a state reads what it must know of such a leaf here, never from the
type's module: the wrapper protocol keeps it as it is (its format is not the algorithm's
dtype), transplant and the read-outs see its values, placement never splits a block across
devices. A new format registers itself with `register` and every walk knows it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

PyTree = Any


@dataclasses.dataclass(frozen=True)
class StoredFormat:
  """What a stored leaf declares.

  Attributes:
    values: the leaf's values as a plain array (its shape and dtype).
    like: plain values stored in the leaf's format (``like(leaf, values)``).
    whole_rows: per array inside the leaf (its pytree children, in order), whether its last
      dimension runs within one block, which a device must hold whole.
  """

  values: Callable[[Any], jax.Array]
  like: Callable[[Any, jax.Array], Any]
  whole_rows: tuple[bool, ...]


_FORMATS: dict[type, StoredFormat] = {}


def register(cls: type, stored_format: StoredFormat) -> None:
  """Declares ``cls`` a stored leaf (its module does, where the type is defined)."""
  _FORMATS[cls] = stored_format


def is_stored(x: Any) -> bool:
  """Whether ``x`` is a stored leaf (an ``is_leaf`` for tree functions)."""
  return type(x) in _FORMATS


def values(tree: PyTree) -> PyTree:
  """``tree`` with each stored leaf replaced by its values."""
  return jax.tree.map(
    lambda x: _FORMATS[type(x)].values(x) if is_stored(x) else x, tree, is_leaf=is_stored
  )


def stored_like(new_values: PyTree, like: PyTree) -> PyTree:
  """``new_values`` (``like``'s structure, plain arrays where ``like`` has a stored leaf), each
  of those stored in ``like``'s format there."""
  leaves, treedef = jax.tree.flatten(like, is_leaf=is_stored)
  new = treedef.flatten_up_to(new_values)
  out = [
    _FORMATS[type(old)].like(old, n) if is_stored(old) else n
    for old, n in zip(leaves, new, strict=True)
  ]
  return treedef.unflatten(out)


def array_flags(state: PyTree) -> list[tuple[bool, bool]]:
  """For each array of ``state`` (``jax.tree.leaves`` order): ``(inside a stored leaf, its last
  dimension within one block)``."""
  flags = []
  for leaf in jax.tree.leaves(state, is_leaf=is_stored):
    if is_stored(leaf):
      flags.extend((True, whole) for whole in _FORMATS[type(leaf)].whole_rows)
    else:
      flags.append((False, False))
  return flags


__all__ = ["StoredFormat", "array_flags", "is_stored", "register", "stored_like", "values"]
