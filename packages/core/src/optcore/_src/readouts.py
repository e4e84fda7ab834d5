"""Read-outs: what an optimizer's state says, as functions of any face's optimizer.

`ema_params`, `eval_params` and `current_hyper_params` take a core or Flax `Optimizer`, a
`GroupedOptimizer`, an ``optcore_equinox.Optimizer``, an ``optcore_treex.Optimizer``
(anything holding an ``optimizer_def`` and its ``state``), or a bare state with the
definition it belongs to: an `OptimizerState`, the ``opt_state`` of ``as_optax()`` (a
TrainState's, an ``nnx.Optimizer``'s, its nnx Variables unboxed). Each face's accessor
(``opt.ema_params``, ``opt.current_hyper_params()``) is a thin alias of these.

The definition finds its own state by its type, under any wrapper and in any
`MultiOptimizer` group: `Ema`'s average is read where `Ema` keeps it, a schedule is
evaluated at the count of the definition that owns it, never the first ``count`` found.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

from optcore._src.containers.optimizer import fill_unaveraged
from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import wrapper_states
from optcore._src.ground import paths
from optcore._src.ground.state import OptimizerState
from optcore._src.persistence import schedule_free
from optcore._src.wrappers.skip import SkipState

PyTree = Any


def _source(source: Any, optimizer_def: OptimizerDef | None, name: str) -> tuple[Any, Any, Any]:
  """``(definition, state, held parameters or None)`` of a read-out's argument."""
  held_def = getattr(source, "optimizer_def", None)
  if isinstance(held_def, OptimizerDef) and hasattr(source, "state"):
    if optimizer_def is not None and optimizer_def != held_def:
      raise TypeError(
        f"optcore.{name}: the optimizer holds {held_def!r}, and optimizer_def={optimizer_def!r} "
        "names another. Pass the optimizer alone: it knows its definition."
      )
    # The core, Flax and grouped optimizers hold their target; Equinox's and Treex's do not.
    return held_def, source.state, getattr(source, "target", None)
  if optimizer_def is None:
    found = type(source).__name__
    raise TypeError(
      f"optcore.{name}: expected an optimizer of an optcore face (optcore.Optimizer, "
      f"optcore_flax's, optcore_equinox.Optimizer, optcore_treex.Optimizer), or a state with "
      f"its definition; found a {found} and no definition. For a state (opt.state, the "
      f"opt_state of as_optax()), pass the definition that made it: "
      f"optcore.{name}(opt_state, optimizer_def=opt_def)."
    )
  if not isinstance(optimizer_def, OptimizerDef):
    raise TypeError(
      f"optcore.{name}: optimizer_def must be the optcore definition the state belongs to "
      f"(optcore.ema(optcore.adam(1e-3))); found {optimizer_def!r}"
    )
  # Flax's own nnx.Optimizer keeps each array of its opt_state in an OptState Variable
  return optimizer_def, paths.read_nnx_variables(source), None


