"""`diloco`: DiLoCo's outer step (Douillard et al., arXiv 2311.08105) around any definition:
replicas of the model, a leading axis of every parameter, take ``every`` inner steps each; then
the outer optimizer steps the global parameters by the replicas' mean pseudo-gradient and every
replica restarts from the result. One wrapper of the wrapper protocol
(`optcore._src.definitions.wrapper`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Annotated, Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from optcore._src.axes import optax_rules, partition_rules
from optcore._src.definitions import optax_aliases
from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import REQUIRED, StateWrapper
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_float_params
from optcore._src.ground.declarations import PARAM_SHAPED, Count, Nested
from optcore._src.ground.state import OptimizerState

PyTree = Any


def _local(tree: PyTree) -> PyTree:
  """One replica's shapes: every leaf without its leading (replicas') axis."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(tuple(x.shape[1:]), x.dtype), tree)


def _is_spec(x: Any) -> bool:
  return isinstance(x, PartitionSpec)


def _local_axes(params_axes: PyTree) -> PyTree:
  """One replica's axes: every parameter's spec without its first entry (the replicas')."""
  return jax.tree.map(lambda s: PartitionSpec(*tuple(s)[1:]), params_axes, is_leaf=_is_spec)


def _anchor_axes(field: PyTree, state: Any, params_axes: PyTree, params: PyTree) -> PyTree:
  """The global parameters' axes: a replica's (the parameters' without the replicas' axis)."""
  del state, params
  return partition_rules.like_params(field, _local_axes(params_axes))


class DiLoCoState(NamedTuple):
  """The state of `diloco`.

  Attributes:
    inner: every replica's wrapped ``param_states``, stacked on the replicas' leading axis.
    anchor: the global parameters (one replica's shapes): where every replica restarted last.
    outer: the outer definition's ``param_states`` over ``anchor`` (Nesterov's momentum).
    outer_step: int32, the outer steps taken.
  """

  inner: Nested
  anchor: Annotated[PyTree, PARAM_SHAPED.with_axes(_anchor_axes)]
  outer: Nested
  outer_step: Count


def _default_outer() -> OptimizerDef:
  """The paper's outer step: Nesterov SGD, learning rate 0.7, momentum 0.9."""
  return optax_aliases.sgd(0.7, momentum=0.9, nesterov=True)


