"""The logical axes and shardings of an optimizer's state, from the parameters' axes.

The functions behind `OptimizerDef.derive_logical_axes`, `derive_shardings`
and `create_sharded`, and behind every adapter's shardings. What a definition
knows about its own state (which leaves are parameter-shaped, which factored)
stays in its ``derive_param_states_axes`` hook; everything else is here.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypedDict, TypeVar, Unpack

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from optcore._src.axes import partition_rules, sharding
from optcore._src.containers.optimizer import Optimizer
from optcore._src.ground import stored
from optcore._src.ground.state import OptimizerState
from optcore._src.persistence import placement as memory

PyTree = Any
LogicalAxisRules = Sequence[tuple[str, Any]]


def _rules(rules: Any) -> tuple[tuple[str, Any], ...]:
  """Flax-format ``(logical_name, mesh_axes)`` pairs as a tuple (a dict's items too); anything
  else is refused, naming the entry."""
  if isinstance(rules, Mapping):
    rules = rules.items()
  if isinstance(rules, (str, bytes)) or not isinstance(rules, Iterable):
    raise TypeError(
      f"logical_axis_rules must be (logical_name, mesh_axes) pairs, Flax's format, e.g. "
      f"[('embed', None), ('mlp', 'model')]; found {rules!r}"
    )
  out = []
  for i, rule in enumerate(rules):
    if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
      raise TypeError(
        f"logical_axis_rules[{i}] is {rule!r}: each rule is a (logical_name, mesh_axes) pair, "
        f"e.g. ('mlp', 'model') or ('embed', None)"
      )
    out.append((rule[0], tuple(rule[1]) if isinstance(rule[1], list) else rule[1]))
  return tuple(out)


class StatePlacement(TypedDict, total=False):
  """The keywords that say where an optimizer's state lives, beside the mesh and its rules:
  every face's sharding functions take them as ``**placement`` (see `Placement`)."""

  state_axis: str | None
  state_memory_kind: str | Mapping[str, str] | None


F = TypeVar("F")
P = ParamSpec("P")


def shard_method(
  shardings: Callable[Concatenate[F, P], F],
  place: Callable[[F, F], F],
  doc: str,
) -> Callable[Concatenate[F, P], F]:
  """A face's ``shard`` method: ``place(self, self.shardings(...))``, whatever ``shardings``
  takes.

  Written once for every face, so that a face's ``shard`` takes exactly the arguments of its
  ``shardings`` (type checkers read them through the `typing.ParamSpec`, ``inspect.signature``
  and the docs through ``__wrapped__``) and the two cannot drift apart.

  Args:
    shardings: the face's ``shardings`` method: the optimizer's own structure with a
      `NamedSharding` at each state array.
    place: how the face moves an optimizer onto such a tree (``jax.device_put``; not
      ``eqx.filter_shard``, a sharding constraint that Explicit mesh axes refuse).
    doc: the ``shard`` method's docstring.

  Returns:
    The ``shard`` method, to assign in the face's class body.

  Example:
    >>> import dataclasses, jax, jax.numpy as jnp
    >>> from optcore import adapter
    >>> @dataclasses.dataclass
    ... class Face:
    ...   state: jax.Array
    ...   def shardings(self, device: jax.Device) -> 'Face':
    ...     return Face(jax.sharding.SingleDeviceSharding(device))
    ...   shard = adapter.shard_method(shardings, jax.device_put, "Placed by `shardings`.")
    >>> jax.tree_util.register_dataclass(Face, data_fields=['state'], meta_fields=[])
    <class '...Face'>
    >>> Face(jnp.ones(2)).shard(jax.devices()[0]).state.devices() == {jax.devices()[0]}
    True
  """

  @functools.wraps(shardings)
  def shard(self: F, /, *args: P.args, **kwargs: P.kwargs) -> F:
    return place(self, shardings(self, *args, **kwargs))

  shard.__name__ = "shard"
  shard.__qualname__ = shardings.__qualname__.rpartition(".")[0] + ".shard"
  shard.__doc__ = doc
  return shard


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where an optimizer's state lives: one decision per leaf, made in one place.

  Each state leaf gets the logical axes its definition derives from the
  parameters' axes, mapped onto ``mesh`` by ``logical_axis_rules``; with
  ``state_axis`` (ZeRO-1) it is also split over that mesh axis, on its
  largest dimension the axis divides and no other axis splits, while the
  parameters keep their own sharding; with ``state_memory_kind``
  (``"pinned_host"``) every non-scalar leaf lives in that memory between
  steps (each step brings it to the device and back, inside ``jit``); with a
  mapping (``{"/nu/": "pinned_host"}``, as AXLearn's
  ``offload_optimizer(pattern=...)``) only the leaves whose path a pattern finds
  (``param_states/0/nu/dense/kernel``) do. Leaves ``state_axis`` cannot split
  stay replicated and are logged.

  Every face's sharding function takes one (as its ``mesh``), or the same
  fields as keywords: ``create_sharded(params, axes, Placement(mesh, rules,
  state_axis='data'))`` is ``create_sharded(params, axes, mesh, rules,
  state_axis='data')``.

  Attributes:
    mesh: the device mesh.
    logical_axis_rules: ``(logical_name, mesh_axes)`` pairs, Flax's format;
      None: the axes name mesh axes already.
    state_axis: a mesh axis to split every state leaf over (ZeRO-1).
    state_memory_kind: ``"pinned_host"`` to keep the state in host memory; or a
      mapping from regular expressions searched in each state leaf's path to
      the memory kind of the leaves each finds (the first that finds a leaf).

  Raises:
    TypeError: no mesh, or a placement keyword that does not exist (from `of`).
    ValueError: a ``state_axis`` the mesh lacks, or a memory kind its
      devices lack (``"unpinned_host"`` is refused: inside ``jit`` JAX cannot
      tell it from device memory).

  Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> import optcore
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ('data',))
    >>> where = optcore.Placement(mesh, state_axis='data')
    >>> opt = optcore.adam(1e-3).create_sharded({'w': jnp.zeros((4, 2))}, None, where)
    >>> opt.state.param_states[0].mu['w'].sharding.spec == P('data', None)
    True
  """

  mesh: Mesh
  logical_axis_rules: Any = None
  state_axis: str | None = None
  state_memory_kind: str | tuple[tuple[str, str], ...] | None = None

  def __post_init__(self) -> None:
    if self.mesh is None:
      raise TypeError(
        "a mesh is required: pass mesh=jax.sharding.Mesh(devices, axis_names) (with "
        "state_axis='data' alone, the parameters are replicated and the state is split)"
      )
    if not isinstance(self.mesh, Mesh):
      raise TypeError(f"mesh must be a jax.sharding.Mesh, found {type(self.mesh).__name__}")
    if self.logical_axis_rules is not None:  # hashable, so a placement can be a static argument
      object.__setattr__(self, "logical_axis_rules", _rules(self.logical_axis_rules))
    if self.state_axis is not None and self.state_axis not in self.mesh.axis_names:
      raise partition_rules.PartitionRuleError(
        f"state_axis={self.state_axis!r} is not an axis of the mesh, whose axes are "
        f"{list(self.mesh.axis_names)}. Name the data-parallel mesh axis, e.g. state_axis='data'."
      )
    if self.state_memory_kind is not None:  # hashable: a mapping is kept as its pairs
      object.__setattr__(
        self, "state_memory_kind", memory.memory_kind_rules(self.state_memory_kind)
      )
      kinds = self.state_memory_kind
      for kind in [kinds] if isinstance(kinds, str) else [k for _, k in kinds]:
        memory.check_memory_kind(self.mesh, kind)

  @classmethod
  def of(
    cls, mesh: Mesh | Placement | None, logical_axis_rules: Any = None, **state: Any
  ) -> Placement:
    """The placement a face's arguments name: ``mesh`` itself where it is a `Placement`
    (then nothing else may be given), else one made of the mesh, its rules and the
    `StatePlacement` keywords (any other keyword is refused, naming the valid ones)."""
    unknown = sorted(set(state) - set(StatePlacement.__annotations__))
    if unknown:
      raise TypeError(
        f"unknown placement keyword {', '.join(map(repr, unknown))}; the state's placement "
        f"keywords are {sorted(StatePlacement.__annotations__)} (see optcore.Placement)"
      )
    if isinstance(mesh, Placement):
      given = [k for k, v in state.items() if v is not None]
      if logical_axis_rules is not None or given:
        extra = given + (["logical_axis_rules"] if logical_axis_rules is not None else [])
        raise TypeError(
          f"mesh is a Placement, which holds the rules and the state's placement; {extra} "
          "given beside it as well. Put them in the Placement: "
          "optcore.Placement(mesh, rules, state_axis=..., state_memory_kind=...)."
        )
      return mesh
    return cls(mesh, logical_axis_rules, **state)  # pyright: ignore[reportArgumentType]  # None: no mesh, refused where one is needed

  def state_shardings(self, state: PyTree, state_axes: PyTree, *, report: bool = True) -> PyTree:
    """The `NamedSharding` of every leaf of ``state`` from its logical axes: mapped onto the
    mesh, split over ``state_axis``, in ``state_memory_kind``."""
    shardings = sharding.logical_to_mesh_sharding(state_axes, self.mesh, self.logical_axis_rules)
    shardings = _blocks_split_whole(state, shardings)
    if self.state_axis is not None:
      shardings = add_state_axis(state, shardings, self.mesh, self.state_axis, report=report)
    if self.state_memory_kind is not None:
      shardings = memory.with_memory_kind(state, shardings, self.mesh, self.state_memory_kind)
    return shardings

  def parameter_shardings(self, param_axes: PyTree) -> PyTree:
    """The parameters' `NamedSharding`s: their axes mapped onto the mesh (never split over
    ``state_axis``, never in host memory)."""
    return sharding.logical_to_mesh_sharding(param_axes, self.mesh, self.logical_axis_rules)


def state_logical_axes(
  optimizer_def: Any, state: OptimizerState, params: PyTree, param_axes: PyTree
) -> OptimizerState:
  """``state``'s structure with a `PartitionSpec` at every leaf (the step replicated).

  ``param_axes`` has one spec (or tuple of names, or None) per parameter;
  ``state`` and ``params`` may be abstract (``jax.eval_shape``).

  Args:
    optimizer_def: the definition ``state`` belongs to.
    state: its `OptimizerState` (or ``jax.eval_shape`` of it).
    params: the parameters (or their shapes).
    param_axes: one logical `PartitionSpec` per parameter.

  Returns:
    ``state``'s structure with a `PartitionSpec` at every leaf.

  Raises:
    optcore.PartitionRuleError: a state leaf no rule covers, or axes that do
      not fit a parameter (named by path).

  Example:
    >>> import jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import optcore
    >>> params = {'w': jnp.zeros((4, 2))}
    >>> opt_def = optcore.adam(1e-3)
    >>> axes = optcore.adapter.state_logical_axes(
    ...     opt_def, opt_def.init_state(params), params, {'w': P('embed', 'mlp')})
    >>> axes.param_states[0].nu == {'w': P('embed', 'mlp')}, axes.step == P()
    (True, True)
  """
  axes = partition_rules.normalize_param_axes(params, param_axes)
  return state_axes_of_full_rank(optimizer_def, state, params, axes)


def state_axes_of_full_rank(
  optimizer_def: Any, state: OptimizerState, params: PyTree, axes: PyTree
) -> OptimizerState:
  """`state_logical_axes` from axes already normalised (one full-rank spec per parameter)."""
  state_axes = optimizer_def.derive_param_states_axes(state.param_states, params, axes)
  return OptimizerState(PartitionSpec(), state_axes)  # pyright: ignore[reportArgumentType]  # axes in the state's structure


def state_shardings(
  optimizer_def: Any,
  state: OptimizerState,
  params: PyTree,
  param_axes: PyTree | None,
  mesh: Mesh | Placement | None,
  logical_axis_rules: LogicalAxisRules | None = None,
  **placement: Unpack[StatePlacement],
) -> OptimizerState:
  """``state``'s structure with a `NamedSharding` on ``mesh`` at every leaf: the
  axes of `state_logical_axes` placed as `Placement` says (mapped by
  ``logical_axis_rules``, split over ``state_axis``, in ``state_memory_kind``).
  ``param_axes`` None: the parameters are replicated.

  Args:
    optimizer_def: the definition ``state`` belongs to.
    state: its `OptimizerState` (or ``jax.eval_shape`` of it).
    params: the parameters (or their shapes).
    param_axes: one `PartitionSpec` per parameter; None: replicated.
    mesh: the device mesh, or a `Placement` holding it, the rules and the keywords.
    logical_axis_rules: ``(logical_name, mesh_axes)`` pairs.
    **placement: ``state_axis=`` (ZeRO-1) and ``state_memory_kind=`` (host memory), as in
      `Placement`.

  Returns:
    ``state``'s structure with a `NamedSharding` at every leaf.

  Raises:
    optcore.PartitionRuleError: a dimension the mesh does not divide (named by path).
    TypeError: no mesh, or an unknown placement keyword.

  Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> import optcore
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ('model',))
    >>> params = {'w': jnp.zeros((4, 2))}
    >>> opt_def = optcore.adam(1e-3)
    >>> shardings = optcore.adapter.state_shardings(
    ...     opt_def, opt_def.init_state(params), params, {'w': P('embed', 'mlp')}, mesh,
    ...     [('mlp', 'model')])
    >>> shardings.param_states[0].mu['w'].spec == P(None, 'model')
    True
  """
  where = Placement.of(mesh, logical_axis_rules, **placement)
  if param_axes is None:
    param_axes = jax.tree.map(lambda _: PartitionSpec(), params)
  axes = partition_rules.normalize_param_axes(params, param_axes)
  shardings = unchecked_state_shardings(optimizer_def, state, params, axes, where)
  sharding.check_divisible(state, shardings)  # named here, not in device_put's error
  return shardings


def unchecked_state_shardings(
  optimizer_def: Any, state: OptimizerState, params: PyTree, axes: PyTree, where: Placement
) -> OptimizerState:
  """The one pipeline behind `state_shardings` and `optimizer_shardings`: the
  state's logical axes, placed by ``where``."""
  return where.state_shardings(state, state_axes_of_full_rank(optimizer_def, state, params, axes))