def ema_params(
  optimizer: Any, params: PyTree | None = None, *, optimizer_def: OptimizerDef | None = None
) -> PyTree:
  """The moving average of the parameters that an `optcore.ema` keeps, wherever it is kept.

  The `Ema` wrapper may be the definition itself, under another wrapper
  (``accumulate(ema(...))``, ``mixed_precision(ema(...))``) or around one
  `MultiOptimizer` group's definition; the average comes back in the
  parameters' structure, with the parameters themselves where no group
  averages (``params``, or the target of an optimizer that holds it; None
  there otherwise), on the device the parameters are on (an average kept in
  host memory by ``state_memory_kind`` is brought back).

  Args:
    optimizer: an optimizer of any face (core, Flax, `GroupedOptimizer`,
      Equinox, Treex), or a state (``opt.state``, the ``opt_state`` of
      ``as_optax()``) with ``optimizer_def``.
    params: the parameters to fill the unaveraged leaves from (an Equinox
      model gives the model back with its averaged leaves); None: the
      optimizer's own target where it holds one.
    optimizer_def: the definition a bare state belongs to.

  Returns:
    The average in the parameters' structure.

  Raises:
    TypeError: no definition keeps an average (the message says how to keep
      one), ``optimizer`` is neither an optimizer nor a state with its
      definition, or ``optimizer_def`` is not the optimizer's.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt_def = optcore.accumulate(optcore.ema(optcore.sgd(1.0), decay=0.5), every=1)
    >>> opt = opt_def.create({'w': jnp.zeros(1)}).apply_gradient({'w': jnp.ones(1)})
    >>> optcore.ema_params(opt)['w']
    Array([-0.5], dtype=float32)
    >>> tx = opt_def.as_optax()  # the state of an optax loop, with its definition
    >>> optcore.ema_params(tx.init({'w': jnp.ones(1)}), optimizer_def=opt_def)['w']
    Array([1.], dtype=float32)
  """
  opt_def, state, held = _source(optimizer, optimizer_def, "ema_params")
  average = opt_def.ema_params(_as_state(opt_def, state))
  params = _parameters(optimizer, params, held)
  return average if params is None else fill_unaveraged(average, params)


def eval_params(
  optimizer: Any, params: PyTree | None = None, *, optimizer_def: OptimizerDef | None = None
) -> PyTree:
  """The parameters to evaluate a schedule-free run at, wherever its state is kept.

  optax's ``schedule_free`` optimizers (``optcore.contrib.schedule_free_adamw``,
  ``schedule_free_sgd``, ``schedule_free(...)`` around any optimizer) train one
  sequence and evaluate at another: ``(y - (1 - b1) * z) / b1``, what
  ``optax.contrib.schedule_free_eval_params`` computes. Their state is found by
  its type anywhere in the state (under any wrapper, in any `MultiOptimizer`
  group, inside an optax chain); a parameter no schedule-free group trains comes
  back as it is. State in host memory is read on the device.

  Args:
    optimizer: an optimizer of any face, or a state (``opt.state``, the ``opt_state``
      of ``as_optax()``) with ``optimizer_def``.
    params: the parameters (the model, for the Equinox and NNX faces); None: the
      optimizer's own target where it holds one (core, Flax).
    optimizer_def: the definition a bare state belongs to.

  Returns:
    The evaluation parameters, in the parameters' structure and dtypes.

  Raises:
    TypeError: no schedule-free state is kept (the message names what is), no
      parameters given to an optimizer that does not hold them, or ``optimizer`` is
      neither an optimizer nor a state with its definition.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.contrib.schedule_free_sgd(0.1, b1=0.5).create({'w': jnp.zeros(1)})
    >>> for g in (1.0, 3.0):
    ...   opt = opt.apply_gradient({'w': jnp.full(1, g)})
    >>> opt.target['w'], optcore.eval_params(opt)['w'].round(4)  # trained at y, evaluated at x
    (Array([-0.325], dtype=float32), Array([-0.25], dtype=float32))
  """
  opt_def, state, held = _source(optimizer, optimizer_def, "eval_params")
  params = _parameters(optimizer, params, held)
  if not schedule_free.keeps_schedule_free(state):
    raise TypeError(
      f"optcore.eval_params: {opt_def.display_name()} keeps no schedule-free state. It reads "
      "where optax's schedule_free optimizers evaluate (optcore.contrib.schedule_free_adamw, "
      "schedule_free_sgd, or schedule_free(...) around an optimizer); for a moving average, "
      "use optcore.ema(...) and optcore.ema_params."
    )
  if params is None:
    raise TypeError(
      "optcore.eval_params: this optimizer does not hold its parameters; pass them: "
      "optcore.eval_params(opt, params) (the model, for the Equinox and NNX faces)."
    )
  return schedule_free.eval_params(state, params)