class DiLoCo(StateWrapper):
  """``optimizer_def`` run by replicas with DiLoCo's outer step: see `diloco`."""

  name = "diloco"
  state_type = DiLoCoState
  ungrouped_because = "steps replicas of the parameters, a leading axis grouped does not lay out"
  twice_hint = "one outer step (give every= the period you mean)"
  changes: ClassVar = MappingProxyType(
    {"per_parameter_state": False, "elementwise": False, "stacked_replicas": True}
  )
  config_arguments: ClassVar = MappingProxyType({"every": REQUIRED, "outer": None})
  #: Config arguments that are definitions, written and read as their own configs.
  definition_arguments: ClassVar = ("outer",)
  repr_shows = ("every",)

  @a.declare(every=a.COUNT)
  def __init__(self, optimizer_def: OptimizerDef, every: int, outer: OptimizerDef | None = None):
    if outer is not None and not isinstance(outer, OptimizerDef):
      raise TypeError(
        f"diloco: outer must be an optimizer definition (optcore.sgd(0.7, momentum=0.9, "
        f"nesterov=True), the default); got {outer!r}."
      )
    if isinstance(optimizer_def, OptimizerDef) and optimizer_def.stacked_replicas:
      raise TypeError(
        f"diloco({optimizer_def.display_name()}) wraps diloco twice; {self.twice_hint}"
      )
    self.every = int(every)
    self.outer = outer
    super().__init__(optimizer_def)

  @property
  def outer_def(self) -> OptimizerDef:
    """The outer definition: ``outer``, or the paper's Nesterov SGD (0.7, momentum 0.9)."""
    return self.outer if self.outer is not None else _default_outer()

  def init_state(self, params: PyTree) -> OptimizerState:
    """Every replica's wrapped state (each from its own replica), the global parameters (the
    first replica's: replicas start equal) and the outer state over them."""
    check_float_params(params)
    _check_replicas(params)
    inner = jax.vmap(lambda p: self.optimizer_def.init_state(p).param_states)(params)
    # a copy, never the parameters' own buffer: a step that donates the target keeps the anchor
    anchor = jax.tree.map(lambda p: jnp.array(p[0], copy=True), params)
    outer = self.outer_def.init_state(anchor)
    state = DiLoCoState(inner, anchor, outer.param_states, jnp.zeros((), jnp.int32))
    return OptimizerState(jnp.zeros((), jnp.int32), state)

  def derive_param_states_axes(self, param_states: Any, params: PyTree, params_axes: PyTree):
    """``inner``: the wrapped definition's axes for one replica, the replicas' entry first;
    ``outer``: the outer definition's for the global parameters; the rest as declared."""
    local, local_axes = _local(params), _local_axes(params_axes)
    specs = jax.tree.leaves(params_axes, is_leaf=_is_spec)
    replicas = {next(iter(s)) if len(s) else None for s in specs}
    if len(replicas) != 1:
      raise partition_rules.PartitionRuleError(
        f"diloco: the parameters' first (replicas') axis has several logical names "
        f"{sorted(map(str, replicas))}; give every parameter the same one ('replica')."
      )
    (replica,) = replicas
    inner = self.optimizer_def.derive_param_states_axes(
      _local(param_states.inner), local, local_axes
    )
    inner = jax.tree.map(lambda s: PartitionSpec(replica, *s), inner, is_leaf=_is_spec)
    outer = self.outer_def.derive_param_states_axes(param_states.outer, local, local_axes)
    own = {
      name: optax_rules.field_rule(self.field_axes[name])(
        getattr(param_states, name), param_states, params_axes, params
      )
      for name in ("anchor", "outer_step")
    }
    return param_states._replace(inner=inner, outer=outer, **own)

  def apply_gradient(self, hyper_params, params, state, grads, **extra_args):
    """Every replica's wrapped step on its own gradients; on every ``every``-th call the outer
    step: ``delta = mean_r(anchor - replica_r)``, the outer definition's step of ``anchor`` by
    ``delta``, and every replica set to the new ``anchor`` (its wrapped state kept, as the
    paper's section 6.1 and MaxText keep it)."""
    _check_replicas(params)
    own = state.param_states

    def one(p: PyTree, s: PyTree, g: PyTree) -> tuple[PyTree, PyTree]:
      new_p, new_s = self.optimizer_def.apply_gradient(
        hyper_params, p, OptimizerState(state.step, s), g, **extra_args
      )
      return new_p, new_s.param_states

    local, inner = jax.vmap(one)(params, own.inner, grads)
    step = state.step + 1
    outer_def = self.outer_def

    def sync(operands: tuple) -> tuple:
      local, anchor, outer, outer_step = operands
      # the paper's outer gradient: the replicas' mean of (global - local), MaxText's order
      delta = jax.tree.map(lambda g, r: jnp.mean(g[None] - r, axis=0), anchor, local)
      new_anchor, new_outer = outer_def.apply_gradient(
        outer_def.hyper_params, anchor, OptimizerState(outer_step, outer), delta
      )
      new_anchor = jax.tree.map(lambda n, g: n.astype(g.dtype), new_anchor, anchor)
      restarted = jax.tree.map(lambda n, r: jnp.broadcast_to(n, r.shape), new_anchor, local)
      return restarted, new_anchor, new_outer.param_states, new_outer.step

    local, anchor, outer, outer_step = jax.lax.cond(
      step % self.every == 0,
      sync,
      lambda operands: operands,
      (local, own.anchor, own.outer, own.outer_step),
    )
    return local, OptimizerState(step, DiLoCoState(inner, anchor, outer, outer_step))

  def compute_updates(self, hyper_params, params, state, grads, **extra_args):
    """`apply_gradient`'s, as optax's updates: the new replicas minus the old."""
    new_params, new_state = self.apply_gradient(hyper_params, params, state, grads, **extra_args)
    return jax.tree.map(jnp.subtract, new_params, params), new_state

  def check_state_values(self, state: OptimizerState, where: str = "state/param_states") -> None:
    """Each replica's wrapped state checked as the wrapped definition checks its own (a
    replica's slice: a count, a quantized block, as one replica holds it), and the outer's."""
    own = state.param_states
    leaves = jax.tree.leaves(own.inner)
    for r in range(leaves[0].shape[0] if leaves else 0):
      one = jax.tree.map(lambda x, r=r: x[r], own.inner)
      self.optimizer_def.check_state_values(OptimizerState(state.step, one), f"{where}/inner[{r}]")
    outer = OptimizerState(own.outer_step, own.outer)
    self.outer_def.check_state_values(outer, f"{where}/outer")

  def global_params(self, state: OptimizerState) -> PyTree:
    """The global parameters: where every replica restarted at the last outer step (the
    model to evaluate and to save as the result of training)."""
    return state.param_states.anchor