def optimizer_logical_axes(
  optimizer_def: Any, optimizer: Optimizer, param_logical_axes: PyTree
) -> Optimizer:
  """`OptimizerDef.derive_logical_axes`: an Optimizer of specs, the target's padded to full rank."""
  axes = partition_rules.normalize_param_axes(optimizer.target, param_logical_axes)
  state = state_axes_of_full_rank(optimizer_def, optimizer.state, optimizer.target, axes)
  return Optimizer(getattr(optimizer, "optimizer_def", optimizer_def), state, axes)


def optimizer_shardings(
  optimizer_def: Any, optimizer: Optimizer, param_logical_axes: PyTree | None, where: Placement
) -> Optimizer:
  """`OptimizerDef.derive_shardings`: an Optimizer of `NamedSharding` objects, divisibility
  checked. ``param_logical_axes`` None: the parameters are replicated; they keep their own
  sharding whatever ``where`` does to the state."""
  if param_logical_axes is None:
    param_logical_axes = jax.tree.map(lambda _: PartitionSpec(), optimizer.target)
  axes = partition_rules.normalize_param_axes(optimizer.target, param_logical_axes)
  state = unchecked_state_shardings(optimizer_def, optimizer.state, optimizer.target, axes, where)
  target = where.parameter_shardings(axes)
  # The optimizer's own definition, so the shardings have its pytree structure even where
  # create_sharded gave it the parameters' axes (optcore.contrib.muon).
  shardings = Optimizer(getattr(optimizer, "optimizer_def", optimizer_def), state, target)
  sharding.check_divisible(optimizer, shardings)
  return shardings