def skipped_steps(optimizer: Any, *, optimizer_def: OptimizerDef | None = None) -> jax.Array:
  """How many steps an `optcore.skip_bad_steps` has skipped, wherever it is kept (under any
  wrapper, in any `MultiOptimizer` group: the groups' counts added).

  Args:
    optimizer: an optimizer of any face, or a state (``opt.state``, the ``opt_state`` of
      ``as_optax()``) with ``optimizer_def``.
    optimizer_def: the definition a bare state belongs to.

  Returns:
    An int32 scalar (traceable: log it from inside ``jit``).

  Raises:
    TypeError: no `skip_bad_steps` in the definition, or ``optimizer`` is neither an
      optimizer nor a state with its definition.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.skip_bad_steps(optcore.sgd(0.1)).create({'w': jnp.zeros(1)})
    >>> opt = opt.apply_gradient({'w': jnp.array([jnp.inf])})
    >>> int(optcore.skipped_steps(opt)), opt.target['w']
    (1, Array([0.], dtype=float32))
  """
  opt_def, state, _ = _source(optimizer, optimizer_def, "skipped_steps")
  found = paths.instances_in(state, SkipState)
  if not found:
    raise TypeError(
      f"optcore.skipped_steps: {opt_def.display_name()} skips no steps; wrap it: "
      "optcore.skip_bad_steps(opt_def, window=..., sigmas=..., warmup=...)."
    )
  total = found[0].skipped
  for state in found[1:]:  # one a skip_bad_steps (in each MultiOptimizer group)
    total = total + state.skipped
  return total


def statistics(optimizer: Any, *, optimizer_def: OptimizerDef | None = None) -> dict[str, Any]:
  """The last step's per-group norms that an `optcore.with_statistics` keeps, as a flat dict of
  float32 scalars for any logger: ``'{group}/grad_norm'``, ``'{group}/update_norm'``,
  ``'{group}/param_norm'`` (after the update) and ``'{group}/update_ratio'`` for each group and
  for ``'global'``; with a `with_statistics` in several `MultiOptimizer` groups, each group's
  under its index (``'0/global/grad_norm'``). A `zclip` adds ``'zclip/grad_norm'``,
  ``'zclip/clip_norm'``, ``'zclip/mean'`` and ``'zclip/std'``.

  Args:
    optimizer: an optimizer of any face, or a state (``opt.state``, the ``opt_state`` of
      ``as_optax()``) with ``optimizer_def``.
    optimizer_def: the definition a bare state belongs to.

  Returns:
    ``{name: float32 scalar}`` (traceable: return it from a jitted step to log it).

  Raises:
    TypeError: neither `with_statistics` nor `zclip` in the definition, or ``optimizer``
      is neither an optimizer nor a state with its definition.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.with_statistics(optcore.sgd(0.1)).create({'w': jnp.ones(4)})
    >>> stats = optcore.statistics(opt.apply_gradient({'w': jnp.ones(4)}))
    >>> sorted(stats)[:4], float(stats['w/grad_norm'])
    (['global/grad_norm', 'global/param_norm', 'global/update_norm', 'global/update_ratio'], 2.0)
  """
  opt_def, state, _ = _source(optimizer, optimizer_def, "statistics")
  # every wrapper state that keeps numbers for logging says so with a `logged()` method
  logging = tuple(t for t in wrapper_states() if hasattr(t, "logged"))
  found = paths.instances_with_paths(state, logging)
  if not found:
    raise TypeError(
      f"optcore.statistics: {opt_def.display_name()} keeps no statistics; wrap it: "
      "optcore.with_statistics(opt_def, groups=...)."
    )
  out: dict[str, Any] = {}
  for where, kept in found:
    # several (one per MultiOptimizer group): each under its group, '0/global/grad_norm'
    several = sum(type(k) is type(kept) for _, k in found) > 1
    prefix = f"{where}/" if several and where else ""
    out.update({prefix + k: v for k, v in kept.logged().items()})
  return out


