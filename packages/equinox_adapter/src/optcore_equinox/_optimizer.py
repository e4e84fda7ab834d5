"""The optimizer as an Equinox module: its state as fields, its definition static."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import equinox as eqx
import jax
from jax.sharding import Mesh

import optcore
from optcore import adapter

PyTree = Any


class Optimizer(eqx.Module):
  """An optimizer for an Equinox model, built from any optcore definition.

  The state is an `optcore.OptimizerState` over the leaves that ``wrt``
  selects (by default every inexact array), kept in the model's structure
  with None elsewhere. Integer arrays, functions and static fields are never
  touched. `update` is functional: it returns the new model and the new
  optimizer, and runs under ``eqx.filter_jit`` (donation included); the
  definition is static, so the same configuration never retraces, and
  hyper-parameter overrides passed as arrays do not retrace either.

  Args:
    optimizer: an `optcore.OptimizerDef` (``optcore.adamw(...)``, a
      `optcore.MultiOptimizer`, a per-parameter definition) or a raw optax
      ``GradientTransformation``.
    model: the model whose leaves it optimises.
    wrt: an Equinox filter spec choosing those leaves.

  Example:
    >>> import equinox as eqx, jax, jax.numpy as jnp
    >>> import optcore, optcore_equinox
    >>> model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
    >>> opt = optcore_equinox.Optimizer(optcore.adamw(1e-2), model)
    >>> @eqx.filter_jit
    ... def step(model, opt, x, lr):
    ...   grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    ...   return opt.update(grads, model, learning_rate=lr)
    >>> model, opt = step(model, opt, jnp.ones(2), jnp.asarray(1e-2))
    >>> int(opt.state.step)
    1
  """

  optimizer_def: optcore.OptimizerDef = eqx.field(static=True)
  wrt: Any = eqx.field(static=True)
  state: optcore.OptimizerState

  def __init__(self, optimizer: Any, model: PyTree, *, wrt: Any = eqx.is_inexact_array):
    optimizer = adapter.as_definition(optimizer, "optcore_equinox.Optimizer")
    self.optimizer_def = optimizer
    self.wrt = wrt
    params = eqx.filter(model, wrt)
    if not jax.tree.leaves(params):
      adapter.warn(
        f"optcore_equinox.Optimizer: the filter wrt={wrt!r} selects no leaf of the model, so "
        "nothing will be trained. The default, eqx.is_inexact_array, selects the float arrays.",
        UserWarning,
      )
    self.state = optimizer.init_state(params)

  def params(self, model: PyTree) -> PyTree:
    """The leaves of ``model`` this optimizer updates (None elsewhere)."""
    return eqx.filter(model, self.wrt)

  def current_hyper_params(self) -> dict[str, jax.Array]:
    """The hyper-parameters the next `update` takes unless overridden, for
    logging: a flat dict of scalar arrays, schedules evaluated at this step
    (see `optcore.OptimizerDef.current_hyper_params`); works under
    ``eqx.filter_jit``.

    Returns:
      ``{name: scalar array}``: ``'learning_rate'``, ``'0/learning_rate'`` per group, ...

    Example:
      >>> import equinox as eqx, jax, optax
      >>> import optcore, optcore_equinox
      >>> model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
      >>> schedule = optax.linear_schedule(1e-2, 0.0, 100)
      >>> opt = optcore_equinox.Optimizer(optcore.adamw(schedule, weight_decay=0.1), model)
      >>> hyper_params = opt.current_hyper_params()
      >>> [round(float(hyper_params[k]), 6) for k in ('learning_rate', 'weight_decay')]
      [0.01, 0.1]
    """
    return optcore.current_hyper_params(self)

  def ema_params(self, model: PyTree) -> PyTree:
    """``model`` with each optimised leaf replaced by its moving average, as an
    `optcore.ema` definition keeps it (the other leaves are ``model``'s);
    TypeError for any other definition.

    Example:
      >>> import equinox as eqx, jax, jax.numpy as jnp
      >>> import optcore, optcore_equinox
      >>> model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
      >>> opt = optcore_equinox.Optimizer(optcore.ema(optcore.sgd(0.1), decay=0.9), model)
      >>> grads = jax.tree.map(jnp.ones_like, model)
      >>> new_model, opt = opt.update(grads, model)
      >>> averaged = opt.ema_params(new_model)
      >>> bool(jnp.allclose(averaged.bias, 0.9 * model.bias + 0.1 * new_model.bias))
      True
    """
    return optcore.ema_params(self, model)

  def eval_params(self, model: PyTree) -> PyTree:
    """``model`` with each optimised leaf at the point a schedule-free definition
    (``optcore.contrib.schedule_free_adamw``, ...) evaluates, the other leaves ``model``'s
    (see `optcore.eval_params`); TypeError for any other definition.

    Example:
      >>> import equinox as eqx, jax, jax.numpy as jnp
      >>> import optcore, optcore_equinox
      >>> model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
      >>> opt = optcore_equinox.Optimizer(optcore.contrib.schedule_free_sgd(0.1), model)
      >>> model, opt = opt.update(jax.tree.map(jnp.ones_like, model), model)
      >>> evaluation = opt.eval_params(model)
      >>> evaluation.weight.shape == model.weight.shape
      True
    """
    return optcore.eval_params(self, model)

  def update(
    self, grads: PyTree, model: PyTree, *, extra_args: Mapping[str, Any] | None = None, **overrides
  ) -> tuple[PyTree, Optimizer]:
    """Applies one step: returns ``(new_model, new_optimizer)``.

    Args:
      grads: the model's structure (``eqx.filter_grad`` gives it); leaves
        outside ``wrt`` are ignored.
      model: the model, whose optimised leaves are updated.
      extra_args: keyword arguments for optax's update (``value=loss`` for
        polyak_sgd, ...).
      **overrides: hyper-parameter values for this step (``learning_rate=lr``).

    Returns:
      ``(new_model, new_optimizer)``; this optimizer is untouched.

    Raises:
      optcore.TreeMismatchError: a None, missing or misshapen gradient for an
        optimised leaf (named by its path).
      TypeError: an override the definition does not have or refuses.

    Example:
      >>> import equinox as eqx, jax, jax.numpy as jnp
      >>> import optcore, optcore_equinox
      >>> model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
      >>> opt = optcore_equinox.Optimizer(optcore.sgd(0.1), model)
      >>> grads = jax.tree.map(jnp.ones_like, model)
      >>> new_model, opt = opt.update(grads, model, learning_rate=0.5)
      >>> bool(jnp.allclose(new_model.bias, model.bias - 0.5)), int(opt.state.step)
      (True, 1)
    """
    params, static = eqx.partition(model, self.wrt)
    new_params, new_state = adapter.step(
      self.optimizer_def,
      params,
      self.state,
      _select(grads, params),
      extra_args=extra_args,
      **overrides,
    )
    return eqx.combine(new_params, static), eqx.tree_at(lambda o: o.state, self, new_state)

  def state_dict(self) -> dict[str, Any]:
    """The optimizer's state dict, for a checkpoint.

    Returns:
      ``{'state': {'step': ..., 'param_states': ...}}``: the core's layout, so
      the state moves to and from the core, Flax and Treex optimizers.

    Example:
      >>> import equinox as eqx, jax
      >>> import optcore, optcore_equinox
      >>> model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
      >>> written = optcore_equinox.Optimizer(optcore.adam(1e-3), model).state_dict()
      >>> sorted(written['state']['param_states']['0'])
      ['count', 'mu', 'nu']
    """
    return adapter.state_dict(self.optimizer_def, self.state)

  def restore_state(self, state_dict: Mapping[str, Any]) -> Optimizer:
    """A new Optimizer holding ``state_dict['state']``; this one is untouched.

    Args:
      state_dict: this adapter's state dict, or a core/Flax/Treex optimizer's
        (a ``'target'`` is ignored: the model is yours).

    Returns:
      The restored optimizer.

    Raises:
      optcore.StateDictError: a key, shape or dtype that differs (named by
        its path); `optcore.transplant` is the lenient way.

    Example:
      >>> import equinox as eqx, jax, jax.numpy as jnp
      >>> import optcore, optcore_equinox
      >>> model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
      >>> opt = optcore_equinox.Optimizer(optcore.adam(1e-3), model)
      >>> _, stepped = opt.update(jax.tree.map(jnp.ones_like, model), model)
      >>> int(opt.restore_state(stepped.state_dict()).state.step)
      1
    """
    state = adapter.restore_state(self.optimizer_def, self.state, state_dict)
    return eqx.tree_at(lambda o: o.state, self, state)

  def transplant(
    self, state_dict: Mapping[str, Any], model: PyTree | None = None
  ) -> tuple[Optimizer, optcore.TransplantReport]:
    """A new Optimizer holding what ``state_dict`` still has for its state (same
    parameter, role and shape), the rest as this one holds it; and a report
    (see `optcore.transplant`). This one is untouched.

    Args:
      state_dict: any face's state dict, or an old flax.optim or T5X checkpoint's.
      model: the model this optimizer trains (its leaves' paths locate each
        state leaf's parameter).

    Returns:
      ``(new_optimizer, report)``.

    Raises:
      TypeError: no ``model``.
      optcore.StateDictError: ``state_dict`` has no ``'state'`` dict.

    Example:
      >>> import equinox as eqx, jax
      >>> import optcore, optcore_equinox
      >>> model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
      >>> old = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
      >>> opt = optcore_equinox.Optimizer(optcore.adamw(1e-3), model)
      >>> opt, report = optcore.transplant(opt, old.state_dict(), model)
      >>> len(report.kept), len(report.initialised), len(report.dropped)
      (6, 0, 0)
    """
    if model is None:
      raise TypeError(
        "optcore_equinox.Optimizer.transplant needs the model (it does not hold it): "
        "optcore.transplant(opt, state_dict, model)."
      )
    state, report = adapter.transplant_state(
      self.optimizer_def, self.params(model), self.state, state_dict
    )
    return eqx.tree_at(lambda o: o.state, self, state), report

  def shardings(
    self,
    model: PyTree,
    model_specs: PyTree | None = None,
    mesh: Mesh | optcore.Placement | None = None,
    logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
    **placement: Unpack[adapter.StatePlacement],
  ) -> Optimizer:
    """This optimizer's structure with a `NamedSharding` at every state array.

    ``model_specs`` has the model's structure with a `PartitionSpec` (mesh
    axes, or logical names mapped by ``logical_axis_rules``) at each
    optimised leaf; other leaves may hold anything; None: the model is
    replicated. ``state_axis`` (ZeRO-1) also splits every state leaf over
    that mesh axis, as `optcore.OptimizerDef.derive_shardings` does;
    ``state_memory_kind="pinned_host"`` keeps every non-scalar state array in
    host memory between steps (each `update` brings it to the device and back).
    Pass the result to ``jax.device_put`` (``eqx.filter_shard`` inside ``jit`` on Auto mesh
    axes) or use `shard`.

    Args:
      model: the model this optimizer trains.
      model_specs: a `PartitionSpec` per optimised leaf (mesh axes, or logical names
        mapped by ``logical_axis_rules``); None: replicated.
      mesh: the device mesh.
      logical_axis_rules: ``(logical_name, mesh_axes)`` pairs.
      **placement: ``state_axis=`` (ZeRO-1), ``state_memory_kind=`` (host memory): see
        `optcore.Placement`, which ``mesh`` may be instead.

    Returns:
      This optimizer's structure with a `NamedSharding` at every state array.

    Raises:
      optcore.PartitionRuleError: a dimension the mesh does not divide (named by path).
      TypeError: no mesh.

    Example:
      >>> import equinox as eqx, jax, numpy as np
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> import optcore, optcore_equinox
      >>> model = eqx.nn.Linear(4, 2, key=jax.random.key(0))
      >>> mesh = Mesh(np.array(jax.devices()[:1]), ('model',))
      >>> opt = optcore_equinox.Optimizer(optcore.adam(1e-3), model)
      >>> specs = eqx.tree_at(lambda m: (m.weight, m.bias), model, (P('model', None), P()))
      >>> shardings = opt.shardings(model, specs, mesh)
      >>> shardings.state.param_states[0].nu.weight.spec == P('model', None)
      True
    """
    params = self.params(model)
    specs = None if model_specs is None else _select(model_specs, params, check=False)
    shardings = adapter.state_shardings(
      self.optimizer_def,
      self.state,
      params,
      specs,
      mesh,
      logical_axis_rules,
      **placement,
    )
    return eqx.tree_at(lambda o: o.state, self, shardings)

  shard = adapter.shard_method(
    shardings,
    jax.device_put,  # eqx.filter_shard is a sharding constraint: refused on Explicit mesh axes
    """This optimizer with its state placed by `shardings` (``jax.device_put``).

  Args:
    model: the model this optimizer trains.
    model_specs, mesh, logical_axis_rules: as `shardings` reads them.
    **placement: as `shardings` reads it.

  Returns:
    The optimizer, its state on the mesh.

  Raises:
    optcore.PartitionRuleError: a dimension the mesh does not divide (named by path).
    TypeError: no mesh.

  Example (ZeRO-1 given as one `optcore.Placement`: the state split over ``'data'``):
    >>> import equinox as eqx, jax, optcore, optcore_equinox
    >>> model = eqx.nn.Linear(4, 2, key=jax.random.key(0))
    >>> zero1 = optcore.Placement(jax.make_mesh((1,), ('data',)), state_axis='data')
    >>> opt = optcore_equinox.Optimizer(optcore.adam(1e-3), model).shard(model, mesh=zero1)
    >>> opt.state.param_states[0].mu.weight.sharding.spec == jax.P(None, 'data')
    True
  """,
  )


def _select(tree: PyTree, params: PyTree, check: bool = True) -> PyTree:
  """``tree`` (model-shaped) cut to the optimised leaves. With ``check`` (grads),
  a tree of another structure is returned as it is, for `optcore.check_gradients`
  to name the first differing path; without (specs), it raises."""
  keep = jax.tree.map(lambda p: p is not None, params, is_leaf=lambda x: x is None)
  try:
    selected = jax.tree.map(lambda k, x: x if k else None, keep, tree)
  except (ValueError, TypeError):
    if not check:
      raise optcore.PartitionRuleError(
        f"the specs do not have the model's structure; expected {jax.tree.structure(keep)}, "
        f"found {jax.tree.structure(tree)}"
      ) from None
    selected = tree  # another structure: let the check name the first differing path
  return selected
