"""The grouped layout: many small parameters, and their state, in one buffer per dtype.

Raw optax runs one to three fusions per parameter: a model of many small
leaves (deep MLPs, policies, norms and biases) pays that overhead on every
step and in compile time. `grouped` keeps every small floating parameter,
and its optimizer state, in one flat buffer per (group, dtype) between steps,
so an element-wise optimizer updates them in one pass; each step concatenates
only the gradients. Large leaves stay as they are (concatenating them would
write a fresh copy per step). `GroupedOptimizer.target` slices the user's
pytree back out, which XLA fuses into its consumers inside ``jit``.

Only element-wise algorithms may be grouped (``OptimizerDef.elementwise``):
on a buffer, an algorithm that reduces per leaf (LAMB's trust ratio,
Adafactor's factored moments, a global norm) would reduce over many leaves
at once. State dicts, restores and error messages speak the ungrouped layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from optcore._src.axes import partition_rules, sharding
from optcore._src.containers import state_axes
from optcore._src.containers.optimizer import BoundOptimizer, Pins
from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import Wrapper
from optcore._src.ground import paths
from optcore._src.ground.checks import TreeMismatchError, check_float_params, check_gradients
from optcore._src.ground.grouped_layout import (
  Entry,
  GroupedParams,
  GroupLayout,
  is_grouped,
  pack_like,
  unpack_tree,
)
from optcore._src.ground.state import OptimizerState

PyTree = Any
T = TypeVar("T")


class UngroupableError(TypeError):
  """A definition `grouped` cannot run on a buffer (one that reduces per parameter)."""


UngroupableError.__module__ = "optcore"


class Grouped(Wrapper):
  """``optimizer_def`` with its small parameters and their state grouped: see `grouped`."""

  name = "grouped"
  changes: ClassVar = MappingProxyType({"groups_parameters": True})
  config_arguments: ClassVar = MappingProxyType({"max_leaf_size": 65536, "max_buffer_size": 262144})
  repr_shows = ("max_leaf_size", "max_buffer_size")

  def __init__(
    self,
    optimizer_def: OptimizerDef,
    max_leaf_size: int = 65536,
    max_buffer_size: int = 262144,
  ):
    super().__init__(optimizer_def)
    if optimizer_def.groups_parameters:
      raise TypeError(f"{optimizer_def!r} is grouped already; group it once")
    for name, value, meaning in (
      ("max_leaf_size", max_leaf_size, "the element count below which a leaf is grouped"),
      ("max_buffer_size", max_buffer_size, "the most elements one buffer holds"),
    ):
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int ({meaning}), got {value!r}")
    reason = optimizer_def.why_not_elementwise()
    if reason is not None:
      raise UngroupableError(
        f"grouped({optimizer_def.display_name()}) is not possible: {reason}. On one buffer "
        "of many parameters it would give other numbers than per parameter. Use the "
        "definition ungrouped, or group an element-wise one (sgd, adam, adamw, lion, "
        "rmsprop, ..., and flax.optim's but LAMB, LARS and WeightNorm)."
      )
    self.max_leaf_size = max_leaf_size
    self.max_buffer_size = max_buffer_size

  # What is grouped.

  def layout(self, params: PyTree) -> GroupLayout:
    """Where each parameter of ``params`` lives (arrays or abstract arrays).

    Floating leaves with fewer than ``max_leaf_size`` elements share flat
    buffers per (group, dtype), in the parameters' order, each filled up to
    ``max_buffer_size`` elements; every other leaf stays as it is.
    """
    named, treedef = paths.leaves_with_names(params)
    groups = self._groups(params, treedef)
    # (group, dtype, part) -> elements so far; a buffer is full at max_buffer_size elements.
    sizes: dict[tuple[int, str, int], int] = {}
    parts: dict[tuple[int, str], int] = {}
    entries, ungrouped, where = [], 0, []
    for (names, leaf), group in zip(named, groups, strict=True):
      shape, dtype = tuple(np.shape(leaf)), jnp.dtype(leaf.dtype)
      where.append("/" + "/".join(names))
      size = math.prod(shape)
      if jnp.issubdtype(dtype, jnp.floating) and size < self.max_leaf_size:
        part = parts.setdefault((group, dtype.name), 0)
        filled = sizes.get((group, dtype.name, part), 0)
        if filled and filled + size > self.max_buffer_size:
          part = parts[(group, dtype.name)] = part + 1
        key = (group, dtype.name, part)
        offset = sizes.setdefault(key, 0)
        entries.append(Entry(shape, dtype.name, list(sizes).index(key), offset))
        sizes[key] = offset + size
      else:
        entries.append(Entry(shape, dtype.name, -1, ungrouped))
        ungrouped += 1
    table = tuple((group, dtype, size) for (group, dtype, _), size in sizes.items())
    return GroupLayout(treedef, tuple(entries), table, tuple(where))

  def _groups(self, params: PyTree, treedef: Any) -> list[int]:
    """Each parameter's `MultiOptimizer` group (-1: frozen); 0 for a plain definition."""
    masks = self.optimizer_def.group_masks(params)
    if masks is None:
      return [0] * treedef.num_leaves
    groups = [-1] * treedef.num_leaves
    for g, mask in enumerate(masks):
      for i, picked in enumerate(treedef.flatten_up_to(mask)):
        if picked:
          groups[i] = g
    return groups

  def inner_for(self, layout: GroupLayout) -> OptimizerDef:
    """The definition that runs on the grouped tree: the wrapped one, or for a
    `MultiOptimizer` the same groups selected by masks over the buffers."""
    inner = self.optimizer_def
    cache = self.__dict__.setdefault("_inner_cache", {})
    if layout not in cache:
      if inner.group_masks(layout.shapes()) is None:
        return inner
      groups = self._groups(layout.shapes(), layout.treedef)
      selectors = []
      for g in range(len(inner.children())):
        buffers = tuple(group == g for group, _, _ in layout.buffers)
        leaves = tuple(groups[j] == g for j, e in enumerate(layout.entries) if e.buffer < 0)
        selectors.append(GroupedParams(layout, buffers, leaves))
      cache[layout] = inner.with_group_selectors(selectors)
    return cache[layout]

  # The definition's interface, on the grouped tree.

  def init_state(self, params: PyTree) -> OptimizerState:
    if not is_grouped(params):
      check_float_params(params)
      params = self.layout(params).pack(params)
    return self.inner_for(params.layout).init_state(params)

  def create(self, target: PyTree, focus: Any = None) -> GroupedOptimizer:  # pyright: ignore[reportIncompatibleMethodOverride]  # its own container
    """A `GroupedOptimizer` over ``target``: its small leaves, and their
    state, grouped from here on. ``focus`` as in `OptimizerDef.create`."""
    if focus is not None:
      raise TypeError(
        "grouped(...).create takes no focus: group a MultiOptimizer instead, "
        "optcore.grouped(optcore.MultiOptimizer((focus, opt_def)))"
      )
    check_float_params(target)
    packed = self.layout(target).pack(target)
    return GroupedOptimizer(self, self.inner_for(packed.layout).init_state(packed), packed)

  def apply_gradient(self, hyper_params, params, state, grads, **extra_args):
    """One step. ``params`` grouped (a `GroupedOptimizer`'s) gives grouped new
    parameters; ungrouped (a face that owns its parameters) are grouped for
    the step and the new ones split back."""
    grouped = is_grouped(params)
    packed = params if grouped else self.layout(params).pack(params)
    if not (grouped and is_grouped(grads)):
      grads = packed.layout.pack(grads)
    inner = self.inner_for(packed.layout)
    new, state = inner.apply_gradient(hyper_params, packed, state, grads, **extra_args)
    return (new if grouped else new.unpack()), state

  def why_not_elementwise(self) -> str | None:
    return "it is grouped already"

  def as_optax(self) -> Any:
    raise TypeError(
      f"{self.display_name()} keeps its parameters grouped, which an optax transformation "
      "(TrainState, nnx.Optimizer) cannot: they own the parameters. Pass the ungrouped "
      f"definition, {self.optimizer_def!r}, or use its GroupedOptimizer (create)."
    )

  # State dicts, in the ungrouped layout.

  def state_dict(self, target: PyTree, state: OptimizerState) -> dict[str, Any]:
    return self.optimizer_def.state_dict(unpack_tree(target), unpack_tree(state))

  def restore_state(self, target: PyTree, state: OptimizerState, state_dict: Mapping[str, Any]):
    new_target, new_state = self.optimizer_def.restore_state(
      unpack_tree(target), unpack_tree(state), state_dict
    )
    return pack_like(target, new_target), pack_like(state, new_state)

  # Logical axes and shardings: a buffer is replicated (split under state_axis).

  def derive_logical_axes(self, optimizer: Any, param_logical_axes: PyTree) -> GroupedOptimizer:  # pyright: ignore[reportIncompatibleMethodOverride]  # its own container
    packed, target_axes = self._target_axes(optimizer, param_logical_axes)
    inner = self.inner_for(packed.layout)
    state = state_axes.state_axes_of_full_rank(inner, optimizer.packed_state, packed, target_axes)
    return GroupedOptimizer(self, state, target_axes)

  def _target_axes(self, optimizer: Any, param_logical_axes: PyTree | None):
    """The packed target and its axes: a buffer replicated, an ungrouped leaf its own."""
    packed = optimizer.packed_target
    user = packed.layout.shapes()
    if param_logical_axes is None:
      param_logical_axes = jax.tree.map(lambda _: PartitionSpec(), user)
    axes = partition_rules.normalize_param_axes(user, param_logical_axes)
    flat = packed.layout.treedef.flatten_up_to(axes)
    target_axes = GroupedParams(
      packed.layout,
      tuple(PartitionSpec(None) for _ in packed.buffers),
      tuple(a for a, e in zip(flat, packed.layout.entries, strict=True) if e.buffer < 0),
    )
    return packed, target_axes

  def _placed_shardings(
    self, optimizer: Any, param_logical_axes: PyTree | None, where: state_axes.Placement
  ) -> GroupedOptimizer:
    """`derive_shardings` (OptimizerDef's, its one signature) for the grouped layout: the
    buffers replicated or split as ``where`` says, the ungrouped leaves by their axes."""
    packed, target_axes = self._target_axes(optimizer, param_logical_axes)
    inner = self.inner_for(packed.layout)
    state = state_axes.unchecked_state_shardings(
      inner, optimizer.packed_state, packed, target_axes, where
    )
    shardings = GroupedOptimizer(self, state, where.parameter_shardings(target_axes))
    sharding.check_divisible(optimizer, shardings)
    return shardings

  # derive_shardings and create_sharded are OptimizerDef's: they call create and the above.


