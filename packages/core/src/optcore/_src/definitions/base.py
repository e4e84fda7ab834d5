"""The optimizer definition: an algorithm and its hyper-parameters.

The API is flax.optim's (v0.5.3) and T5X's. A definition is static data of
the jitted `Optimizer` (the same configuration never retraces). It holds the
algorithm; the methods users call for overrides, sharding, serialization and
export delegate to the modules that do that work (`overrides`, `state_axes`,
`serialization`, `export`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self, cast

import jax
import jax.numpy as jnp
import optax

from optcore._src.containers import export, state_axes
from optcore._src.containers.optimizer import Optimizer, replicated
from optcore._src.ground import definition_tree, overrides, paths
from optcore._src.ground.checks import check_float_params, check_learning_rate
from optcore._src.ground.hyper_params import (
  HyperParams,
  StaticConfig,
  at_step,
  current_values,
  is_schedule,
)
from optcore._src.ground.state import OptimizerState
from optcore._src.persistence import serialization

PyTree = Any


class OptimizerDef(
  StaticConfig, state_axes.ShardingMethods, serialization.StateDictMethods, export.ExportMethods
):
  """The definition of an optimizer: its algorithm and hyper-parameters.

  Subclass it for a per-parameter algorithm (flax.optim style) by giving
  `init_param_state` and `apply_param_gradient`, or use `OptaxWrapper` for an
  optax transformation. `create` binds it to parameters.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> class Sign(optcore.OptimizerDef):
    ...   def __init__(self, learning_rate=0.1):
    ...     super().__init__(optcore.HyperParams(learning_rate=learning_rate))
    ...   def init_param_state(self, param):
    ...     return ()
    ...   def apply_param_gradient(self, step, hyper_params, param, state, grad):
    ...     return param - hyper_params.learning_rate * jnp.sign(grad), state
    >>> opt = Sign().create({'w': jnp.ones(2)})
    >>> opt = opt.apply_gradient({'w': jnp.array([1.0, -1.0])}, learning_rate=0.5)
    >>> opt.target['w'], int(opt.state.step)
    (Array([0.5, 1.5], dtype=float32), 1)
  """

  #: Whether ``init_state(params).param_states`` holds one state per parameter,
  #: in the parameters' structure (flax.optim's algorithms). A `MultiOptimizer`
  #: of such definitions keeps them in ONE parameter-shaped tree, as
  #: flax.optim and T5X did; set it to False in a subclass whose state is not
  #: per parameter (wrapped optax transformations are not).
  per_parameter_state: bool = True

  #: Whether the gradients carry a leading axis of examples before the
  #: parameter's own dimensions (dpsgd's per-example gradients); the
  #: gradient check then compares the trailing dimensions.
  per_example_gradients: bool = False

  #: Whether the update of each element reads that element only (of the
  #: parameter, gradient and state): then `grouped` may run the definition on
  #: one buffer of many parameters and get the same numbers. Declare it True
  #: in a subclass whose algorithm has no per-parameter reduction.
  elementwise: bool = False

  #: Whether the definition keeps its parameters in its own layout between
  #: steps (`grouped`): then only an optimizer it creates can hold them, not a
  #: face or container that owns the parameters.
  groups_parameters: bool = False

  #: Hyper-parameters the original algorithm read from its constructor only
  #: (they shape the state): an apply-time override of one is accepted, as
  #: the original accepted it, changes nothing, and warns that it changed nothing.
  constructor_only: tuple[str, ...] = ()

  #: Hyper-parameters whose None the original algorithm reads as "off"
  #: (Adafactor's ``clipping_threshold``): an apply-time override of None is
  #: accepted for these, as the original accepted it, and refused for the rest.
  none_means_off: tuple[str, ...] = ()

  #: Whether `restore_state` reads state dicts as flax.optim and T5X read
  #: them: the ``'target'`` and ``'state'`` keys only (T5X's train state passes
  #: its ``'flax_mutables'`` beside them), and NumPy's 64-bit values where the
  #: state holds the 32-bit dtype JAX makes of them. Definitions written
  #: against flax.optim's interface (this class, `optcore.legacy`, T5X's
  #: Adafactor and the T5X face) do; the core's optax wrappers refuse both.
  legacy_state_dicts: bool = True

  #: Whether every call of the step moves the parameters by this call's gradients: not for one
  #: that holds them over several calls (`accumulate`), which `qk_clip` (a rescaling after each
  #: real step) refuses to wrap.
  steps_every_call: bool = True

  #: Whether every parameter carries replicas of the model on its leading axis (`diloco`).
  stacked_replicas: bool = False

  #: The flags above: a definition that wraps another (`accumulate`, `ema`, ...) takes each
  #: from the definition it wraps unless it declares that it changes it.
  FLAGS: tuple[str, ...] = (
    "per_parameter_state",
    "per_example_gradients",
    "elementwise",
    "groups_parameters",
    "constructor_only",
    "none_means_off",
    "legacy_state_dicts",
    "steps_every_call",
    "stacked_replicas",
  )

  #: The hyper-parameters: one `HyperParams`, or for a definition of groups (`MultiOptimizer`)
  #: one per group.
  hyper_params: Any

  #: Whether `compute_updates` gives an optax transformation's own updates (an optax
  #: definition), rather than ``new_params - params``: a wrapper that accumulates or masks
  #: updates (`accumulate`) works on them then, as optax's own wrappers do. Declared by the
  #: class; no wrapper passes it on (each wrapper's `compute_updates` is its own).
  gives_optax_updates: ClassVar[bool] = False

  def group_masks(self, params: PyTree) -> list[PyTree] | None:
    """For a definition of groups (`MultiOptimizer`), each group's boolean mask over
    ``params``; None for any other. What a layout of the parameters (`grouped`) asks."""
    return None

  def with_group_selectors(self, selectors: Sequence[Any]) -> OptimizerDef:
    """This definition of groups with each group selected by ``selectors[i]`` instead (the
    grouped layout selects by masks over its buffers). Only a definition of groups has it."""
    raise TypeError(f"{self.display_name()} has no groups to select")

  def __init__(self, hyper_params: HyperParams | Mapping[str, Any] | Any):
    if dataclasses.is_dataclass(hyper_params) and not isinstance(hyper_params, type):
      # flax.optim definitions pass a struct dataclass of their hyper-parameters.
      fields = dataclasses.fields(hyper_params)
      hyper_params = {f.name: getattr(hyper_params, f.name) for f in fields}
    if not isinstance(hyper_params, HyperParams):
      hyper_params = HyperParams(**dict(cast(Mapping[str, Any], hyper_params)))
    self.hyper_params = hyper_params

  def __init_subclass__(cls, **kwargs: Any):
    super().__init_subclass__(**kwargs)
    _register_static(cls)

  # The per-parameter interface of flax.optim.

  def init_param_state(self, param: jax.Array) -> PyTree:
    """The initial state of one parameter."""
    raise NotImplementedError(
      f"{type(self).__name__} defines neither init_param_state nor init_state"
    )

  def apply_param_gradient(
    self,
    step: jax.Array,
    hyper_params: HyperParams,
    param: jax.Array,
    state: PyTree,
    grad: jax.Array,
  ) -> tuple[jax.Array, PyTree]:
    """Updates one parameter; ``step`` counts the updates before this one."""
    raise NotImplementedError(
      f"{type(self).__name__} defines neither apply_param_gradient nor apply_gradient"
    )

  # The whole-tree interface.

  def init_state(self, params: PyTree) -> OptimizerState:
    """The state at step 0 for ``params``.

    Args:
      params: the parameters, a pytree of floating (or complex) arrays.

    Returns:
      An `OptimizerState`: step 0 and each parameter's initial state.

    Raises:
      TypeError: a parameter is not a floating array (the message names its path).

    Example:
      >>> import jax.numpy as jnp
      >>> from optcore import legacy
      >>> state = legacy.Momentum(0.1).init_state({'w': jnp.ones(2)})
      >>> int(state.step), state.param_states['w'].momentum
      (0, Array([0., 0.], dtype=float32))
    """
    check_float_params(params)
    return OptimizerState(
      jnp.asarray(0, dtype=jnp.int32), jax.tree.map(self.init_param_state, params)
    )

  def apply_gradient(
    self,
    hyper_params: HyperParams,
    params: PyTree,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    """Applies one step to ``params`` (the functional form `Optimizer.apply_gradient` calls).

    Args:
      hyper_params: the hyper-parameters for this step (`update_hyper_params`).
      params: the parameters.
      state: their `OptimizerState`.
      grads: the gradients, in the parameters' structure.
      **extra_args: extra update arguments, for a definition that takes them.

    Returns:
      ``(new_params, new_state)``, the step one more.

    Raises:
      TypeError: ``extra_args`` given to a definition that takes none.
      optcore.MissingHyperParameterError: no learning rate, here or in the constructor.

    Example:
      >>> import jax.numpy as jnp
      >>> from optcore import legacy
      >>> opt_def = legacy.GradientDescent(0.5)
      >>> params = {'w': jnp.ones(2)}
      >>> new_params, state = opt_def.apply_gradient(
      ...     opt_def.hyper_params, params, opt_def.init_state(params), {'w': jnp.ones(2)})
      >>> new_params['w'], int(state.step)
      (Array([0.5, 0.5], dtype=float32), 1)
    """
    if extra_args:
      raise TypeError(
        f"{type(self).__name__} takes no extra update arguments; got {sorted(extra_args)}"
      )
    check_learning_rate(self, hyper_params)
    hyper_params = at_step(hyper_params, state.step)  # a schedule is read at this step
    params_flat, treedef = jax.tree.flatten(params)
    states_flat = treedef.flatten_up_to(paths.conform(params, state.param_states))
    grads_flat = treedef.flatten_up_to(paths.conform(params, grads))
    out = [
      self.apply_param_gradient(state.step, hyper_params, p, s, g)
      for p, s, g in zip(params_flat, states_flat, grads_flat, strict=True)
    ]
    new_params = treedef.unflatten([p for p, _ in out])
    new_states = treedef.unflatten([s for _, s in out])
    return new_params, OptimizerState(state.step + 1, new_states)

  def compute_updates(
    self,
    hyper_params: HyperParams,
    params: PyTree,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    """One step in optax's terms: ``(updates, new_state)``, with ``updates =
    new_params - params`` (a wrapped optax transformation returns its own
    updates, exactly, and needs no ``params``).

    Args:
      hyper_params: the hyper-parameters for this step.
      params: the parameters.
      state: their `OptimizerState`.
      grads: the gradients.
      **extra_args: extra update arguments, for a definition that takes them.

    Returns:
      ``(updates, new_state)``.

    Raises:
      TypeError: ``extra_args`` given to a definition that takes none.

    Example:
      The update of a definition with an override of its rate, for a step of one's own:

      >>> import jax.numpy as jnp
      >>> from optcore import legacy
      >>> sgd = legacy.GradientDescent(0.5)
      >>> w = {'w': jnp.ones(2)}
      >>> hp = sgd.hyper_params.replace(learning_rate=0.25)
      >>> updates, _ = sgd.compute_updates(hp, w, sgd.init_state(w), {'w': jnp.ones(2)})
      >>> updates['w']
      Array([-0.25, -0.25], dtype=float32)
    """
    if params is None:
      raise ValueError(
        f"params must be provided: {self!r} computes new parameters from the old ones (its "
        "updates are new - old)"
      )
    new_params, new_state = self.apply_gradient(hyper_params, params, state, grads, **extra_args)
    return jax.tree.map(lambda new, old: new - old, new_params, params), new_state

  def why_not_elementwise(self) -> str | None:
    """None where `grouped` may run this definition on a buffer of many
    parameters (``elementwise``); else why not, in a few words."""
    if self.elementwise:
      return None
    return (
      f"{self.display_name()} is not element-wise: its update of an element may read other "
      "elements of its parameter (a norm, a factored moment); a definition whose update of "
      "each element reads only that element says so with elementwise = True"
    )

  def with_param_logical_axes(self, param_logical_axes: PyTree) -> OptimizerDef:
    """This definition told the parameters' logical axes, for one that reads
    them (`optcore.contrib.muon`'s matrix dimensions); `create_sharded` calls
    it with its axes. A definition that reads none, or has its own, is
    returned as it is; one with children (a wrapper, a `MultiOptimizer`) tells
    each of them its part, however deep (`definition_tree`)."""
    readers = (d.reads_param_logical_axes() for d in definition_tree.iter_definitions(self))
    if not self.children() or not any(readers):  # no group's selector is run on the axes then
      return self
    return definition_tree.map_definitions(
      lambda d, axes: d if d.children() else d.with_param_logical_axes(axes),
      self,
      param_logical_axes,
    )

  def with_state_split(self, split: Any) -> OptimizerDef:
    """This definition told that `create_sharded` splits its state over ``split``'s mesh axis
    (ZeRO-1, a ``NamedSharding(mesh, P(state_axis))``), for one whose step can use it:
    `optcore.contrib.muon` then orthogonalises whole matrices on owner devices. One with
    children tells each of them; any other is returned as it is."""
    children = self.children()
    told = tuple(child.with_state_split(split) for child in children)
    if all(a is b for a, b in zip(told, children, strict=True)):
      return self
    return self.with_children(told)

  #: The hyper-parameters that are weight decays (flax.optim's and T5X's algorithms declare
  #: theirs here; an optax factory's are declared on its arguments, `arguments.declare_for`):
  #: `optcore.cautious` masks the step without them and adds their part after, unmasked.
  weight_decays: ClassVar[tuple[str, ...]] = ()

  def weight_decay_names(self) -> tuple[str, ...]:
    """The names of this definition's own hyper-parameters that are weight decays (not its
    children's): the class's `weight_decays`.

    Example:
      >>> import optcore
      >>> optcore.legacy.Adam(0.1).weight_decay_names(), optcore.adamw(0.1).weight_decay_names()
      (('weight_decay',), ('weight_decay',))
    """
    return self.weight_decays

  #: The hyper-parameters that are learning rates (flax.optim's and T5X's algorithms declare
  #: theirs here; an optax factory's are declared on its arguments, `arguments.RATE`):
  #: `optcore.multipliers` scales them per parameter.
  learning_rates: ClassVar[tuple[str, ...]] = ()

  def learning_rate_names(self) -> tuple[str, ...]:
    """The names of this definition's own hyper-parameters that are learning rates (not its
    children's): the class's `learning_rates`.

    Example:
      >>> import optcore
      >>> optcore.legacy.Adam(0.1).learning_rate_names(), optcore.adamw(0.1).learning_rate_names()
      (('learning_rate',), ('learning_rate',))
    """
    return self.learning_rates

  def reads_param_logical_axes(self) -> bool:
    """Whether `with_param_logical_axes` would change this definition itself (not its
    children): one that derives something from the axes and has none of its own."""
    return False

  # The tree of definitions (`definition_tree` walks it; nothing else does).

  def children(self) -> tuple[OptimizerDef, ...]:
    """The definitions this one wraps or groups, in order: none for an algorithm of its own.

    Returns:
      A tuple of definitions.

    Example:
      >>> import optcore
      >>> optcore.ema(optcore.sgd(0.1)).children()
      (sgd(learning_rate=0.1, momentum=None, nesterov=False, accumulator_dtype=None),)
    """
    return ()

  def with_children(self, children: tuple[OptimizerDef, ...]) -> OptimizerDef:
    """A new definition like this one holding ``children`` in place of its own; this one is
    unchanged (definitions are immutable).

    Raises:
      TypeError: children given to a definition that has none.
    """
    if children:
      raise TypeError(f"{self.display_name()} holds no definitions; got {children!r}")
    return self

  def child_params(self, params: PyTree) -> list[PyTree]:
    """The part of ``params`` (parameters, or a tree in their structure: logical axes) each
    child sees: all of it, unless the definition says otherwise (a group its own leaves)."""
    return [params] * len(self.children())

  def _renewed(self) -> Self:
    """A shallow copy without the caches a definition keeps of itself, for `with_children`."""
    new = copy.copy(self)
    for cached in [k for k in new.__dict__ if k.endswith("_cache")]:
      del new.__dict__[cached]
    return new

  def current_hyper_params(self, state: OptimizerState) -> dict[str, jax.Array]:
    """The hyper-parameters the next step takes unless overridden, as a flat
    dict of scalar arrays: schedules evaluated at ``state.step``, numbers as
    they are; flags and other static settings are left out. A
    `MultiOptimizer`'s are per group (``'0/learning_rate'``). Traceable: inside
    ``jit`` a schedule's value changes with the step without a recompile.
    ``state`` may also be the optax state of a wrapped optax definition's
    ``as_optax()`` (a TrainState's ``opt_state``): its ``count`` is the step.

    Example:
      >>> import optax
      >>> import optcore
      >>> opt_def = optcore.adam(optax.linear_schedule(1.0, 0.0, 10))
      >>> opt_def.current_hyper_params(opt_def.init_state({'w': optax.tree.zeros_like(1.0)}))[
      ...     'learning_rate']
      Array(1., dtype=float32)
    """
    return current_values(self.hyper_params, _step_of(self, state))

  def leaf_hyper_params(self, state: OptimizerState, params: PyTree) -> dict[str, jax.Array]:
    """The rates a parameter takes where they differ from `current_hyper_params`' (what
    `optcore.multipliers` sets per parameter), keyed ``'<path>/<name>'``: none for a definition
    whose parameters share theirs. `optcore.current_hyper_params` adds them where it knows the
    parameters."""
    del state, params
    return {}

  def keeps_ema(self) -> bool:
    """Whether this definition (or one it wraps, or one of its groups) keeps a moving average
    of the parameters (`optcore.ema`)."""
    return False

  def ema_params(self, state: OptimizerState) -> PyTree:
    """The moving average of the parameters that `ema` keeps in ``state``.

    Raises TypeError for a definition that keeps none (wrap it: ``optcore.ema(opt_def)``).
    """
    if self.groups_parameters:  # ema keeps parameter-shaped state, which grouped cannot
      raise TypeError(
        f"{self.display_name()} keeps no moving average of the parameters, and a grouped "
        "definition cannot keep one (its parameters live in buffers of its own layout): use "
        f"the ungrouped definition in optcore.ema({getattr(self, 'optimizer_def', self)!r}, "
        "decay=0.999)"
      )
    raise TypeError(
      f"{self.display_name()} keeps no moving average of the parameters: wrap the definition, "
      f"optcore.ema({self!r}, decay=0.999), to keep one"
    )

  def display_name(self) -> str:
    """The name errors and warnings use: the class's, or the optax alias it wraps."""
    return type(self).__name__

  def extra_arg_names(self) -> frozenset[str] | None:
    """The optax extra update arguments (``value``, ``grad``, ``value_fn``, ...) this
    definition reads: none for an algorithm of its own; None for "whatever it is given, using
    what it reads and ignoring the rest", as optax's transformations do (a wrapped optax
    transformation). ``as_optax().update`` passes a definition what it reads and drops the
    rest, as an optax chain's members ignore what they do not use.

    Returns:
      The names, or None for any.

    Example:
      >>> import optcore
      >>> optcore.legacy.Momentum(0.1).extra_arg_names()
      frozenset()
      >>> optcore.sgd(0.1).extra_arg_names() is None
      True
    """
    return frozenset()

  def overridable_names(self) -> frozenset[str]:
    """The names `update_hyper_params` accepts as keyword overrides.

    Returns:
      The names `update_hyper_params` (and every step's keyword overrides) accept.

    Example:
      >>> import optcore
      >>> sorted(optcore.legacy.Momentum(0.1).overridable_names())
      ['beta', 'learning_rate', 'nesterov', 'weight_decay']
    """
    return frozenset(self.hyper_params)

  def update_hyper_params(self, **hyper_param_overrides: Any) -> HyperParams:
    """The hyper-parameters for one step, with overrides.

    Args:
      **hyper_param_overrides: ``hyper_params=`` replaces them all; any other
        keyword (``learning_rate=lr``) replaces one (arrays and traced values
        included: no recompile per value).

    Returns:
      A `HyperParams`.

    Raises:
      TypeError: a name the definition does not have (the message lists
        `overridable_names`), or an override the definition refuses.

    Example:
      >>> import optcore
      >>> optcore.adam(1e-3).update_hyper_params(learning_rate=1e-4).learning_rate
      0.0001
    """
    return overrides.resolve(self, **hyper_param_overrides)

  def create(self, target: PyTree, focus: Any = None) -> Optimizer:
    """An `Optimizer` over ``target`` with its initial state.

    Args:
      target: the parameters to optimise.
      focus: optional, any selector (see `selector_mask`): only the selected
        leaves are optimised, as in flax.optim; the definition becomes
        ``MultiOptimizer((focus, self))`` and the other leaves stay frozen.

    Returns:
      An `Optimizer` at step 0.

    Raises:
      TypeError: a parameter is not a floating array (named by its path).
      optcore.SelectorError: ``focus`` is not a selector, or selects nothing.

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore
      >>> params = {'kernel': jnp.ones(2), 'bias': jnp.zeros(2)}
      >>> opt = optcore.adam(1e-2).create(params, focus=r'kernel')
      >>> opt = opt.apply_gradient({'kernel': jnp.ones(2), 'bias': jnp.ones(2)})
      >>> opt.target['bias']  # frozen
      Array([0., 0.], dtype=float32)
    """
    if focus is not None:
      # The one cycle in the core, as in flax.optim's own base module: focus is a
      # MultiOptimizer, which is a definition.
      from optcore._src.definitions.multi_optimizer import MultiOptimizer

      return MultiOptimizer((focus, self)).create(target)
    return Optimizer(self, self.init_state(target), target)

  def replicated(self, devices: Sequence[Any], axis_name: str = "batch") -> OptimizerDef:
    """This definition under a `ReplicatedOptimizer` (`Optimizer.replicate`)."""
    return ReplicatedOptimizer(self, devices, axis_name)

  def unreplicated(self) -> OptimizerDef | None:
    """The definition `replicated` wrapped; None for one it did not make."""
    return None

  def __repr__(self) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in self.hyper_params.items())
    return f"{type(self).__name__}({inner})"