def add_state_axis(
  state: PyTree, shardings: PyTree, mesh: Mesh, state_axis: str, *, report: bool = True
) -> PyTree:
  """``shardings`` with every state leaf also split over the mesh axis ``state_axis``.

  Each leaf gets the axis on its largest dimension that no other mesh axis
  splits and that the axis' size divides (ties: the first): a
  parameter-shaped leaf on the parameter's largest dimension, a factored one
  (Adafactor's ``v_row``/``v_col``) on a dimension it keeps. A leaf that
  already uses the axis is left as it is. Scalars, and leaves with no such
  dimension, stay replicated; those (not the scalars) are logged, one line,
  on the ``optcore`` logger at INFO.
  """
  ways = mesh.shape[state_axis]
  keyed, treedef = jax.tree_util.tree_flatten_with_path(state)
  out, kept = [], []
  whole = _within_block(state)
  for (keys, leaf), named, in_blocks in zip(
    keyed, treedef.flatten_up_to(shardings), whole, strict=True
  ):
    shape = tuple(getattr(leaf, "shape", ()))
    spec = list(named.spec) + [None] * (len(shape) - len(named.spec))
    used = {a for entry in spec for a in (entry if isinstance(entry, tuple) else (entry,))}
    splittable = range(len(shape) - 1 if in_blocks else len(shape))
    free = [d for d in splittable if spec[d] is None and shape[d] and shape[d] % ways == 0]
    if state_axis in used or not shape:
      out.append(named)
      continue
    if not free:
      kept.append(f"{jax.tree_util.keystr(keys)} {shape}")
      out.append(named)
      continue
    dim = max(free, key=lambda d: (shape[d], -d))
    spec[dim] = state_axis
    out.append(NamedSharding(mesh, PartitionSpec(*spec)))
  if kept and report:
    logging.getLogger("optcore").info(
      "state_axis=%r (%d ways) left %d state leaves replicated, no free dimension divisible "
      "by %d: %s",
      state_axis,
      ways,
      len(kept),
      ways,
      ", ".join(kept),
    )
  return treedef.unflatten(out)