@dataclasses.dataclass(frozen=True)
class GroupedOptimizer(BoundOptimizer[T]):
  """An `Optimizer` whose small parameters and their state stay grouped.

  Made by ``grouped(opt_def).create(target)``; used as an `Optimizer` is: ``compute_gradient``,
  ``optimize``, ``current_hyper_params``, ``transplant`` and the read-outs are the same methods
  (one implementation for both containers), which see only the ungrouped ``target`` and
  ``state``.
  ``target`` and ``state`` are the ungrouped views (slices of the buffers;
  inside ``jit`` XLA fuses them into their consumers); ``packed_target`` and
  ``packed_state`` are what it holds, and its pytree leaves.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import optcore
    >>> params = {'w': jnp.ones((3, 2)), 'b': jnp.ones(2)}
    >>> opt = optcore.grouped(optcore.sgd(0.1, momentum=0.9)).create(params)
    >>> loss = lambda p: jnp.sum(p['w'] ** 2) + jnp.sum(p['b'])
    >>> step = jax.jit(lambda opt: opt.apply_gradient(jax.grad(loss)(opt.target)))
    >>> opt = step(opt)
    >>> opt.target['b']
    Array([0.9, 0.9], dtype=float32)
    >>> opt.state.param_states[0].trace['b']
    Array([1., 1.], dtype=float32)
    >>> opt.packed_state.param_states[0].trace
    GroupedParams(buffers=['float32[8] (group 0)'], ungrouped=0 leaves)
  """

  optimizer_def: Grouped
  packed_state: OptimizerState
  packed_target: GroupedParams
  packed_target_shardings: Pins = dataclasses.field(default_factory=Pins)  # as Optimizer's

  @property
  def target(self) -> T:
    """The parameters in their own structure."""
    return self.packed_target.unpack()

  @property
  def state(self) -> OptimizerState:
    """The state as the ungrouped definition lays it out."""
    return unpack_tree(self.packed_state)

  def apply_gradient(
    self,
    grads: PyTree,
    *,
    extra_args: Mapping[str, Any] | None = None,
    **hyper_param_overrides: Any,
  ) -> GroupedOptimizer[T]:
    """One update with ``grads``, in the target's structure (as `jax.grad` of
    a loss of ``target`` gives them) or grouped (of a loss of
    ``packed_target.unpack()``, which skips the concatenation). Overrides as
    in `Optimizer.apply_gradient`."""
    layout = self.packed_target.layout
    if is_grouped(grads):
      if grads.layout != layout:
        raise ValueError(
          "grads are grouped in another layout than the optimizer's: differentiate with "
          "respect to this optimizer's packed_target"
        )
    else:
      shapes = layout.shapes()
      grads = paths.conform(shapes, grads)
      check_gradients(self.optimizer_def.optimizer_def, shapes, grads)
      grads = layout.pack(grads)
    held = (self.packed_target, self.packed_state)
    target, state = self._stepped(
      held, grads, extra_args, hyper_param_overrides, self.packed_target_shardings
    )
    return dataclasses.replace(self, packed_target=target, packed_state=state)

  def state_dict(self) -> dict[str, Any]:
    """The state dict of the ungrouped optimizer: it restores either way."""
    return self.optimizer_def.state_dict(self.packed_target, self.packed_state)

  def restore_state(self, state_dict: Mapping[str, Any]) -> GroupedOptimizer[T]:
    """A new optimizer holding what ``state_dict`` holds (written grouped or not)."""
    target, state = self.optimizer_def.restore_state(
      self.packed_target, self.packed_state, state_dict
    )
    return dataclasses.replace(self, packed_target=target, packed_state=state)

  def replace(self, **changes: Any) -> GroupedOptimizer[T]:
    """A copy with ``target=`` and/or ``state=`` (ungrouped, as the properties
    give them) or ``packed_target=``/``packed_state=`` replaced."""
    if "target" in changes:
      target = changes.pop("target")
      _check_target(self.packed_target.layout, target)
      changes["packed_target"] = self.packed_target.layout.pack(target)
    if "state" in changes:
      changes["packed_state"] = pack_like(self.packed_state, changes.pop("state"))
    return dataclasses.replace(self, **changes)

  def _pinned_to(
    self, shardings: GroupedOptimizer[Any], split: GroupedOptimizer[Any] | None
  ) -> GroupedOptimizer[T]:
    """This optimizer, whose steps keep the buffers on ``shardings.packed_target`` (as
    `Optimizer._pinned_to`)."""
    pins = Pins.of(shardings.packed_target, split and split.packed_target)
    return dataclasses.replace(self, packed_target_shardings=pins)