def current_hyper_params(
  optimizer: Any, *, optimizer_def: OptimizerDef | None = None, params: PyTree = None
) -> dict[str, jax.Array]:
  """The hyper-parameters the next step takes unless overridden, for logging.

  A flat dict of scalar arrays: schedules evaluated at the step of the
  definition that owns them (under `accumulate`, the applied updates; in an
  optax chain, the count of the schedule's own ``scale_by_schedule``), numbers
  as they are, flags and other static settings left out; a `MultiOptimizer`'s
  per group (``'0/learning_rate'``). Where parameters take rates of their own
  (`optcore.multipliers`, `optcore.mup`) and the parameters are known (held by
  the optimizer, or given), each such parameter's effective rates are added
  under its path (``'head/kernel/learning_rate'``). Traceable: inside ``jit``
  a schedule's value changes with the step without a recompile.

  Args:
    optimizer: an optimizer of any face, or a state (``opt.state``, the
      ``opt_state`` of ``as_optax()``) with ``optimizer_def``.
    optimizer_def: the definition a bare state belongs to.
    params: the parameters (or a model, for a face that reads them from one),
      where the optimizer holds none, for the per-parameter rates.

  Returns:
    ``{name: scalar array}``: ``'learning_rate'``, ``'0/learning_rate'`` per group, ...

  Raises:
    TypeError: ``optimizer`` is neither an optimizer nor a state with its
      definition, or a state with schedules holds no step count.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> import optcore
    >>> opt_def = optcore.sgd(optax.exponential_decay(1.0, 1, 0.5))
    >>> opt = opt_def.create({'w': jnp.ones(1)}).apply_gradient({'w': jnp.ones(1)})
    >>> optcore.current_hyper_params(opt)
    {'learning_rate': Array(0.5, dtype=float32)}
    >>> tx = opt_def.as_optax()
    >>> optcore.current_hyper_params(tx.init({'w': jnp.ones(1)}), optimizer_def=opt_def)
    {'learning_rate': Array(1., dtype=float32)}
  """
  opt_def, state, held = _source(optimizer, optimizer_def, "current_hyper_params")
  out = opt_def.current_hyper_params(state)
  known = _parameters(optimizer, params, held)
  if known is not None:
    out.update(opt_def.leaf_hyper_params(state, paths.unbox(known)))
  return out


@runtime_checkable
class ReadsOutParameters(Protocol):
  """A face whose model is not its state's shape (the NNX face: a model of Variables, among
  them some it does not optimise) says how a read-out reads the parameters from what a user
  passes: ``readout_parameters(model)`` gives them in the state's structure. The read-outs ask
  for this protocol; a face without it passes the parameters as they are."""

  def readout_parameters(self, model: Any) -> PyTree: ...


def _parameters(optimizer: Any, params: PyTree | None, held: PyTree | None) -> PyTree | None:
  """The parameters a read-out fills from: ``params`` as the face reads them (a
  `ReadsOutParameters` face), else the optimizer's own target (``held``; None where it holds
  none)."""
  if params is not None and isinstance(optimizer, ReadsOutParameters):
    params = optimizer.readout_parameters(params)
  return held if params is None else params


def _as_state(opt_def: OptimizerDef, state: Any) -> Any:
  """An `OptimizerState` as it is; the raw optax state a wrapped optax definition's
  ``as_optax()`` keeps is refused for an average (optax's own state keeps none)."""
  if isinstance(state, (OptimizerState, tuple)) or not opt_def.keeps_ema():
    return state  # a tuple: a MultiOptimizer's as_optax() state, one per group
  raise TypeError(
    f"optcore.ema_params: expected the OptimizerState of {opt_def.display_name()} (opt.state, "
    f"or the opt_state of its as_optax()), found a {type(state).__name__}"
  )
