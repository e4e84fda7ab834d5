"""Framework-agnostic paths built from `jax.tree_util` key paths.

A dict key, a NamedTuple field, an Equinox attribute and a treeo field all
print as ``name``; a sequence index prints as its number. A path is the
'/'-joined list of those names, with a leading slash as in Flax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

KeyEntry = Any


def key_name(key: KeyEntry) -> str:
  """The canonical name of one key-path entry."""
  if isinstance(key, jax.tree_util.DictKey):
    return str(key.key)
  if isinstance(key, jax.tree_util.GetAttrKey):
    return key.name
  if isinstance(key, jax.tree_util.SequenceKey):
    return str(key.idx)
  if isinstance(key, jax.tree_util.FlattenedIndexKey):
    return str(key.key)
  return str(key)


def path_str(keys: Sequence[KeyEntry], sep: str = "/") -> str:
  """``'/a/b/0'`` for the key path ``['a'].b[0]``; ``'/'`` for the root."""
  return sep + sep.join(key_name(k) for k in keys)


def children_with_keys(node: Any) -> tuple[list[tuple[KeyEntry, Any]], Any] | None:
  """Flattens one level of a pytree node.

  Returns ``(children, treedef)`` where ``children`` is a list of
  ``(key, child)`` and ``treedef.unflatten`` rebuilds the node from new
  children; returns None when ``node`` is a leaf.
  """
  is_child = lambda x: x is not node
  treedef = jax.tree_util.tree_structure(node, is_leaf=is_child)
  if treedef.num_nodes == 1 and treedef.num_leaves == 1:
    return None
  keyed, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=is_child)
  return [(path[0], child) for path, child in keyed], treedef