def _check_replicas(params: PyTree) -> None:
  sizes = {p.shape[0] if p.ndim else None for p in jax.tree.leaves(params)}
  if len(sizes) != 1 or None in sizes:
    raise ValueError(
      "diloco: every parameter carries the replicas on its leading axis (one replica of the "
      "model per entry); found leading sizes "
      f"{sorted(str(s) for s in sizes)}. Stack the replicas: jax.tree.map(lambda p: "
      "jnp.broadcast_to(p, (replicas, *p.shape)), params)."
    )


def diloco(optimizer_def: OptimizerDef, *, every: int, outer: OptimizerDef | None = None) -> DiLoCo:
  """DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language
  Models", arXiv 2311.08105): replicas train with ``optimizer_def`` (the inner optimizer, AdamW
  in the paper) and communicate once every ``every`` steps (the paper's ``H``), when the outer
  optimizer (``outer``: Nesterov SGD, learning rate 0.7, momentum 0.9 by default, the paper's)
  steps the global parameters by the replicas' mean pseudo-gradient ``mean_r(global -
  replica_r)`` and every replica restarts from the result. Each replica keeps its inner state
  across the outer steps.

  The replicas are the parameters' leading axis: every parameter carries one copy per replica
  (``jax.tree.map(lambda p: jnp.broadcast_to(p, (R, *p.shape)), params)``; they start equal),
  and so do the gradients, each replica's from its own data. Name that axis in the logical axes
  (``P('replica', 'embed', 'mlp')``) and map it to a mesh axis: the replicas are then devices,
  or processes where the mesh spans them (``jax.distributed``), and the outer step's mean is the
  one all-reduce over that axis every ``every`` steps. `global_params` reads the global model.
  Streaming DiLoCo's fragments (arXiv 2501.18512) are not built.

  Args:
    optimizer_def: the inner definition, each replica's.
    every: the inner steps between outer steps (``H``).
    outer: the outer definition; None for ``optcore.sgd(0.7, momentum=0.9, nesterov=True)``.

  Returns:
    A `DiLoCo` definition.

  Raises:
    optcore.ArgumentError: ``every`` is not a positive integer.
    TypeError: ``outer`` is not a definition.
    ValueError: (at creation and each step) parameters without one common leading size.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> replicas = {'w': jnp.zeros((2, 1))}  # two replicas of a one-element model
    >>> opt_def = optcore.diloco(optcore.sgd(1.0), every=2, outer=optcore.sgd(1.0))
    >>> opt = opt_def.create(replicas)
    >>> opt = opt.apply_gradient({'w': jnp.array([[1.0], [3.0]])})  # each replica alone
    >>> opt.target['w'].ravel()
    Array([-1., -3.], dtype=float32)
    >>> opt = opt.apply_gradient({'w': jnp.array([[1.0], [3.0]])})  # mean of -2 and -6: -4
    >>> opt.target['w'].ravel(), opt_def.global_params(opt.state)['w']
    (Array([-4., -4.], dtype=float32), Array([-4.], dtype=float32))
  """
  return DiLoCo(optimizer_def, every, outer)