jax.tree_util.register_dataclass(
  GroupedOptimizer,
  data_fields=["packed_state", "packed_target"],
  meta_fields=["optimizer_def", "packed_target_shardings"],
)


def _check_target(layout: Any, target: PyTree) -> None:
  """Raises `TreeMismatchError` naming the first parameter of ``target`` whose shape or dtype
  is not the layout's: a buffer holds its elements flat, so a (3, 2) array for a (2, 3)
  parameter would be read back reshaped."""
  shapes = layout.shapes()
  target = paths.conform(shapes, target)
  keyed, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  try:
    given = treedef.flatten_up_to(target)
  except (ValueError, TypeError) as e:
    raise TreeMismatchError(
      f"replace(target=...): the new target does not have the parameters' structure: {e}"
    ) from None
  for (keys, want), got in zip(keyed, given, strict=True):
    got_shape, got_dtype = tuple(jnp.shape(got)), jnp.result_type(got)
    if got_shape != tuple(want.shape) or got_dtype != want.dtype:
      raise TreeMismatchError(
        f"replace(target=...): the parameter at {paths.path_str(keys)!r} is "
        f"{got_dtype.name}{list(got_shape)}, but this grouped optimizer's layout holds "
        f"{want.dtype.name}{list(want.shape)} there. Give it the same shape and dtype (a "
        "buffer keeps elements, not shapes), or create a new optimizer for other parameters."
      )


