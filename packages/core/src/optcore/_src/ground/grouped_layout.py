"""The grouped layout's data: where each parameter lives, and the grouped tree.

`GroupLayout` says which parameters share which flat buffer (static, made once
per parameter tree); `GroupedParams` is a parameter-shaped tree in that layout
(buffers, then the ungrouped leaves), and the pytree node every
parameter-shaped part of a grouped optimizer state is. `grouped.py` builds
the definition and the optimizer on them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Entry:
  """Where one parameter lives: in buffer ``buffer`` at ``offset``, or (``buffer``
  -1) per leaf, as leaf ``offset`` of the ungrouped leaves."""

  shape: tuple[int, ...]
  dtype: str
  buffer: int
  offset: int


@dataclasses.dataclass(frozen=True, eq=False)
class GroupLayout:
  """Which parameters share which buffer: static, hashable, made once per
  parameter tree by `Grouped.layout`.

  Attributes:
    treedef: the parameters' tree structure.
    entries: one `Entry` per parameter, in flattening order.
    buffers: ``(group, dtype, size)`` per buffer; a group is the index of the
      `MultiOptimizer` group that optimises the buffer's leaves (0 for a
      plain definition, -1 for frozen leaves).
    paths: each parameter's path, for errors and the logical axes.
  """

  treedef: Any
  entries: tuple[Entry, ...]
  buffers: tuple[tuple[int, str, int], ...]
  paths: tuple[str, ...]

  def _key(self) -> tuple:
    return (self.treedef, self.entries, self.buffers, self.paths)

  def __eq__(self, other: object) -> bool:
    # jit compares and hashes this (the static data of every grouped tree) on
    # every call: identity first, the hash computed once.
    if self is other:
      return True
    if not isinstance(other, GroupLayout):
      return NotImplemented
    return hash(self) == hash(other) and self._key() == other._key()

  def __hash__(self) -> int:
    cached = self.__dict__.get("_hash")
    if cached is None:
      cached = hash(self._key())
      object.__setattr__(self, "_hash", cached)
    return cached

  def shapes(self) -> PyTree:
    """The parameters' tree with a zero-memory array of each parameter's shape
    and dtype at every leaf (what the gradient checks compare against)."""
    cached = self.__dict__.get("_shapes")
    if cached is None:
      leaves = [np.broadcast_to(np.zeros((), e.dtype), e.shape) for e in self.entries]
      cached = self.treedef.unflatten(leaves)
      object.__setattr__(self, "_shapes", cached)
    return cached

  def pack(self, tree: PyTree) -> GroupedParams:
    """``tree`` (the parameters' structure) as a `GroupedParams`: concatenated
    per buffer, the other leaves as they are. A leaf may be any subtree
    whose leaves are parameter-shaped (one parameter's legacy state)."""
    leaves = self.treedef.flatten_up_to(tree)
    members: list[list[Any]] = [[] for _ in self.buffers]
    ungrouped = []
    for entry, leaf in zip(self.entries, leaves, strict=True):
      if entry.buffer < 0:
        ungrouped.append(leaf)
      else:
        members[entry.buffer].append(leaf)
    return GroupedParams(self, tuple(_concatenate(m) for m in members), tuple(ungrouped))


def _concatenate(subtrees: list[Any]) -> Any:
  """One buffer from the subtrees of its parameters (None stays None)."""
  if all(s is None for s in subtrees):
    return None

  def flat(*xs: Any) -> jax.Array:
    if len(xs) == 1:
      return jnp.reshape(xs[0], (-1,))
    return jnp.concatenate([jnp.reshape(x, (-1,)) for x in xs])

  return jax.tree.map(flat, *subtrees)


class GroupedParams:
  """A parameter-shaped tree in the grouped layout: flat buffers per (group,
  dtype) for the small leaves, every other leaf as it is.

  A pytree whose children are the buffers, then the ungrouped leaves; the
  `GroupLayout` is its static data. optax's states over it keep its type, so
  every parameter-shaped part of a grouped state is one of these and
  `unpack` gives the ungrouped layout back.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.grouped(optcore.sgd(0.1)).create({'a': jnp.ones(2), 'b': jnp.ones((2, 2))})
    >>> [b.shape for b in opt.packed_target.buffers]
    [(6,)]
    >>> opt.packed_target.unpack()['b'].shape
    (2, 2)
  """

  __slots__ = ("buffers", "layout", "ungrouped")

  def __init__(self, layout: GroupLayout, buffers: tuple[Any, ...], ungrouped: tuple[Any, ...]):
    self.layout = layout
    self.buffers = tuple(buffers)
    self.ungrouped = tuple(ungrouped)

  def unpack(self) -> PyTree:
    """The tree in the parameters' own structure (slices of the buffers).

    Differentiable: the gradient with respect to the buffers is the
    per-leaf gradients concatenated (one copy), not a sum of padded slices.
    """
    if not self.buffers:  # nothing grouped: the leaves as they are
      return self.layout.treedef.unflatten(list(self.ungrouped))
    if all(b is None or isinstance(b, jax.Array) for b in self.buffers):
      leaves = _cut(self.layout, self.buffers, self.ungrouped)
    else:  # buffers of per-parameter states (a legacy definition's), never differentiated
      leaves = _cut_leaves(self.layout, self.buffers, self.ungrouped)
    return self.layout.treedef.unflatten(leaves)

  def __repr__(self) -> str:
    shapes = [f"{dtype}[{size}] (group {group})" for group, dtype, size in self.layout.buffers]
    return f"GroupedParams(buffers={shapes}, ungrouped={len(self.ungrouped)} leaves)"


def _cut_leaves(layout: GroupLayout, buffers: tuple, ungrouped: tuple) -> list[Any]:
  leaves = []
  for entry in layout.entries:
    if entry.buffer < 0:
      leaves.append(ungrouped[entry.offset])
      continue
    size = math.prod(entry.shape)
    cut = lambda b, e=entry, n=size: jnp.reshape(
      jax.lax.slice_in_dim(b, e.offset, e.offset + n), e.shape
    )
    buffer = buffers[entry.buffer]
    leaves.append(None if buffer is None else jax.tree.map(cut, buffer))
  return leaves


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _cut(layout: GroupLayout, buffers: tuple, ungrouped: tuple) -> list[Any]:
  return _cut_leaves(layout, buffers, ungrouped)


def _cut_forward(layout, buffers, ungrouped):
  return _cut_leaves(layout, buffers, ungrouped), None


def _cut_backward(layout, _, cotangents):
  zeros = lambda e: jnp.zeros(e.shape, e.dtype)
  full = [zeros(e) if c is None else c for c, e in zip(cotangents, layout.entries, strict=True)]
  packed = layout.pack(layout.treedef.unflatten(full))
  return packed.buffers, packed.ungrouped


_cut.defvjp(_cut_forward, _cut_backward)


def _flatten_with_keys(g: GroupedParams):
  keys = [(jax.tree_util.GetAttrKey(f"buffers[{i}]"), b) for i, b in enumerate(g.buffers)] + [
    (jax.tree_util.GetAttrKey(f"ungrouped[{i}]"), leaf) for i, leaf in enumerate(g.ungrouped)
  ]
  return keys, g.layout


def _unflatten(layout: GroupLayout, children: Iterable[Any]) -> GroupedParams:
  children = tuple(children)
  n = len(layout.buffers)
  return GroupedParams(layout, tuple(children[:n]), tuple(children[n:]))


jax.tree_util.register_pytree_with_keys(
  GroupedParams,
  _flatten_with_keys,
  _unflatten,
  lambda g: ((*g.buffers, *g.ungrouped), g.layout),
)


def is_grouped(x: Any) -> bool:
  return isinstance(x, GroupedParams)


def unpack_tree(tree: PyTree) -> PyTree:
  """``tree`` with every `GroupedParams` in it unpacked (a grouped state in the
  ungrouped layout)."""
  return jax.tree.map(lambda x: x.unpack() if is_grouped(x) else x, tree, is_leaf=is_grouped)


def pack_like(template: PyTree, tree: PyTree) -> PyTree:
  """``tree``, in the ungrouped layout of ``template`` (a grouped tree), packed
  as ``template`` is: the inverse of `unpack_tree`."""
  items, treedef = jax.tree.flatten(template, is_leaf=is_grouped)
  leaves = iter(jax.tree.leaves(tree, is_leaf=lambda x: x is None))
  out = []
  for item in items:
    if not is_grouped(item):
      out.append(next(leaves))
      continue
    unpacked = jax.tree.structure(item.unpack(), is_leaf=lambda x: x is None)
    chunk = [next(leaves) for _ in range(unpacked.num_leaves)]
    out.append(item.layout.pack(unpacked.unflatten(chunk)))
  return treedef.unflatten(out)
