"""Treex's Optimizer on treeo, over any optcore configuration."""

from __future__ import annotations

import typing as tp
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import treeo as to
from jax.sharding import Mesh

import optcore
from optcore import adapter

PyTree = tp.Any


class Optimizer(to.Tree):
  """Treex's ``Optimizer``: an optax transformation or optcore config as a treeo Tree.

  ``init(params)`` returns a new, initialised optimizer (this one stays
  uninitialised); ``update(grads, params)`` replaces this optimizer's state
  and returns the new parameters (or the updates, with
  ``apply_updates=False``). Under ``jax.jit`` return the optimizer from the
  jitted function to keep its new state.

  As in Treex, the optimizer's pytree leaves are exactly the optax state's
  leaves, in optax's order (``jax.tree_util.tree_leaves(optimizer)`` equals
  ``tree_leaves(tx.init(params))``). Unlike Treex, that state keeps the
  parameters' structure (not a flat list), so selectors and checkpoints see
  real paths. A definition that needs the step count (flax.optim's algorithms,
  T5X's Adafactor) keeps it as one more leaf, after the state's.

  Args:
    optimizer: an optax ``GradientTransformation`` or any `optcore.OptimizerDef`.

  Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> import optcore_treex
    >>> params = {'w': jnp.ones(2)}
    >>> optimizer = optcore_treex.Optimizer(optax.adam(0.5)).init(params)
    >>> @jax.jit
    ... def train_step(params, optimizer):
    ...   grads = jax.grad(lambda p: jnp.sum(p['w'] ** 2))(params)
    ...   params = optimizer.update(grads, params)
    ...   return params, optimizer
    >>> params, optimizer = train_step(params, optimizer)
    >>> params['w'].round(4), int(optimizer.state.step)
    (Array([0.5, 0.5], dtype=float32), 1)
    >>> len(jax.tree_util.tree_leaves(optimizer)) == len(
    ...     jax.tree_util.tree_leaves(optax.adam(0.5).init(params)))
    True
  """

  opt_state: tp.Any = to.field(None, node=True)
  # None (no leaf) for optax transformations, whose state carries its own counts.
  step: jax.Array | None = to.field(None, node=True)
  optimizer_def: optcore.OptimizerDef = to.field(node=False)
  n_leaves: int | None = to.field(None, node=False)
  # The parameters' shapes at init, in leaf order: later params and grads must match them.
  param_shapes: tuple | None = to.field(None, node=False)

  def __init__(self, optimizer: tp.Any):
    self.optimizer_def = adapter.as_definition(optimizer, "optcore_treex.Optimizer")
    self.opt_state = None
    self.step = None
    self.n_leaves = None
    self.param_shapes = None

  @property
  def initialized(self) -> bool:
    return self.n_leaves is not None

  @property
  def state(self) -> optcore.OptimizerState:
    """The state as the core holds it: ``OptimizerState(step, opt_state)``.

    For an optax transformation the step is read from optax's own ``count``
    (adam's, a schedule's); it is None where the state has none (plain sgd).
    """
    self._check_initialized()
    return optcore.OptimizerState(self._step(), self.opt_state)  # pyright: ignore[reportArgumentType]  # None: no count kept

  def current_hyper_params(self) -> dict[str, jax.Array]:
    """The hyper-parameters the next `update` takes unless overridden, for
    logging: a flat dict of scalar arrays, schedules evaluated at this step
    (see `optcore.OptimizerDef.current_hyper_params`); works inside ``jit``.

    Returns:
      ``{name: scalar array}``: ``'learning_rate'``, ``'0/learning_rate'`` per group, ...

    Example:
      >>> import jax.numpy as jnp, optax
      >>> import optcore, optcore_treex
      >>> params = {'w': jnp.zeros(1)}
      >>> optimizer = optcore_treex.Optimizer(optcore.sgd(optax.exponential_decay(1.0, 1, 0.5)))
      >>> optimizer = optimizer.init(params)
      >>> params = optimizer.update({'w': jnp.ones(1)}, params)
      >>> optimizer.current_hyper_params()
      {'learning_rate': Array(0.5, dtype=float32)}
    """
    self._check_initialized()
    return optcore.current_hyper_params(self)

  @property
  def ema_params(self) -> PyTree:
    """The moving average of the parameters an `optcore.ema` definition keeps,
    in the structure of the parameters given to `init`; TypeError for any
    other definition.

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore, optcore_treex
      >>> params = {'w': jnp.zeros(1)}
      >>> optimizer = optcore_treex.Optimizer(optcore.ema(optcore.sgd(1.0), decay=0.5))
      >>> optimizer = optimizer.init(params)
      >>> params = optimizer.update({'w': jnp.ones(1)}, params)
      >>> params['w'], optimizer.ema_params['w']
      (Array([-1.], dtype=float32), Array([-0.5], dtype=float32))
    """
    return optcore.ema_params(self)

  def eval_params(self, params: PyTree) -> PyTree:
    """``params`` at the point a schedule-free definition
    (``optcore.contrib.schedule_free_adamw``, ...) evaluates, in their structure (see
    `optcore.eval_params`); TypeError for any other definition.

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore, optcore_treex
      >>> params = {'w': jnp.zeros(1)}
      >>> optimizer = optcore_treex.Optimizer(optcore.contrib.schedule_free_sgd(0.1, b1=0.5))
      >>> optimizer = optimizer.init(params)
      >>> for g in (1.0, 3.0):
      ...   params = optimizer.update({'w': jnp.full(1, g)}, params)
      >>> params['w'], optimizer.eval_params(params)['w'].round(4)
      (Array([-0.325], dtype=float32), Array([-0.25], dtype=float32))
    """
    return optcore.eval_params(self, params)

  def init(self, params: PyTree) -> Optimizer:
    """A new optimizer initialised for ``params``; this one is not changed.

    Args:
      params: the parameters (any pytree: a dict, a treeo Tree's filtered fields).

    Returns:
      The initialised optimizer.

    Raises:
      TypeError: a parameter that is not a floating array (named by its path).

    Example:
      >>> import jax.numpy as jnp, optax
      >>> import optcore_treex
      >>> optimizer = optcore_treex.Optimizer(optax.sgd(0.1)).init({'w': jnp.ones(2)})
      >>> optimizer.initialized
      True
    """
    module = to.copy(self)
    state = self.optimizer_def.init_state(params)
    module.opt_state = state.param_states
    module.step = None if self._optax_counts_steps() else state.step
    module.n_leaves = len(jax.tree.leaves(params))
    module.param_shapes = tuple(tuple(jnp.shape(x)) for x in jax.tree.leaves(params))
    return module

  def update(
    self,
    grads: PyTree,
    params: PyTree | None = None,
    apply_updates: bool = True,
    *,
    extra_args: tp.Mapping[str, tp.Any] | None = None,
    **hyper_param_overrides: tp.Any,
  ) -> PyTree:
    """Updates this optimizer's state; returns the new params, or the updates.

    Keyword arguments override hyper-parameters for this step
    (``learning_rate=lr``), an optcore addition to Treex's API.

    Args:
      grads: the gradients, in the parameters' structure.
      params: the parameters (needed with ``apply_updates=True``).
      apply_updates: False: return optax-style updates instead.
      extra_args: optax's extra update arguments (``{"value": loss}`` for ``polyak_sgd`` or
        ``optcore.skip_bad_steps(..., watch="loss")``), as the other faces take them.
      **hyper_param_overrides: values for this step only.

    Returns:
      The new parameters, or the updates.

    Raises:
      RuntimeError: the optimizer is not initialised.
      ValueError: ``params`` is missing with ``apply_updates=True``, or the
        number of leaves differs from ``init``'s.
      optcore.TreeMismatchError: ``grads`` and ``params`` differ in structure.

    A failed update leaves the state as it was.

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore, optcore_treex
      >>> params = {'w': jnp.ones(2)}
      >>> optimizer = optcore_treex.Optimizer(optcore.sgd(0.1)).init(params)
      >>> optimizer.update({'w': jnp.ones(2)}, params, learning_rate=0.5)['w']
      Array([0.5, 0.5], dtype=float32)
    """
    if not self.initialized:
      raise RuntimeError(
        "Optimizer is not initialized: use optimizer = optimizer.init(params) first (init "
        "returns a new optimizer)"
      )
    if apply_updates and params is None:
      raise ValueError("params must be provided if apply_updates is True")
    if params is not None:  # first: it names the path of a None or misshapen gradient
      optcore.check_gradients(self.optimizer_def, params, grads)
    for name, tree in (("params", params), ("grads", grads)):  # Treex's own errors
      if tree is not None and len(jax.tree.leaves(tree)) != self.n_leaves:
        raise ValueError(
          f"{name} must have length {self.n_leaves}, got {len(jax.tree.leaves(tree))}"
        )
      if tree is not None and not self.optimizer_def.per_example_gradients:
        self._check_init_shapes(name, tree)
    # The step a definition reads; optax transformations read none (they count in their state).
    step = jnp.zeros((), jnp.int32) if self.step is None else self.step
    output, new_state = adapter.step(
      self.optimizer_def,
      params,
      optcore.OptimizerState(step, self.opt_state),
      grads,
      extra_args=extra_args,
      apply_updates=apply_updates,
      **hyper_param_overrides,
    )
    self.opt_state = new_state.param_states
    if self.step is not None:
      self.step = new_state.step
    return output

  def state_dict(self) -> dict[str, tp.Any]:
    """``{'state': {'step': ..., 'param_states': ...}}``, the core's layout.

    The step is the definition's own, or optax's ``count`` for a
    transformation that keeps one; a transformation with no count (plain
    sgd) has no step to write, and its state dict has ``param_states`` only:
    it restores in this face, and in the others after adding ``'step'``.

    Returns:
      ``{'state': {'step': ..., 'param_states': ...}}``.

    Raises:
      RuntimeError: the optimizer is not initialised.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> import optcore_treex
      >>> optimizer = optcore_treex.Optimizer(optax.adam(0.1)).init({'w': jnp.ones(2)})
      >>> sorted(optimizer.state_dict()['state'])
      ['param_states', 'step']
    """
    self._check_initialized()
    return adapter.state_dict(self.optimizer_def, self.state)

  def restore_state(self, state_dict: Mapping[str, tp.Any]) -> Optimizer:
    """A new optimizer holding ``state_dict['state']`` (this adapter's, the
    core's or Flax's layout); this one is untouched. The step of a core or
    Flax checkpoint is read where this optimizer keeps one; an optax
    transformation's counts are in its state.

    Args:
      state_dict: this adapter's state dict, or a core/Flax/Equinox one's.

    Returns:
      The restored optimizer.

    Raises:
      RuntimeError: the optimizer is not initialised.
      optcore.StateDictError: a key, shape or dtype that differs (named by its path).

    Example:
      >>> import jax.numpy as jnp, optax
      >>> import optcore_treex
      >>> params = {'w': jnp.ones(2)}
      >>> optimizer = optcore_treex.Optimizer(optax.adam(0.1)).init(params)
      >>> saved = optimizer.state_dict()
      >>> params = optimizer.update({'w': jnp.ones(2)}, params)
      >>> int(optimizer.restore_state(saved).state.step)
      0
    """
    self._check_initialized()
    reference = optcore.OptimizerState(self.step, self.opt_state)  # pyright: ignore[reportArgumentType]  # a None step is not read
    state = adapter.restore_state(self.optimizer_def, reference, state_dict)
    module = to.copy(self)
    module.opt_state = state.param_states
    module.step = state.step
    return module

  def transplant(
    self, state_dict: Mapping[str, tp.Any], params: PyTree | None = None
  ) -> tuple[Optimizer, optcore.TransplantReport]:
    """A new optimizer holding what ``state_dict`` still has for its state (same
    parameter, role and shape), the rest as this one holds it; and a report
    (see `optcore.transplant`). This one is untouched.

    Args:
      state_dict: any face's state dict, or an old flax.optim or T5X checkpoint's.
      params: the parameters this optimizer was initialised for (their paths
        locate each state leaf's parameter).

    Returns:
      ``(new_optimizer, report)``.

    Raises:
      RuntimeError: the optimizer is not initialised.
      TypeError: no ``params``.
      optcore.StateDictError: ``state_dict`` has no ``'state'`` dict.

    Example:
      >>> import jax.numpy as jnp, optax
      >>> import optcore, optcore_treex
      >>> params = {'w': jnp.ones(2)}
      >>> old = optcore.adam(0.1).create(params)
      >>> optimizer = optcore_treex.Optimizer(optax.adamw(0.1)).init(params)
      >>> optimizer, report = optcore.transplant(optimizer, old.state_dict(), params)
      >>> [entry.path for entry in report.kept]
      ['param_states/0/count', 'param_states/0/mu/w', 'param_states/0/nu/w']
    """
    self._check_initialized()
    if params is None:
      raise TypeError(
        "optcore_treex.Optimizer.transplant needs the parameters (it does not hold them): "
        "optcore.transplant(optimizer, state_dict, params)."
      )
    reference = optcore.OptimizerState(self.step, self.opt_state)  # pyright: ignore[reportArgumentType]  # a None step is not read
    state, report = adapter.transplant_state(self.optimizer_def, params, reference, state_dict)
    module = to.copy(self)
    module.opt_state = state.param_states
    module.step = state.step
    return module, report

  def shardings(
    self,
    params: PyTree,
    param_specs: PyTree | None = None,
    mesh: Mesh | optcore.Placement | None = None,
    logical_axis_rules: Sequence[tuple[str, tp.Any]] | None = None,
    **placement: tp.Unpack[adapter.StatePlacement],
  ) -> Optimizer:
    """This optimizer's structure with a `NamedSharding` at every leaf (the
    optax state's, and the step where it keeps one).

    ``param_specs``: one `PartitionSpec` per parameter (mesh axes, or logical
    names mapped by ``logical_axis_rules``); None: the parameters are
    replicated. ``state_axis`` (ZeRO-1) also splits every state leaf over that
    mesh axis, as `optcore.OptimizerDef.derive_shardings` does;
    ``state_memory_kind="pinned_host"`` keeps every non-scalar state array in
    host memory between steps (each `update` brings it to the device and
    back). Use it as a jitted step's in and out shardings, or `shard`.

    Args:
      params: the parameters given to `init`.
      param_specs: a `PartitionSpec` per optimised leaf (mesh axes, or logical names
        mapped by ``logical_axis_rules``); None: replicated.
      mesh: the device mesh.
      logical_axis_rules: ``(logical_name, mesh_axes)`` pairs.
      **placement: ``state_axis=`` (ZeRO-1), ``state_memory_kind=`` (host memory): see
        `optcore.Placement`, which ``mesh`` may be instead.

    Returns:
      This optimizer's structure with a `NamedSharding` at every leaf.

    Raises:
      RuntimeError: the optimizer is not initialised.
      optcore.PartitionRuleError: a dimension the mesh does not divide (named by path).
      TypeError: no mesh.

    Example:
      >>> import jax, jax.numpy as jnp, numpy as np, optax
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> import optcore_treex
      >>> params = {'w': jnp.zeros((4, 2))}
      >>> optimizer = optcore_treex.Optimizer(optax.adam(1e-3)).init(params)
      >>> mesh = Mesh(np.array(jax.devices()[:1]), ('model',))
      >>> shardings = optimizer.shardings(params, {'w': P('model', None)}, mesh)
      >>> shardings.opt_state[0].mu['w'].spec == P('model', None)
      True
    """
    self._check_initialized()
    step = jnp.zeros((), jnp.int32) if self.step is None else self.step
    shardings = adapter.state_shardings(
      self.optimizer_def,
      optcore.OptimizerState(step, self.opt_state),
      params,
      param_specs,
      mesh,
      logical_axis_rules,
      **placement,
    )
    module = to.copy(self)
    module.opt_state = shardings.param_states
    module.step = None if self.step is None else shardings.step
    return module

  shard = adapter.shard_method(
    shardings,
    jax.device_put,
    """A new optimizer with its state placed by `shardings`; this one is untouched.

  Args:
    params: the parameters given to `init`.
    param_specs, mesh, logical_axis_rules: as `shardings` reads them.
    **placement: as `shardings` reads it.

  Returns:
    The optimizer, its state on the mesh.

  Raises:
    RuntimeError: the optimizer is not initialised.
    optcore.PartitionRuleError: a dimension the mesh does not divide (named by path).
    TypeError: no mesh.

  Example (ZeRO-1: replicated parameters, the state split over ``'data'``):
    >>> import jax, jax.numpy as jnp, numpy as np, optax
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> import optcore_treex
    >>> params = {'w': jnp.ones((4, 2))}
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ('data',))
    >>> optimizer = optcore_treex.Optimizer(optax.adam(1e-3)).init(params)
    >>> optimizer = optimizer.shard(params, mesh=mesh, state_axis='data')
    >>> optimizer.opt_state[0].mu['w'].sharding.spec == P('data', None)
    True
  """,
  )

  def _check_init_shapes(self, name: str, tree: PyTree) -> None:
    named, _ = optcore.leaves_with_paths(tree)
    for (path, leaf), want in zip(named, self.param_shapes or (), strict=True):
      if tuple(jnp.shape(leaf)) != want:
        raise ValueError(
          f"{name} has shape {tuple(jnp.shape(leaf))} at {path!r}, but this optimizer was "
          f"initialised for shape {want} there. Initialise a new optimizer for the new "
          "parameters: optimizer = optimizer.init(params)."
        )

  def _optax_counts_steps(self) -> bool:
    return isinstance(self.optimizer_def, optcore.OptaxWrapper)

  def _step(self) -> jax.Array | None:
    if self.step is not None:
      return self.step
    return adapter.step_count(self.opt_state)  # the core's one rule for every face

  def _check_initialized(self) -> None:
    if not self.initialized:
      raise RuntimeError("Optimizer is not initialized: use optimizer = optimizer.init(params)")