def grouped(
  optimizer_def: OptimizerDef, max_leaf_size: int = 65536, max_buffer_size: int = 262144
) -> Grouped:
  """``optimizer_def`` with its small parameters, and their state, in one buffer per dtype.

  Every floating parameter with fewer than ``max_leaf_size`` elements, and
  its optimizer state, lives in flat buffers per dtype (per group of a
  `MultiOptimizer`) between steps, so an element-wise optimizer updates
  many parameters in one pass; a step concatenates only the gradients.
  Larger leaves stay as they are. A buffer holds at most ``max_buffer_size``
  elements: several buffers let the update of the last layers' buffer run
  while the backward pass still computes the first layers' gradients
  (measured on a 2-core CPU: a 1M-parameter, 300-leaf MLP step x0.86 of
  raw optax with one buffer, x0.51-0.59 with 2 to 8). The numbers are the
  ungrouped definition's (bitwise for sgd, momentum and lion; where the
  update divides, XLA may round the last bit of a few elements otherwise).
  State dicts are the ungrouped definition's, and restore either way.

  Args:
    optimizer_def: an element-wise definition (``elementwise`` true: sgd,
      adam, adamw, lion, rmsprop, ..., flax.optim's but LAMB, LARS and
      WeightNorm), or a `MultiOptimizer` of them.
    max_leaf_size: leaves with fewer elements are grouped.
    max_buffer_size: the most elements one buffer holds (a larger leaf
      still gets a buffer of its own).

  Returns:
    A `Grouped` definition; its ``create`` gives a `GroupedOptimizer`.

  Raises:
    UngroupableError: ``optimizer_def`` reduces per parameter (lamb, lars,
      adafactor, a global-norm clip, a weight-decay mask), says which.
    ValueError: ``max_leaf_size`` or ``max_buffer_size`` is not a positive int.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import optcore
    >>> params = [{'w': jnp.ones((4, 4)), 'b': jnp.zeros(4)} for _ in range(3)]
    >>> opt = optcore.grouped(optcore.adam(1e-2), max_leaf_size=1024).create(params)
    >>> opt.packed_target
    GroupedParams(buffers=['float32[60] (group 0)'], ungrouped=0 leaves)
    >>> grads = jax.tree.map(jnp.ones_like, opt.target)
    >>> opt = jax.jit(lambda o, g: o.apply_gradient(g))(opt, grads)
    >>> opt.target[0]['b'].round(4)
    Array([-0.01, -0.01, -0.01, -0.01], dtype=float32)
  """
  return Grouped(optimizer_def, max_leaf_size, max_buffer_size)
