"""The optimizer definition, its state, and the immutable Optimizer container.

The API is flax.optim's (v0.5.3) and T5X's: an `OptimizerDef` holds the
algorithm and its hyper-parameters, an `OptimizerState` holds the step and the
per-parameter state, and an `Optimizer` ties a definition, a state and the
parameters (the target) together. All three pass through `jax.jit`; the
definition is static data, so the same configuration never retraces.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from optcore._src import paths, serialization
from optcore._src.hyper_params import HyperParams, check_override

PyTree = Any
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class OptimizerState:
  """The state of an optimizer: the step count and the per-parameter states.

  Attributes:
    step: int32 scalar, the number of updates applied so far.
    param_states: for a per-parameter definition, a tree shaped like the
      parameters; for a wrapped optax optimizer, the optax state as optax
      lays it out.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> state = optcore.sgd(0.1, momentum=0.9).init_state({'w': jnp.zeros(2)})
    >>> int(state.step), type(state.param_states[0]).__name__
    (0, 'TraceState')
    >>> state.replace(step=state.step + 1).step
    Array(1, dtype=int32)
  """

  step: jax.Array
  param_states: PyTree

  def replace(self, **changes: Any) -> OptimizerState:
    return dataclasses.replace(self, **changes)


jax.tree_util.register_dataclass(
  OptimizerState, data_fields=["step", "param_states"], meta_fields=[]
)


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
    params_flat, treedef = jax.tree.flatten(params)
    states_flat = treedef.flatten_up_to(state.param_states)
    grads_flat = treedef.flatten_up_to(grads)
    out = [
      self.apply_param_gradient(state.step, hyper_params, p, s, g)
      for p, s, g in zip(params_flat, states_flat, grads_flat, strict=True)
    ]
    new_params = treedef.unflatten([p for p, _ in out])
    new_states = treedef.unflatten([s for _, s in out])
    return new_params, OptimizerState(state.step + 1, new_states)

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
    hyper_params = hyper_param_overrides.pop("hyper_params", self.hyper_params)
    ignored = sorted(set(hyper_param_overrides) & set(self.constructor_only))
    if ignored:
      warnings.warn(
        f"{self.display_name()}: the override(s) {ignored} have no effect: the original "
        f"algorithm reads them from the constructor only, and so does optcore, to keep its "
        f"numbers. Build a new definition with {ignored[0]}=... to change it.",
        UserWarning,
        stacklevel=3,
      )
    if hyper_param_overrides:
      try:
        replaced = hyper_params.replace(**hyper_param_overrides)
      except TypeError as e:
        raise TypeError(f"{self!r}: {e}") from None
      for name, value in hyper_param_overrides.items():
        check_override(self.display_name(), name, hyper_params[name], value)
      hyper_params = replaced
    return hyper_params

  def create(self, target: PyTree, focus: Any = None) -> Optimizer:
    """An `Optimizer` over ``target`` with its initial state.

    With ``focus`` (any selector, see `selector_mask`) only the selected
    leaves are optimised, as in flax.optim: the definition becomes
    ``MultiOptimizer((focus, self))`` and the other leaves stay frozen.
    """
    if focus is not None:
      from optcore._src.multi_optimizer import MultiOptimizer  # here: it imports this module

      return MultiOptimizer((focus, self)).create(target)
    return Optimizer(self, self.init_state(target), target)

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

    def init_fn(params: PyTree) -> OptimizerState:
      return self.init_state(paths.unbox(params))

    def update_fn(updates: PyTree, state: OptimizerState, params: PyTree = None, **extra_args):
      del extra_args
      if params is None:
        raise ValueError(
          f"{self!r}.as_optax() computes new parameters, so it needs them: call "
          "tx.update(grads, state, params)."
        )
      new_params, new_state = self.apply_gradient(self.hyper_params, params, state, updates)
      return jax.tree.map(lambda new, old: new - old, new_params, params), new_state

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)

  def derive_logical_axes(self, optimizer: Optimizer, param_logical_axes: PyTree) -> Optimizer:
    """The logical axes of ``optimizer``: an Optimizer of the same structure
    whose leaves are `PartitionSpec`s (None where the state has None).

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
    from optcore._src import partition_rules  # here: the rules import this module's users

    axes = partition_rules.normalize_param_axes(optimizer.target, param_logical_axes)
    state_axes = self.derive_param_states_axes(optimizer.state.param_states, optimizer.target, axes)
    return Optimizer(self, OptimizerState(PartitionSpec(), state_axes), axes)

  def derive_shardings(
    self,
    optimizer: Optimizer,
    param_logical_axes: PyTree,
    mesh: jax.sharding.Mesh,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
  ) -> Optimizer:
    """An Optimizer-shaped tree of `NamedSharding`s on ``mesh``: the logical
    axes of `derive_logical_axes`, mapped by Flax-style ``logical_axis_rules``
    (None: the axes already name mesh axes). Use it as a jitted step's in and
    out shardings.

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
    from optcore._src import sharding

    axes = self.derive_logical_axes(optimizer, param_logical_axes)
    shardings = sharding.logical_to_mesh_sharding(axes, mesh, logical_axis_rules)
    sharding.check_divisible(optimizer, shardings)  # named here, not in device_put's error
    return shardings

  def create_sharded(
    self,
    target: PyTree,
    param_logical_axes: PyTree,
    mesh: jax.sharding.Mesh,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
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
    """

    abstract = jax.eval_shape(self.create, target)
    shardings = self.derive_shardings(abstract, param_logical_axes, mesh, logical_axis_rules)
    return jax.jit(self.create, out_shardings=shardings)(target)

  def derive_param_states_axes(
    self, param_states: PyTree, params: PyTree, params_axes: PyTree
  ) -> PyTree:
    """The axes of ``param_states``, given one full-rank spec per parameter.

    For a per-parameter definition each parameter's state is passed to
    `derive_param_state_axes`; wrapped optax and MultiOptimizer override this.
    """
    treedef = jax.tree.structure(params)
    per_param = [
      self.derive_param_state_axes(param, spec, state)
      for param, spec, state in zip(
        jax.tree.leaves(params),
        treedef.flatten_up_to(params_axes),
        treedef.flatten_up_to(param_states),
        strict=True,
      )
    ]
    return treedef.unflatten(per_param)

  def derive_param_state_axes(self, param: Any, param_axes: PartitionSpec, state: PyTree) -> PyTree:
    """The axes of one parameter's state: a leaf of the parameter's shape gets
    ``param_axes``, a scalar is replicated. Override it for any other leaf
    (a factored accumulator); by default such a leaf raises."""
    from optcore._src import partition_rules

    def leaf_axes(leaf: Any) -> PartitionSpec:
      if tuple(leaf.shape) == tuple(param.shape):
        return param_axes
      if not leaf.shape:
        return PartitionSpec()
      raise partition_rules.PartitionRuleError(
        f"{self!r}: a state leaf of shape {tuple(leaf.shape)} for a parameter of shape "
        f"{tuple(param.shape)} is neither parameter-shaped nor a scalar; override "
        f"{type(self).__name__}.derive_param_state_axes to say which axes it keeps."
      )

    return jax.tree.map(leaf_axes, state)

  def state_dict(self, target: PyTree, state: OptimizerState) -> dict[str, Any]:
    """``{'target': ..., 'state': {'step': ..., 'param_states': ...}}``, Flax's layout."""
    return {
      "target": serialization.to_state_dict(target),
      "state": serialization.to_state_dict(state),
    }

  def restore_state(
    self, target: PyTree, state: OptimizerState, state_dict: Mapping[str, Any]
  ) -> tuple[PyTree, OptimizerState]:
    """Reads a `state_dict` into the structure of ``target`` and ``state``.

    Raises `StateDictError`, naming the path, for a missing or extra key, a
    shape or a dtype that differ; nothing is changed then.
    """
    if not isinstance(state_dict, Mapping) or set(state_dict) != {"target", "state"}:
      found = sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict).__name__
      raise serialization.StateDictError(
        f"an optimizer state dict has exactly the keys ['state', 'target'], found {found}"
      )
    new_target = serialization.from_state_dict(target, state_dict["target"], root="target")
    new_state = serialization.from_state_dict(state, state_dict["state"], root="state")
    return new_target, new_state

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


