"""Framework-agnostic paths built from `jax.tree_util` key paths.

A dict key, a NamedTuple field, an Equinox attribute and a treeo field all
print as ``name``; a sequence index prints as its number. A path is the
'/'-joined list of those names, with a leading slash as in Flax.

Framework-internal levels are not part of a path: a node type registered with
`register_hidden_level` (an nnx Variable's ``.value``, a treeo Tree's
flattened-index level) passes its single child through without a name. The
adapters register their framework's types; the core imports none.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import jax

KeyEntry = Any
F = TypeVar("F", bound=Callable[..., Any])
# Frames a walk may use: Python's default (1000) stops at trees a few hundred levels deep,
# which jax's own (C++) tree functions and optax handle.
_DEEP_TREES = 50_000


def allows_deep_trees(fn: F) -> F:
  """Runs ``fn`` (a recursive walk over a pytree) with room for deep trees."""

  @functools.wraps(fn)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    limit = sys.getrecursionlimit()
    if limit >= _DEEP_TREES:
      return fn(*args, **kwargs)
    sys.setrecursionlimit(_DEEP_TREES)
    try:
      return fn(*args, **kwargs)
    finally:
      sys.setrecursionlimit(limit)

  return wrapper  # type: ignore[return-value]


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


def some_paths(paths: Sequence[str], limit: int = 6) -> str:
  """The first ``limit`` of ``paths`` for a message, quoted, with '...' when there are more
  (a selector that matches nothing is answered with the paths that exist)."""
  shown = ", ".join(repr(path) for path in paths[:limit])
  return shown + (f", ... ({len(paths)} in all)" if len(paths) > limit else "")


def state_path_search(pattern: str, keys: Sequence[KeyEntry]) -> bool:
  """Whether ``pattern`` (a regex of `low_bit_state`'s ``states=`` or of ``state_memory_kind``)
  finds the state leaf at ``keys``: searched in its path as written (``param_states/inner/0/nu/w``)
  and in the algorithm's own spelling, without the ``param_states`` level and a wrapper's
  ``inner`` levels (``0/nu/w``: adam's second moment of ``w`` under any wrapper), so one pattern
  means one leaf to both options."""
  written = path_str(keys)[1:]
  return re.search(pattern, written) is not None or re.search(pattern, own_path(keys)) is not None


def own_path(keys: Sequence[KeyEntry]) -> str:
  """A state path in the algorithm's own spelling: without the leading ``param_states`` level
  and a wrapper's ``inner`` levels (``'0/nu/w'`` for ``param_states/inner/0/nu/w``)."""
  parts = [key_name(k) for k in keys]
  if parts[:1] == ["param_states"]:
    parts = parts[1:]
  return "/".join(p for p in parts if p != "inner")


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


_HIDDEN_LEVELS: tuple[type, ...] = ()


def register_hidden_level(node_type: type) -> None:
  """Leaves the key level of ``node_type`` (and subclasses) out of every path.

  For wrapper nodes with exactly one child, such as ``flax.nnx.Variable``
  (whose child is ``.value``): with it registered, a Param at
  ``{'kernel': Param(...)}`` has the path ``'/kernel'``, as a plain array
  would, and state dicts carry no ``value`` level.

  Args:
    node_type: a pytree node type with exactly one child (nnx.Variable, a
      treeo Tree's index level).

  Returns:
    None; paths, selectors and state dicts skip that level from now on.

  Raises:
    TypeError: ``node_type`` is not a class.

  Example:
    >>> import dataclasses, jax, jax.numpy as jnp
    >>> import optcore
    >>> @jax.tree_util.register_dataclass
    ... @dataclasses.dataclass
    ... class Boxed:
    ...   value: jax.Array
    >>> optcore.to_state_dict({'w': Boxed(jnp.zeros(()))})
    {'w': {'value': Array(0., dtype=float32)}}
    >>> optcore.register_hidden_level(Boxed)
    >>> optcore.to_state_dict({'w': Boxed(jnp.zeros(()))})
    {'w': Array(0., dtype=float32)}
  """
  global _HIDDEN_LEVELS
  if not isinstance(node_type, type):
    raise TypeError(f"register_hidden_level takes a type, got {node_type!r}")
  if node_type not in _HIDDEN_LEVELS:
    _HIDDEN_LEVELS = (*_HIDDEN_LEVELS, node_type)


def hidden_child(node: Any) -> tuple[Any, Any] | None:
  """``(child, treedef)`` for a node of a hidden type, else None."""
  if not _HIDDEN_LEVELS or not isinstance(node, _HIDDEN_LEVELS):
    return None
  split = children_with_keys(node)
  if split is None:
    return None
  children, treedef = split
  if len(children) != 1:
    raise TypeError(
      f"{type(node).__name__} is registered as a hidden path level but has {len(children)} "
      "children; only single-child wrapper nodes can be hidden."
    )
  return children[0][1], treedef


def is_box(node: Any) -> bool:
  """A registered single-array wrapper (an nnx Variable around an array)."""
  hidden = hidden_child(node)
  return hidden is not None and children_with_keys(hidden[0]) is None


def unboxed(node: Any) -> Any:
  """The array a registered single-array wrapper holds; any other node as it is."""
  hidden = hidden_child(node) if is_box(node) else None
  return node if hidden is None else hidden[0]


def box_as(box: Any, value: Any) -> Any:
  """``value`` in a wrapper of ``box``'s type and metadata (an nnx Param's sharding)."""
  hidden = hidden_child(box)
  if hidden is None:
    raise TypeError(f"{type(box).__name__} is not a registered wrapper of one array")
  return hidden[1].unflatten([value])


def rebox_like(tree: Any, reference: Any) -> Any:
  """``tree`` (arrays) with each leaf boxed where ``reference`` (the same structure, boxed) has a
  box: the inverse of `unbox` for a state that came in boxed."""
  if not _HIDDEN_LEVELS:
    return tree
  boxes = jax.tree.leaves(reference, is_leaf=is_box)
  leaves, treedef = jax.tree.flatten(tree)
  if len(boxes) != len(leaves) or not any(map(is_box, boxes)):
    return tree
  pairs = zip(boxes, leaves, strict=True)
  return treedef.unflatten([box_as(b, x) if is_box(b) else x for b, x in pairs])


def instances_in(tree: Any, cls: type | tuple[type, ...]) -> list[Any]:
  """Every ``cls`` node of ``tree``, however deep (a wrapper's or optax's state NamedTuple, in
  any group or chain), in flatten order; none inside another found one."""
  found = lambda x: isinstance(x, cls)
  return [x for x in jax.tree.leaves(tree, is_leaf=found) if found(x)]


def instances_with_paths(tree: Any, cls: type | tuple[type, ...]) -> list[tuple[str, Any]]:
  """`instances_in` with where each sits, in the algorithm's own spelling (no ``param_states``
  level, no wrapper's ``inner`` levels): ``'0'`` for a `MultiOptimizer`'s first group. An
  instance inside another is found too, after it (``with_statistics(zclip(...))`` keeps a
  zclip state inside its own)."""
  found = lambda x: isinstance(x, cls)
  out: list[tuple[str, Any]] = []

  def walk(node: Any, above: tuple) -> None:
    keyed, _ = jax.tree_util.tree_flatten_with_path(
      node, is_leaf=lambda x: x is not node and found(x)
    )
    for keys, sub in keyed:
      if sub is not node and found(sub):
        out.append((own_path(above + tuple(keys)), sub))
        walk(sub, above + tuple(keys))

  if found(tree):
    out.append(("", tree))
  walk(tree, ())
  return out


def unbox(tree: Any) -> Any:
  """``tree`` with every registered single-array wrapper (an nnx Variable)
  replaced by its array; wrappers of whole subtrees (a treeo Tree) stay.

  Optimizer states hold arrays: a framework that hands ``init`` its boxed
  parameters (``nnx.Optimizer``) and ``update`` plain arrays gets one layout.
  """
  if not _HIDDEN_LEVELS:
    return tree
  return jax.tree.map(unboxed, tree, is_leaf=is_box)


def _is_unread_nnx_variable(node: Any) -> bool:
  """A flax.nnx Variable that no adapter taught optcore to read (by name: the core imports no
  framework)."""
  kind = type(node)
  return (
    kind.__module__.startswith("flax.nnx")
    and any(base.__name__ == "Variable" for base in kind.__mro__)
    and not (_HIDDEN_LEVELS and isinstance(node, _HIDDEN_LEVELS))
  )


def read_nnx_variables(tree: Any) -> Any:
  """``tree`` with each flax.nnx Variable (an ``OptState`` of Flax's own ``nnx.Optimizer``, a
  Param) replaced by the array it holds, whether or not optcore_flax was imported: a read-out
  of a state needs the arrays, not the boxes (by the Variable's type name: the core imports no
  framework). A Variable holding a whole subtree is left as it is."""

  def read(node: Any) -> Any:
    if not (_is_unread_nnx_variable(node) or is_box(node)):
      return node
    leaves = jax.tree.leaves(node)
    return leaves[0] if len(leaves) == 1 else node

  is_variable = lambda node: _is_unread_nnx_variable(node) or is_box(node)
  return jax.tree.map(read, tree, is_leaf=is_variable)


def refuse_unread_nnx_variables(tree: Any) -> None:
  """Raises a TypeError naming the first flax.nnx Variable in ``tree`` when optcore_flax was
  never imported: without it every path ends in the Variable's ``value`` level, so a selector
  such as ``'kernel$'`` matches nothing and the groups' state comes out empty (issue 41 met
  ``TypeError: unsupported operand type(s) for *: 'float' and 'NoneType'`` inside optax)."""
  keyed = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_unread_nnx_variable)[0]
  for keys, node in keyed:
    if _is_unread_nnx_variable(node):
      raise TypeError(
        f"the parameters hold flax.nnx Variables ({type(node).__name__} at "
        f"'{path_str(keys)}'), which optcore reads only once optcore_flax is imported: add "
        "`import optcore_flax` to the program (pip install optcore-flax), before the optimizer "
        "is initialised, so paths read '/kernel', not '/kernel/value'."
      )


@allows_deep_trees
def leaves_with_names(
  tree: Any, *, keep_none: bool = False
) -> tuple[list[tuple[tuple[str, ...], Any]], Any]:
  """``([(names, leaf), ...], treedef)`` in flatten order, hidden levels left out.

  With ``keep_none``, None entries are listed as leaves too (jax's flatten
  drops them as empty subtrees); the treedef is then None's leaf treedef.
  """
  is_leaf = (lambda x: x is None) if keep_none else None
  keyed, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  if not _HIDDEN_LEVELS:
    return [(tuple(map(key_name, keys)), leaf) for keys, leaf in keyed], treedef
  out: list[tuple[tuple[str, ...], Any]] = []
  _walk(tree, (), out, keep_none)
  return out, treedef


def _walk(node: Any, names: tuple[str, ...], out: list, keep_none: bool) -> None:
  if node is None:
    if keep_none:
      out.append((names, None))
    return
  hidden = hidden_child(node)
  if hidden is not None:
    _walk(hidden[0], names, out, keep_none)
    return
  split = children_with_keys(node)
  if split is None:
    out.append((names, node))
    return
  for key, child in split[0]:
    if child is not None or keep_none:  # None is an empty subtree, as in jax's flatten
      _walk(child, (*names, key_name(key)), out, keep_none)


@allows_deep_trees
def conform(reference: Any, tree: Any) -> Any:
  """``tree`` with each mapping rebuilt as the mapping ``reference`` has at that
  position, where the two differ only in their mapping type (a dict and a Flax
  FrozenDict with the same keys); everything else is left as it is, for the
  structure checks to report.

  Real programs mix the two (Flax's ``freeze`` and ``get_axis_names`` give
  FrozenDicts, user code plain dicts), and flax.optim and T5X took either:
  gradients, axes, masks and states meet the parameters in the parameters'
  own container type. ``tree`` may be a prefix of ``reference`` (a mask, axes
  with a None per subtree). Costs one structure comparison when the two match.
  """
  if tree is reference or reference is None or tree is None:
    return tree
  if jax.tree.structure(reference) == jax.tree.structure(tree):
    return tree
  return _conform(reference, tree)


def _conform(reference: Any, tree: Any) -> Any:
  if reference is None or tree is None:
    return tree
  split = children_with_keys(reference)
  if split is None:
    return tree
  children, treedef = split
  if isinstance(reference, Mapping) and isinstance(tree, Mapping):
    keys = [getattr(key, "key", None) for key, _ in children]
    if type(reference) is type(tree) or set(keys) != set(tree) or len(keys) != len(tree):
      return _conform_same_type(children, tree)
    return treedef.unflatten(
      [_conform(child, tree[k]) for k, (_, child) in zip(keys, children, strict=True)]
    )
  if type(reference) is type(tree):
    return _conform_same_type(children, tree)
  return tree


def _conform_same_type(reference_children: list, tree: Any) -> Any:
  """``tree``'s own node, its children conformed to the reference's children."""
  split = children_with_keys(tree)
  if split is None or len(split[0]) != len(reference_children):
    return tree
  children, treedef = split
  if [str(k) for k, _ in children] != [str(k) for k, _ in reference_children]:
    return tree
  return treedef.unflatten(
    [
      _conform(ref, child)
      for (_, ref), (_, child) in zip(reference_children, children, strict=True)
    ]
  )
