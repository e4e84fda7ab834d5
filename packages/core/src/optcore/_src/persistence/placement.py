"""Where the optimizer state lives between steps: device memory or host memory.

``state_memory_kind="pinned_host"`` (on `OptimizerDef.create_sharded`,
`derive_shardings` and every face's shard method) puts every non-scalar
state leaf in pinned host memory: its sharding's ``memory_kind``. Each step
(`apply_step`, which every face calls) brings those leaves to the device,
computes, and puts the new ones back, inside the user's ``jit``; the
parameters and the scalar counters stay on the device. The numbers are the
on-device step's: only the copies differ.

A leaf's place is read from the array itself (its abstract value's memory
space under ``jit``), so nothing else carries it: a state restored, donated
or passed through another face stays where it was put.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from jax.core import Tracer
from jax.sharding import Mesh, NamedSharding

from optcore._src.ground import paths
from optcore._src.ground.checks import check_regex
from optcore._src.ground.user_warnings import warn

PyTree = Any

#: The memory kinds a step can keep state in: JAX traces ``unpinned_host``
#: arrays as device memory, so a jitted step cannot tell it apart.
SUPPORTED = ("device", "pinned_host")


def check_memory_kind(mesh: Mesh, memory_kind: str) -> None:
  """Raises ValueError unless every device of ``mesh`` has ``memory_kind`` and a
  step can keep state there, listing the kinds the devices have."""
  device = mesh.devices.flat[0]
  kinds = sorted({m.kind for d in mesh.devices.flat for m in d.addressable_memories()})
  if memory_kind not in kinds:
    raise ValueError(
      f"state_memory_kind={memory_kind!r}: the mesh's devices ({device.platform}) have the "
      f"memory kinds {kinds}, not {memory_kind!r}. Pass one of them, e.g. "
      "state_memory_kind='pinned_host' to keep the optimizer state in host memory."
    )
  if memory_kind not in SUPPORTED:
    raise ValueError(
      f"state_memory_kind={memory_kind!r} is not supported: inside jit, JAX gives "
      f"{memory_kind!r} arrays the device's memory space, so a step could not put the state "
      f"back there. Use one of {list(SUPPORTED)} ('pinned_host' for host memory)."
    )


def memory_kind_rules(memory_kind: Any) -> tuple[tuple[str, str], ...] | str | None:
  """``state_memory_kind`` as `Placement` keeps it: a kind for every leaf (a string), or
  ``(pattern, kind)`` pairs (from a mapping), each pattern a regular expression; TypeError or
  ValueError naming what is wrong."""
  if memory_kind is None or isinstance(memory_kind, str):
    return memory_kind
  pairs = memory_kind.items() if isinstance(memory_kind, Mapping) else memory_kind
  try:
    pairs = tuple((pattern, kind) for pattern, kind in pairs)
  except (TypeError, ValueError):
    pairs = None
  if not pairs or not all(isinstance(p, str) and isinstance(k, str) for p, k in pairs):
    raise TypeError(
      "state_memory_kind: a memory kind for the whole state ('pinned_host'), or a mapping "
      "from a regular expression searched in each state leaf's path to the kind of the leaves "
      f"it finds ({{'/nu/': 'pinned_host'}}); got {memory_kind!r}"
    )
  for pattern, _ in pairs:
    check_regex(pattern, f"state_memory_kind: {pattern!r}")
  return pairs


def with_memory_kind(state: PyTree, shardings: PyTree, mesh: Mesh, memory_kind: Any) -> PyTree:
  """``shardings`` with the non-scalar state leaves placed in ``memory_kind``: every one for a
  kind, or for ``(pattern, kind)`` pairs each leaf whose path (``param_states/0/nu/w``) a
  pattern finds, in the first such pattern's kind (the others stay where they are). Scalars
  (step counters) stay on the device, where every step reads them."""
  given = memory_kind_rules(memory_kind)
  rules = ((".*", given),) if isinstance(given, str) else (given or ())
  for _, kind in rules:
    check_memory_kind(mesh, kind)
  keyed, treedef = jax.tree_util.tree_flatten_with_path(state)

  def kind_of(keys: tuple) -> str | None:  # read as low_bit_state's states= reads a path
    return next((kind for pattern, kind in rules if paths.state_path_search(pattern, keys)), None)

  placed = []
  for (keys, leaf), named in zip(keyed, treedef.flatten_up_to(shardings), strict=True):
    kind = kind_of(keys) if jax.numpy.ndim(leaf) else None
    placed.append(named if kind is None else named.with_memory_kind(kind))
  _warn_unmatched(rules, [keys for keys, leaf in keyed if jax.numpy.ndim(leaf)])
  return treedef.unflatten(placed)


def _warn_unmatched(rules: Any, placeable: list[tuple]) -> None:
  """Warns for each ``(pattern, kind)`` of ``state_memory_kind`` that finds no state leaf
  (scalars stay on the device): such a pattern places nothing and would say nothing."""
  for pattern, kind in rules:
    if not any(paths.state_path_search(pattern, keys) for keys in placeable):
      written = [paths.path_str(keys)[1:] for keys in placeable]
      shown = paths.some_paths(written) or "(none: scalars stay on the device)"
      warn(
        f"state_memory_kind: the pattern {pattern!r} (-> {kind!r}) matches no state leaf, so "
        f"it places nothing; the state's paths are {shown}. "
        "To fix: give a pattern one of them matches."
      )


def _on_host(x: Any) -> bool:
  if not isinstance(x, jax.Array):
    return False
  return getattr(jax.typeof(x), "memory_space", None) == jax.memory.Space.Host


def to_device(state: PyTree) -> tuple[PyTree, tuple[bool, ...] | None]:
  """``state`` with every leaf kept in host memory brought to the device, and
  which leaves were (None when none was: nothing to put back)."""
  leaves, treedef = jax.tree.flatten(state)
  on_host = tuple(_on_host(x) for x in leaves)
  if not any(on_host):
    return state, None
  moved = [
    jax.device_put(x, jax.memory.Space.Device) if h else x
    for x, h in zip(leaves, on_host, strict=True)
  ]
  return treedef.unflatten(moved), on_host


def to_host(state: PyTree, on_host: tuple[bool, ...] | None) -> PyTree:
  """The new ``state`` with the leaves `to_device` brought over put back in host memory."""
  if on_host is None:
    return state
  leaves, treedef = jax.tree.flatten(state)
  if len(leaves) != len(on_host):  # a step that changed the state's structure: leave it be
    return state
  back = [
    jax.device_put(x, jax.memory.Space.Host) if h else x
    for x, h in zip(leaves, on_host, strict=True)
  ]
  return treedef.unflatten(back)


def placed_like(value: Any, reference: Any, *, placed_only: bool = False) -> Any:
  """``value`` where ``reference`` lives (its sharding and memory kind), as it is under a trace
  or where ``reference`` is no array. ``placed_only``: only where ``reference`` was placed on
  purpose (a `NamedSharding`, as `create_sharded` gives, or host memory); a plain array on the
  default device leaves ``value`` as it is (a flax.optim restore gives NumPy arrays back)."""
  if not isinstance(reference, jax.Array) or isinstance(reference, Tracer):
    return value
  if isinstance(value, Tracer):
    return value
  sharding = reference.sharding
  if placed_only and not (
    isinstance(sharding, NamedSharding) or getattr(sharding, "memory_kind", None) == "pinned_host"
  ):
    return value
  return jax.device_put(value, sharding)


def keep_placement(tree: PyTree, reference: PyTree, *, placed_only: bool = True) -> PyTree:
  """``tree`` (a restored target or state) placed leaf by leaf where ``reference`` (the
  optimizer's own) was placed: a restore into a ZeRO-1 or host-memory optimizer keeps its
  layout, as a transplant does. ``placed_only=False``: every leaf whose reference is a JAX
  array becomes one where it lives (a checkpoint's NumPy arrays included)."""
  treedef = jax.tree.structure(reference)
  pairs = zip(treedef.flatten_up_to(tree), jax.tree.leaves(reference), strict=True)
  return treedef.unflatten([placed_like(v, r, placed_only=placed_only) for v, r in pairs])