@dataclasses.dataclass(frozen=True)
class Optimizer(Generic[T]):
  """An optimizer definition bound to its target (the parameters) and state.

  Immutable: `apply_gradient` and `restore_state` return a new Optimizer. A
  pytree whose leaves are the state and the target; the definition is static.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.sgd(learning_rate=0.1).create({'w': jnp.ones(3)})
    >>> step = jax.jit(lambda opt, g, lr: opt.apply_gradient(g, learning_rate=lr))
    >>> opt = step(opt, {'w': jnp.ones(3)}, 0.5)
    >>> opt.target['w']
    Array([0.5, 0.5, 0.5], dtype=float32)
  """

  optimizer_def: OptimizerDef
  state: OptimizerState
  target: T

  def apply_gradient(
    self,
    grads: PyTree,
    *,
    extra_args: Mapping[str, Any] | None = None,
    **hyper_param_overrides: Any,
  ) -> Optimizer[T]:
    """Applies one update with ``grads``; returns the new Optimizer.

    Args:
      grads: gradients in the structure of ``target``.
      extra_args: keyword arguments for the optax update of
        ``GradientTransformationExtraArgs`` optimizers (``value=loss`` for
        polyak_sgd, ``value``/``grad``/``value_fn`` for lbfgs, ...).
      **hyper_param_overrides: hyper-parameter values for this step only,
        e.g. ``learning_rate=lr``; traced values do not cause recompiles.
    """
    check_gradients(self.optimizer_def, self.target, grads)
    hyper_params = self.optimizer_def.update_hyper_params(**hyper_param_overrides)
    new_target, new_state = self.optimizer_def.apply_gradient(
      hyper_params, self.target, self.state, grads, **(extra_args or {})
    )
    return self.replace(target=new_target, state=new_state)

  def compute_gradient(self, loss_fn: Callable[[T], Any]) -> tuple:
    """flax.optim's helper: ``(loss, grad)`` of ``loss_fn(target)``, or
    ``(loss, aux, grad)`` when it returns ``(loss, aux)``."""

    def wrapped(target):
      out = loss_fn(target)
      return (out[0], tuple(out[1:])) if isinstance(out, (tuple, list)) else (out, None)

    (loss, aux), grad = jax.value_and_grad(wrapped, has_aux=True)(self.target)
    if aux is None:
      return loss, grad
    return (loss, *aux, grad)

  compute_gradients = compute_gradient

  def optimize(self, loss_fn: Callable[[T], Any], **hyper_param_overrides: Any) -> tuple:
    """flax.optim's deprecated one-call step: ``(new_optimizer, loss[, aux])``,
    the loss computed before the update."""
    warnings.warn(
      "Optimizer.optimize() is deprecated (as in flax.optim): compute the gradient with "
      "jax.grad or Optimizer.compute_gradient and call apply_gradient.",
      DeprecationWarning,
      stacklevel=2,
    )
    *outputs, grad = self.compute_gradient(loss_fn)
    return (self.apply_gradient(grad, **hyper_param_overrides), *outputs)

  def replicate(self, devices: Sequence[Any] | None = None) -> Optimizer[T]:
    """A copy with a leading device axis, for ``jax.pmap`` (flax.optim's)."""
    devices = list(devices or jax.local_devices())
    mesh = jax.sharding.Mesh(np.array(devices), ("replica",))
    sharding = jax.sharding.NamedSharding(mesh, PartitionSpec("replica"))
    copies = lambda x: jnp.broadcast_to(x, (len(devices), *jnp.shape(x)))
    return jax.tree.map(lambda x: jax.device_put(copies(x), sharding), self)

  def unreplicate(self) -> Optimizer[T]:
    """The first device's copy of a replicated optimizer."""
    return jax.tree.map(lambda x: x[0], self)

  def state_dict(self) -> dict[str, Any]:
    """The state dict in Flax's layout: ``{'target': ..., 'state': ...}``."""
    return self.optimizer_def.state_dict(self.target, self.state)

  def restore_state(self, state_dict: Mapping[str, Any]) -> Optimizer[T]:
    """A new Optimizer holding what ``state_dict`` holds; this one is untouched."""
    target, state = self.optimizer_def.restore_state(self.target, self.state, state_dict)
    return self.replace(target=target, state=state)

  def replace(self, **changes: Any) -> Optimizer[T]:
    return dataclasses.replace(self, **changes)