def step_count(state: Any) -> Any:
  """The number of updates a state has taken, by one rule for every face: an `OptimizerState`'s
  step; else, for the raw optax state of a wrapped optax definition (an ``as_optax()`` state, a
  Treex optimizer's), the count of its schedule's own ``scale_by_schedule``, else the largest
  of its ``count`` leaves (one that cycles, as ``apply_every``'s 0, 1, 0, ..., is never the
  largest); None where it keeps no count (plain sgd).

  Args:
    state: an `OptimizerState` or an optax state.

  Returns:
    A scalar integer array, or None.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from optcore import adapter
    >>> tx = optax.chain(optax.apply_every(2), optax.adam(0.1))
    >>> state, params = tx.init({'w': jnp.ones(2)}), {'w': jnp.ones(2)}
    >>> for _ in range(3):
    ...   _, state = tx.update(params, state, params)
    >>> int(adapter.step_count(state))
    3
  """
  if isinstance(state, OptimizerState):
    return state.step
  is_scheduled = lambda x: isinstance(x, optax.ScaleByScheduleState)
  scheduled = [x for x in jax.tree.leaves(state, is_leaf=is_scheduled) if is_scheduled(x)]
  if scheduled:
    return scheduled[0].count
  counts = [c for _, c in optax.tree_utils.tree_get_all_with_path(state, "count")]
  if not counts:
    return None
  return functools.reduce(jnp.maximum, counts[1:], counts[0])