def _within_block(state: PyTree) -> list[bool]:
  """For each leaf of ``state``, whether its last dimension runs within a block of a stored
  leaf (a `QuantizedArray`'s codes): split over ``state_axis`` it would cut blocks from their
  scales, so it never is."""
  return [whole for _, whole in stored.array_flags(state)]


def _blocks_split_whole(state: PyTree, shardings: PyTree) -> PyTree:
  """``shardings`` with a stored leaf's dimension replicated where the mesh axes its
  parameter's axis maps to do not divide it: a vector of 72 values on a 2-way axis is one
  block of codes, which no device can hold half of. Every other leaf as it was (the
  divisibility check names those)."""
  flags = [inside for inside, _ in stored.array_flags(state)]
  leaves, treedef = jax.tree.flatten(shardings)
  out = []
  for leaf, named, quantized in zip(jax.tree.leaves(state), leaves, flags, strict=True):
    if not quantized:
      out.append(named)
      continue
    spec = [
      entry if size % sharding.ways(named.mesh, entry) == 0 else None
      for size, entry in zip(leaf.shape, named.spec, strict=False)
    ]
    out.append(NamedSharding(named.mesh, PartitionSpec(*spec), memory_kind=named.memory_kind))
  return treedef.unflatten(out)


def create_sharded(
  optimizer_def: Any, target: PyTree, param_logical_axes: PyTree | None, where: Placement
) -> Optimizer:
  """`OptimizerDef.create_sharded`: ``create`` jitted with the derived ``out_shardings``.
  A definition that reads the parameters' logical axes (`optcore.contrib.muon`)
  is given ``param_logical_axes`` first."""
  if param_logical_axes is not None:
    optimizer_def = optimizer_def.with_param_logical_axes(param_logical_axes)
  if where.state_axis is not None:  # ZeRO-1: a step that can use the split is told it
    split_over = NamedSharding(where.mesh, PartitionSpec(where.state_axis))
    optimizer_def = optimizer_def.with_state_split(split_over)
  abstract = jax.eval_shape(optimizer_def.create, target)
  shardings = optimizer_def.derive_shardings(abstract, param_logical_axes, where)
  optimizer = jax.jit(optimizer_def.create, out_shardings=shardings)(target)
  # Under ZeRO-1 the update is computed split like the state, then gathered: the pins say both.
  split = None
  if where.state_axis is not None:
    split = add_state_axis(abstract, shardings, where.mesh, where.state_axis, report=False)
  return optimizer._pinned_to(shardings, split)