jax.tree_util.register_dataclass(
  Optimizer, data_fields=["state", "target"], meta_fields=["optimizer_def"]
)


class TreeMismatchError(ValueError):
  """Two trees that should have the same structure do not."""


TreeMismatchError.__module__ = "optcore"


def check_same_structure(reference: PyTree, other: PyTree, what: str) -> None:
  """Raises `TreeMismatchError` naming the first path where ``other`` differs."""
  if jax.tree.structure(reference) == jax.tree.structure(other):
    return
  container = _first_container_difference(reference, other, what, "")
  if container is not None:
    raise TreeMismatchError(container)
  named = lambda tree: {
    "/" + "/".join(names): leaf for names, leaf in paths.leaves_with_names(tree, keep_none=True)[0]
  }
  ref_by_path, other_by_path = named(reference), named(other)
  for name, leaf in ref_by_path.items():
    if leaf is None:
      continue
    if name not in other_by_path:
      raise TreeMismatchError(
        f"{what} has no array at {name!r}, where the parameters have one. Give a gradient for "
        f"every parameter (use jnp.zeros_like for a parameter that gets none)."
      )
    if other_by_path[name] is None:
      raise TreeMismatchError(
        f"{what} has None at {name!r}, where the parameters have an array. Replace None "
        f"gradients with zeros (jnp.zeros_like(param)) or leave that parameter out of the "
        f"optimised tree."
      )
  extra = sorted(set(other_by_path) - set(ref_by_path))
  raise TreeMismatchError(
    f"{what} does not have the structure of the parameters"
    + (f": it has extra entries at {extra[:5]}" if extra else "")
    + f". Expected {jax.tree.structure(reference)}, found {jax.tree.structure(other)}."
  )


