"""The optimizer definition: an algorithm and its hyper-parameters.

The API is flax.optim's (v0.5.3) and T5X's. A definition is static data of
the jitted `Optimizer` (the same configuration never retraces). It holds the
algorithm; the methods users call for overrides, sharding, serialization and
export delegate to the modules that do that work (`overrides`, `state_axes`,
`serialization`, `export`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from optcore._src import export, overrides, paths, serialization, state_axes
from optcore._src.checks import check_float_params, check_learning_rate
from optcore._src.hyper_params import HyperParams, at_step
from optcore._src.optimizer import Optimizer, OptimizerState, replicated

PyTree = Any


class OptimizerDef:
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

  def __init__(self, hyper_params: HyperParams | Mapping[str, Any] | Any):
    if dataclasses.is_dataclass(hyper_params) and not isinstance(hyper_params, type):
      # flax.optim definitions pass a struct dataclass of their hyper-parameters.
      fields = dataclasses.fields(hyper_params)
      hyper_params = {f.name: getattr(hyper_params, f.name) for f in fields}
    if not isinstance(hyper_params, HyperParams):
      hyper_params = HyperParams(**dict(hyper_params))
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
    """The state at step 0 for ``params``."""
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
    """Applies one step; returns ``(new_params, new_state)``."""
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

    Example:
      >>> import jax.numpy as jnp
      >>> from optcore import legacy
      >>> opt_def = legacy.GradientDescent(0.5)
      >>> params = {'w': jnp.ones(2)}
      >>> updates, state = opt_def.compute_updates(
      ...     opt_def.hyper_params, params, opt_def.init_state(params), {'w': jnp.ones(2)})
      >>> updates['w'], int(state.step)
      (Array([-0.5, -0.5], dtype=float32), 1)
    """
    if params is None:
      raise ValueError(f"{self!r} computes new parameters from the old ones: pass params")
    new_params, new_state = self.apply_gradient(hyper_params, params, state, grads, **extra_args)
    return jax.tree.map(lambda new, old: new - old, new_params, params), new_state

  def display_name(self) -> str:
    """The name errors and warnings use: the class's, or the optax alias it wraps."""
    return type(self).__name__

  def overridable_names(self) -> frozenset[str]:
    """The names `update_hyper_params` accepts as keyword overrides.

    Example:
      >>> import optcore
      >>> sorted(optcore.legacy.Momentum(0.1).overridable_names())
      ['beta', 'learning_rate', 'nesterov', 'weight_decay']
    """
    return frozenset(self.hyper_params)

  def update_hyper_params(self, **hyper_param_overrides: Any) -> HyperParams:
    """The hyper-parameters for one step: ``hyper_params=`` replaces them all,
    any other keyword replaces one; an unknown name raises TypeError."""
    return overrides.resolve(self, **hyper_param_overrides)

  def create(self, target: PyTree, focus: Any = None) -> Optimizer:
    """An `Optimizer` over ``target`` with its initial state.

    With ``focus`` (any selector, see `selector_mask`) only the selected
    leaves are optimised, as in flax.optim: the definition becomes
    ``MultiOptimizer((focus, self))`` and the other leaves stay frozen.
    """
    if focus is not None:
      # The one cycle in the core, as in flax.optim's own base module: focus is a
      # MultiOptimizer, which is a definition.
      from optcore._src.multi_optimizer import MultiOptimizer

      return MultiOptimizer((focus, self)).create(target)
    return Optimizer(self, self.init_state(target), target)

  def replicated(self, devices: Sequence[Any], axis_name: str = "batch") -> OptimizerDef:
    """This definition under a `ReplicatedOptimizer` (`Optimizer.replicate`)."""
    return ReplicatedOptimizer(self, devices, axis_name)

  def unreplicated(self) -> OptimizerDef | None:
    """The definition `replicated` wrapped; None for one it did not make."""
    return None

  def as_optax(self) -> optax.GradientTransformationExtraArgs:
    """This definition as an optax transformation, for `flax.training.train_state.TrainState`,
    `flax.nnx.Optimizer` or a plain optax loop.

    Its state is the `OptimizerState`; its updates are ``new_params - params``,
    so ``optax.apply_updates`` lands on the new parameters up to float rounding
    (definitions that wrap optax export their own transformation and are exact).
    Extra update arguments are ignored, as optax transformations that need
    none ignore them.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> import optcore
      >>> class Halve(optcore.OptimizerDef):
      ...   def __init__(self):
      ...     super().__init__(optcore.HyperParams())
      ...   def init_param_state(self, param):
      ...     return ()
      ...   def apply_param_gradient(self, step, hyper_params, param, state, grad):
      ...     return param / 2, state
      >>> tx = Halve().as_optax()
      >>> params = {'w': jnp.array([4.0])}
      >>> updates, state = tx.update(params, tx.init(params), params)
      >>> optax.apply_updates(params, updates)['w'], int(state.step)
      (Array([2.], dtype=float32), 1)
    """

    return export.as_optax(self)

  def derive_logical_axes(self, optimizer: Optimizer, param_logical_axes: PyTree) -> Optimizer:
    """The logical axes of ``optimizer``: an Optimizer of the same structure
    whose leaves are `PartitionSpec` objects (None where the state has None).

    The target gets ``param_logical_axes`` (one spec, tuple of names or None
    per parameter; padded to full rank); every state leaf gets the axes
    derived by the partition rules (see `derive_optax_logical_axes`); the
    step is replicated. ``optimizer`` may be abstract (``jax.eval_shape`` of
    `create`). The result round-trips through `state_dict`/`restore_state`.

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
    return state_axes.optimizer_logical_axes(self, optimizer, param_logical_axes)

  def derive_shardings(
    self,
    optimizer: Optimizer,
    param_logical_axes: PyTree | None = None,
    mesh: jax.sharding.Mesh | None = None,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
    *,
    state_axis: str | None = None,
  ) -> Optimizer:
    """An Optimizer-shaped tree of `NamedSharding` objects on ``mesh``: the logical
    axes of `derive_logical_axes`, mapped by Flax-style ``logical_axis_rules``
    (None: the axes already name mesh axes). Use it as a jitted step's in and
    out shardings. ``param_logical_axes`` None: the parameters are replicated.

    ``state_axis`` (ZeRO-1): every state leaf is also split over that mesh
    axis, on its largest dimension the axis divides and no other axis splits,
    while the parameters keep their own sharding; data-parallel training then
    holds 1/N of the state per device, for one all-gather of the updated
    parameters per step. Leaves it cannot split stay replicated and are logged.

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
    return state_axes.optimizer_shardings(
      self,
      optimizer,
      param_logical_axes,
      state_axes.required_mesh(mesh),
      logical_axis_rules,
      state_axis=state_axis,
    )

  def create_sharded(
    self,
    target: PyTree,
    param_logical_axes: PyTree | None = None,
    mesh: jax.sharding.Mesh | None = None,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
    *,
    state_axis: str | None = None,
  ) -> Optimizer:
    """Like `create`, with the target and every state leaf created sharded on
    ``mesh`` (``jit`` with ``out_shardings``): no device ever holds the
    whole state. Raises `PartitionRuleError` naming the leaf whose dimension
    the mesh does not divide.

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
    """
    return state_axes.create_sharded(
      self,
      target,
      param_logical_axes,
      state_axes.required_mesh(mesh),
      logical_axis_rules,
      state_axis=state_axis,
    )

  def derive_param_states_axes(
    self, param_states: PyTree, params: PyTree, params_axes: PyTree
  ) -> PyTree:
    """The axes of ``param_states``, given one full-rank spec per parameter.

    For a per-parameter definition each parameter's state is passed to
    `derive_param_state_axes`; wrapped optax and MultiOptimizer override this.
    """
    return state_axes.per_parameter_states_axes(self, param_states, params, params_axes)

  def derive_param_state_axes(self, param: Any, param_axes: PartitionSpec, state: PyTree) -> PyTree:
    """The axes of one parameter's state: a leaf of the parameter's shape gets
    ``param_axes``, a scalar is replicated. Override it for any other leaf
    (a factored accumulator); by default such a leaf raises."""
    return state_axes.parameter_or_scalar_axes(self, param, param_axes, state)

  def state_dict(self, target: PyTree, state: OptimizerState) -> dict[str, Any]:
    """``{'target': ..., 'state': {'step': ..., 'param_states': ...}}``, Flax's layout."""
    return serialization.optimizer_state_dict(target, state)

  def restore_state(
    self, target: PyTree, state: OptimizerState, state_dict: Mapping[str, Any]
  ) -> tuple[PyTree, OptimizerState]:
    """Reads a `state_dict` into the structure of ``target`` and ``state``.

    Raises `StateDictError`, naming the path, for a missing or extra key, a
    shape or a dtype that differ; nothing is changed then. With
    `legacy_state_dicts` (flax.optim's interface), keys beside ``'target'``
    and ``'state'`` are ignored and 64-bit NumPy values restore into their
    32-bit state leaves, as in flax.optim and T5X.

    Example:
      >>> import numpy as np, jax.numpy as jnp
      >>> from optcore import legacy
      >>> opt = legacy.Momentum(0.1).create({'w': jnp.zeros(2)})
      >>> state_dict = opt.state_dict()
      >>> state_dict['state']['step'] = np.int64(7)  # as T5X's replace_step writes it
      >>> state_dict['flax_mutables'] = {}  # as T5X's train state passes it
      >>> opt.restore_state(state_dict).state.step
      array(7, dtype=int32)
    """
    return serialization.restore_optimizer_state(
      target, state, state_dict, legacy=self.legacy_state_dicts
    )

  # Definitions are static data of jitted pytrees: equal configs, equal defs.

  def _static_key(self) -> tuple:
    return (type(self), self.hyper_params)

  def _cached_key(self) -> tuple:
    # jit hashes and compares the definition on every call: compute the key once.
    key = self.__dict__.get("_key_cache")
    if key is None:
      key = self.__dict__["_key_cache"] = (self._static_key(), hash(self._static_key()))
    return key

  def __eq__(self, other: object) -> bool:
    if self is other:
      return True
    if not isinstance(other, OptimizerDef):
      return NotImplemented
    return self._cached_key() == other._cached_key()

  def __hash__(self) -> int:
    return self._cached_key()[1]

  def __repr__(self) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in self.hyper_params.items())
    return f"{type(self).__name__}({inner})"


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