def per_parameter_states_axes(
  optimizer_def: Any, param_states: PyTree, params: PyTree, params_axes: PyTree
) -> PyTree:
  """The axes of a per-parameter state tree: each parameter's state is passed
  to the definition's ``derive_param_state_axes``."""
  treedef = jax.tree.structure(params)
  per_param = [
    optimizer_def.derive_param_state_axes(param, spec, state)
    for param, spec, state in zip(
      jax.tree.leaves(params),
      treedef.flatten_up_to(params_axes),
      treedef.flatten_up_to(param_states),
      strict=True,
    )
  ]
  return treedef.unflatten(per_param)


def parameter_or_scalar_axes(
  optimizer_def: Any, param: Any, param_axes: PartitionSpec, state: PyTree
) -> PyTree:
  """One parameter's state axes: a parameter-shaped leaf gets ``param_axes``, a
  scalar is replicated, any other leaf raises (the definition must say)."""

  def leaf_axes(leaf: Any) -> PartitionSpec:
    if tuple(leaf.shape) == tuple(param.shape):
      return param_axes
    if not leaf.shape:
      return PartitionSpec()
    raise partition_rules.PartitionRuleError(
      f"{optimizer_def!r}: a state leaf of shape {tuple(leaf.shape)} for a parameter of shape "
      f"{tuple(param.shape)} is neither parameter-shaped nor a scalar; override "
      f"{type(optimizer_def).__name__}.derive_param_state_axes to say which axes it keeps."
    )

  return jax.tree.map(leaf_axes, state)