def check_gradients(
  optimizer_def: OptimizerDef, params: PyTree, grads: PyTree, what: str = "grads"
) -> None:
  """Raises `TreeMismatchError` naming the path where ``grads`` do not fit
  ``params``: another structure, a None or missing gradient, or a leaf of
  another shape (a (2, 1) gradient for a (2,) parameter would broadcast
  silently). Shapes are static, so under ``jit`` this costs nothing per step.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> params = {'b': jnp.zeros(2)}
    >>> optcore.check_gradients(optcore.adam(1e-2), params, {'b': jnp.ones((2, 1))})
    Traceback (most recent call last):
    ...
    optcore.TreeMismatchError: grads has shape (2, 1) at '/b', where the parameter has shape (2,)...
  """
  check_same_structure(params, grads, what)
  per_example = optimizer_def.per_example_gradients
  named, _ = paths.leaves_with_names(params)
  for (names, param), grad in zip(named, jax.tree.leaves(grads), strict=True):
    want, found = np.shape(param), np.shape(grad)
    fits = found[1:] == want if per_example else found == want
    if not fits:
      expected = f"(examples, {', '.join(map(str, want))})" if per_example else str(want)
      raise TreeMismatchError(
        f"{what} has shape {found} at {'/' + '/'.join(names)!r}, where the parameter has shape "
        f"{want}; expected a gradient of shape {expected}. Pass the gradient of the loss with "
        "respect to this parameter (jax.grad gives each the parameter's shape)."
      )


class MissingHyperParameterError(ValueError, AssertionError):
  """A step without a value the algorithm needs (a learning rate). An
  AssertionError too: flax.optim's algorithms asserted ``'no learning rate provided.'``."""


MissingHyperParameterError.__module__ = "optcore"


def check_learning_rate(optimizer_def: OptimizerDef, hyper_params: Any) -> None:
  """Raises `MissingHyperParameterError` when this step's learning rate is None."""
  if isinstance(hyper_params, Mapping) and hyper_params.get("learning_rate", 0) is None:
    name = optimizer_def.display_name()
    raise MissingHyperParameterError(
      f"no learning rate provided. {name} was built without learning_rate: pass it to the "
      f"constructor ({name}(learning_rate=0.1)) or to each step "
      "(apply_gradient(grads, learning_rate=0.1))."
    )


def check_float_params(params: PyTree) -> None:
  """Raises TypeError naming the first parameter that is not a float (or
  complex) array: an optimizer would turn a step counter 3 into 2.9 or 2."""
  for names, leaf in paths.leaves_with_names(params)[0]:
    dtype = np.result_type(leaf) if not hasattr(leaf, "dtype") else leaf.dtype
    if not jnp.issubdtype(dtype, jnp.inexact):
      raise TypeError(
        f"the parameter at {'/' + '/'.join(names)!r} has dtype {np.dtype(dtype).name}; "
        "optimizers update float (or complex) arrays only. Keep integer leaves (counters, "
        "indices) out of the optimised tree, or leave them unselected: "
        "opt_def.create(params, focus=lambda path, x: jnp.issubdtype(x.dtype, jnp.inexact)) "
        "or a MultiOptimizer group that does not select them."
      )


def _first_container_difference(reference: PyTree, other: PyTree, what: str, path: str):
  """The message for the first node where ``other`` is another kind of container
  (a tuple where the parameters have a dict), or None."""
  ref_hidden, other_hidden = paths.hidden_child(reference), paths.hidden_child(other)
  if ref_hidden is not None or other_hidden is not None:
    ref_child = ref_hidden[0] if ref_hidden is not None else reference
    other_child = other_hidden[0] if other_hidden is not None else other
    return _first_container_difference(ref_child, other_child, what, path)
  ref_split, other_split = paths.children_with_keys(reference), paths.children_with_keys(other)
  if ref_split is None or other_split is None or reference is None or other is None:
    return None
  if type(reference) is not type(other):
    where = path or "/"
    return (
      f"{what} has a {type(other).__name__} at {where!r} where the parameters have a "
      f"{type(reference).__name__}. Pass {what} in the parameters' structure: jax.grad of a "
      "function of the parameters gives it."
    )
  others = {paths.key_name(k): child for k, child in other_split[0]}
  for key, child in ref_split[0]:
    name = paths.key_name(key)
    if name in others:
      found = _first_container_difference(child, others[name], what, f"{path}/{name}")
      if found is not None:
        return found
  return None