def _step_of(optimizer_def: OptimizerDef, state: Any) -> Any:
  """`step_count` of ``state``, or zero for a definition of constants only."""
  step = step_count(state)
  if step is not None:
    return step
  if not _has_schedule(optimizer_def.hyper_params):
    return jnp.zeros((), jnp.int32)  # constants only: no step to read (sgd's state is empty)
  raise TypeError(
    f"{optimizer_def.display_name()}: found no step count in {type(state).__name__}; pass "
    "the optimizer's OptimizerState (opt.state, or the opt_state of its as_optax())"
  )


def _has_schedule(hyper_params: Any) -> bool:
  """Whether any hyper-parameter (a MultiOptimizer's groups' included) is a schedule."""
  groups = hyper_params if isinstance(hyper_params, list) else [hyper_params]
  return any(is_schedule(v, k) for hp in groups for k, v in dict(hp.items()).items())


def _register_static(cls: type) -> None:
  """Registers a definition class as a pytree with no leaves (all static)."""
  jax.tree_util.register_pytree_node(cls, lambda d: ((), d), lambda d, _: d)


_register_static(OptimizerDef)


class ReplicatedOptimizer(OptimizerDef):
  """flax.optim's data-parallel definition, which `Optimizer.replicate` puts
  around the replicated optimizer's own: inside ``jax.pmap(...,
  axis_name=axis_name)`` each step first averages the gradients across the
  replicas. Its state dict holds one copy; a restore replicates it again.
  Deprecated in flax.optim in favour of ``jax_utils.replicate`` and an
  explicit ``lax.pmean``, and kept here for the programs that still call it.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.legacy.GradientDescent(0.1).create({'w': jnp.ones(2)}).replicate()
    >>> type(opt.optimizer_def).__name__, opt.target['w'].shape[0] == jax.local_device_count()
    ('ReplicatedOptimizer', True)
    >>> grads = {'w': jnp.ones((jax.local_device_count(), 2))}
    >>> opt = jax.pmap(lambda o, g: o.apply_gradient(g), axis_name='batch')(opt, grads)
    >>> opt.unreplicate().target['w']
    Array([0.9, 0.9], dtype=float32)
  """

  def __init__(
    self,
    optimizer_def: OptimizerDef,
    devices: Sequence[Any] | None = None,
    axis_name: str = "batch",
  ):
    super().__init__(optimizer_def.hyper_params)
    self.optimizer_def = optimizer_def
    self.devices = list(devices or jax.local_devices())
    self.axis_name = axis_name
    self.per_parameter_state = optimizer_def.per_parameter_state
    self.legacy_state_dicts = optimizer_def.legacy_state_dicts

  def init_state(self, params: PyTree) -> OptimizerState:
    return self.optimizer_def.init_state(params)

  def unreplicated(self) -> OptimizerDef:
    return self.optimizer_def

  def children(self) -> tuple[OptimizerDef, ...]:
    return (self.optimizer_def,)

  def with_children(self, children: tuple[OptimizerDef, ...]) -> OptimizerDef:
    (inner,) = children
    return ReplicatedOptimizer(inner, self.devices, self.axis_name)

  def update_hyper_params(self, **hyper_param_overrides: Any) -> Any:
    return self.optimizer_def.update_hyper_params(**hyper_param_overrides)

  def apply_gradient(self, hyper_params, params, state, grads, **extra_args):
    mean = lambda g: jax.lax.psum(g, self.axis_name) / jax.lax.psum(1, self.axis_name)
    grads = jax.tree.map(mean, grads)
    return self.optimizer_def.apply_gradient(hyper_params, params, state, grads, **extra_args)

  def state_dict(self, target: PyTree, state: OptimizerState) -> dict[str, Any]:
    return jax.tree.map(lambda x: x[0], self.optimizer_def.state_dict(target, state))

  def restore_state(self, target, state, state_dict):
    # Read one copy against the first replica, then replicate what was read.
    first = lambda tree: jax.tree.map(lambda x: x[0], tree)
    one_target, one_state = self.optimizer_def.restore_state(
      first(target), first(state), state_dict
    )
    return replicated((one_target, one_state), self.devices)

  def _static_key(self) -> tuple:
    return (type(self), self.optimizer_def, tuple(map(id, self.devices)), self.axis_name)

  def __repr__(self) -> str:
    return f"ReplicatedOptimizer({self.optimizer_def!r}, axis_name={self.axis_name!r})"