class ShardingMethods:
  """`OptimizerDef`'s sharding methods: the state's logical axes and shardings
  from the parameters' axes (the functions above, as methods)."""

  def derive_logical_axes(self, optimizer: Optimizer, param_logical_axes: PyTree) -> Optimizer:
    """The logical axes of ``optimizer``: an Optimizer of the same structure
    whose leaves are `PartitionSpec` objects (None where the state has None).

    The target gets ``param_logical_axes`` (one spec, tuple of names or None
    per parameter; padded to full rank); every state leaf gets the axes
    derived by the partition rules (see `derive_optax_logical_axes`); the
    step is replicated. ``optimizer`` may be abstract (``jax.eval_shape`` of
    `create`). The result round-trips through `state_dict`/`restore_state`.

    Args:
      optimizer: an Optimizer of this definition (or its ``jax.eval_shape``).
      param_logical_axes: one `PartitionSpec` (or tuple of names, or None) per parameter.

    Returns:
      An Optimizer-shaped tree of `PartitionSpec` objects.

    Raises:
      optcore.PartitionRuleError: a state leaf no rule covers, or axes that do
        not fit a parameter (named by its path).

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from jax.sharding import PartitionSpec as P
      >>> import optcore
      >>> params = {'w': jnp.zeros((4, 2))}
      >>> opt_def = optcore.adam(1e-3)
      >>> axes = opt_def.derive_logical_axes(opt_def.create(params), {'w': P('embed', 'mlp')})
      >>> axes.state.param_states[0].mu == {'w': P('embed', 'mlp')}, axes.state.step == P()
      (True, True)
    """
    return optimizer_logical_axes(self, optimizer, param_logical_axes)

  def derive_shardings(
    self,
    optimizer: Optimizer,
    param_logical_axes: PyTree | None = None,
    mesh: Mesh | Placement | None = None,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
    **placement: Unpack[StatePlacement],
  ) -> Optimizer:
    """An Optimizer-shaped tree of `NamedSharding` objects on ``mesh``: the logical
    axes of `derive_logical_axes`, mapped by Flax-style ``logical_axis_rules``
    (None: the axes already name mesh axes). Use it as a jitted step's in and
    out shardings. ``param_logical_axes`` None: the parameters are replicated.

    Where the state lives is a `Placement`: pass one as ``mesh``, or its
    fields as arguments. ``state_axis='data'`` (ZeRO-1) splits every state
    leaf over that mesh axis while the parameters keep their own sharding
    (data-parallel training then holds 1/N of the state per device, for one
    all-gather of the updated parameters per step);
    ``state_memory_kind='pinned_host'`` keeps every non-scalar state leaf in
    host memory between steps (each step, in every face, brings it to the
    device and back inside ``jit``, for the same numbers).

    Args:
      optimizer: an Optimizer of this definition (or its ``jax.eval_shape``).
      param_logical_axes: one `PartitionSpec` (logical names) per parameter;
        None: replicated.
      mesh: the device mesh (required), or a `Placement`.
      logical_axis_rules: ``(logical_name, mesh_axes)`` pairs, Flax's format.
      **placement: ``state_axis=`` (ZeRO-1) and ``state_memory_kind=``
        (host memory), as in `Placement`.

    Returns:
      An Optimizer-shaped tree of `NamedSharding` objects.

    Raises:
      optcore.PartitionRuleError: a state leaf no rule covers, or axes that
        do not fit a leaf (the message names the path).
      ValueError: no mesh, an unknown ``state_axis``, or a memory kind the
        devices lack.

    Example:
      >>> import jax, jax.numpy as jnp, numpy as np
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> import optcore
      >>> mesh = Mesh(np.array(jax.devices()[:1]), ('model',))
      >>> opt_def = optcore.adam(1e-3)
      >>> opt = opt_def.create({'w': jnp.zeros((4, 2))})
      >>> rules = [('mlp', 'model')]
      >>> shardings = opt_def.derive_shardings(opt, {'w': P('embed', 'mlp')}, mesh, rules)
      >>> shardings.state.param_states[0].mu['w'].spec == P(None, 'model')
      True
    """
    where = Placement.of(mesh, logical_axis_rules, **placement)
    return self._placed_shardings(optimizer, param_logical_axes, where)

  def _placed_shardings(
    self, optimizer: Any, param_logical_axes: PyTree | None, where: Placement
  ) -> Any:
    """`derive_shardings` once its arguments are one `Placement`: the part a layout of the
    state (`grouped`) overrides, so that the public signature is written once."""
    return optimizer_shardings(self, optimizer, param_logical_axes, where)

  def create_sharded(
    self,
    target: PyTree,
    param_logical_axes: PyTree | None = None,
    mesh: Mesh | Placement | None = None,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
    **placement: Unpack[StatePlacement],
  ) -> Optimizer:
    """Like `create`, with the target and every state leaf created sharded on
    ``mesh`` (``jit`` with ``out_shardings``): no device ever holds the
    whole state.

    Args:
      target: the parameters.
      param_logical_axes: one `PartitionSpec` (logical names) per parameter;
        None: replicated. A definition that reads axes (``contrib.muon``) is
        given them too.
      mesh: the device mesh (required), or a `Placement`.
      logical_axis_rules: ``(logical_name, mesh_axes)`` pairs, Flax's format.
      **placement: ``state_axis=`` (ZeRO-1) and ``state_memory_kind=``
        (host memory), as in `Placement`.

    Returns:
      An `Optimizer` whose target and state live sharded on ``mesh``.

    Raises:
      optcore.PartitionRuleError: a leaf whose dimension the mesh does not
        divide, or axes no rule covers (named by path).
      ValueError: as `derive_shardings`.

    Example:
      >>> import jax, jax.numpy as jnp, numpy as np
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> import optcore
      >>> mesh = Mesh(np.array(jax.devices()[:1]), ('model',))
      >>> opt = optcore.adam(1e-3).create_sharded(
      ...     {'w': jnp.zeros((4, 2))}, {'w': P('embed', 'mlp')}, mesh, [('mlp', 'model')])
      >>> opt.state.param_states[0].nu['w'].sharding.spec == P(None, 'model')
      True

    ZeRO-1, data-parallel: replicated parameters, the state split over ``'data'``:

      >>> mesh = Mesh(np.array(jax.devices()[:1]), ('data',))
      >>> opt = optcore.adam(1e-3).create_sharded(
      ...     {'w': jnp.zeros((4, 2))}, mesh=mesh, state_axis='data')
      >>> opt.state.param_states[0].mu['w'].sharding.spec == P('data', None)
      True
      >>> opt.target['w'].sharding.spec == P(None, None)
      True

    The state in host memory between steps (the step brings it over):

      >>> opt = optcore.adam(1e-3).create_sharded(
      ...     {'w': jnp.zeros((4, 2))}, mesh=mesh, state_memory_kind='pinned_host')
      >>> opt.state.param_states[0].mu['w'].sharding.memory_kind
      'pinned_host'
      >>> opt = jax.jit(lambda o, g: o.apply_gradient(g))(opt, {'w': jnp.ones((4, 2))})
      >>> opt.state.param_states[0].mu['w'].sharding.memory_kind
      'pinned_host'
    """
    return create_sharded(
      self, target, param_logical_axes, Placement.of(mesh, logical_axis_rules, **placement)
    )

  def derive_param_states_axes(
    self, param_states: PyTree, params: PyTree, params_axes: PyTree
  ) -> PyTree:
    """The axes of ``param_states``, given one full-rank spec per parameter.

    For a per-parameter definition each parameter's state is passed to
    `derive_param_state_axes`; wrapped optax and MultiOptimizer override this.
    """
    return per_parameter_states_axes(self, param_states, params, params_axes)

  def derive_param_state_axes(self, param: Any, param_axes: PartitionSpec, state: PyTree) -> PyTree:
    """The axes of one parameter's state: a leaf of the parameter's shape gets
    ``param_axes``, a scalar is replicated. Override it for any other leaf
    (a factored accumulator); by default such a leaf raises."""
    return parameter_or_scalar_axes(self, param, param_axes, state)
