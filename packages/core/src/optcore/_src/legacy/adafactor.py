"""Adafactor as flax.optim (v0.5.3) and T5X wrote it: one implementation, each one's numerics.

Each parameter's dimensions play a role (`FactorDim`): ROW and COLUMN
dimensions are factored (``v_row`` averages the squared gradient over the
COLUMN dimensions, ``v_col`` over the ROW ones), BATCH dimensions (scanned
layers) are kept apart in every statistic, NONE dimensions are not factored.
Without rules the roles come from the size heuristic of flax.optim and optax:
the largest dimension is the COLUMN, the second largest the ROW. T5X adds
rules from logical axis names (`Adafactor.with_param_axes`), per-path rules
(`HParamMap`), global-norm clipping, a bound on the parameter scale, decoupled
weight decay scaled by a power of the learning rate, and NaN skipping.

The step-offset NaN of both originals is fixed: below ``step_offset`` the
decay exponent's base is clamped to 1, so the decay is 0 and the second
moment is the current squared gradient (a fresh start) until the offset.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from optcore._src.definitions.base import OptimizerDef
from optcore._src.ground import paths
from optcore._src.ground.checks import check_float_params, check_learning_rate
from optcore._src.ground.declarations import FirstMoment, SecondMoment
from optcore._src.ground.hyper_params import HyperParams, at_step
from optcore._src.ground.state import OptimizerState
from optcore._src.ground.user_warnings import warn
from optcore._src.legacy.factoring import FactorRules, HParamMap, t5x_path

PyTree = Any


class AdafactorParamState(NamedTuple):
  """Adafactor's state of one parameter (flax.optim and T5X): the row and column factors, the full
  second moment where not factored, and the momentum; unused ones are float32 ``zeros((1,))``.
  """

  v_row: SecondMoment
  v_col: SecondMoment
  v: SecondMoment
  m: FirstMoment


_UNUSED = (1,)  # flax.optim and T5X keep unused accumulators as float32 zeros((1,))


class Adafactor(FactorRules, OptimizerDef):
  """T5X's Adafactor (``t5x.adafactor.Adafactor``), every argument included.

  Args:
    learning_rate: the step size (overridable per step).
    factored: whether to factor the second moment.
    multiply_by_parameter_scale: scale the step by the parameter's RMS; a
      bool or an `HParamMap` per path.
    beta1: momentum coefficient, None for none.
    decay_rate: second-moment decay exponent: ``decay = 1 - t^-decay_rate``.
    step_offset: steps before the decay schedule starts (see the module).
    clipping_threshold: the update's RMS bound, None for none.
    weight_decay_rate: decoupled weight decay ``p <- (1 - rate) p``.
    min_dim_size_to_factor: the size heuristic's threshold.
    epsilon1, epsilon2: the squared-gradient and parameter-scale floors.
    dtype_momentum: the momentum's storage dtype.
    factor_map: an `HParamMap` from paths to a tuple of `FactorDim` per
      dimension or `HEURISTIC_RULE`.
    logical_factor_rules: updates to `standard_logical_factor_rules` for
      `with_param_axes`.
    weight_decay_rate_lr_exponent: weight decay ``(rate or 1) * lr**exponent``.
    global_norm_clip_threshold: scale all gradients by ``min(1, thr/|g|)``.
    max_parameter_scale: upper bound of the parameter scale.
    skip_nan_updates: keep the old value wherever the new one is NaN
      (T5X's check: an infinite value still enters the state).
    skip_nonfinite_updates: keep the old value wherever the new one is NaN
      or infinite (an optcore addition; not a hyper-parameter, so T5X's
      17 fields are unchanged).

  ``factored``, ``min_dim_size_to_factor``, ``factor_map`` and
  ``logical_factor_rules`` shape the state and are read from the
  constructor, as T5X read them: an apply-time override warns that it
  changed nothing; so does ``beta1=`` when momentum was off at construction.

  Example:
    >>> import jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from optcore.t5x import Adafactor
    >>> opt_def = Adafactor(1e-2)
    >>> params = {'layers': {'kernel': jnp.ones((2, 8, 4))}}  # scanned: (layers, embed, mlp)
    >>> opt_def = opt_def.with_param_axes({'layers': {'kernel': P('layers', 'embed', 'mlp')}})
    >>> state = opt_def.create(params).state.param_states['layers']['kernel']
    >>> state.v_row.shape, state.v_col.shape
    ((2, 8), (2, 4))

  `optcore.legacy.Adafactor` (flax.optim's) is this implementation with
  flax.optim's signature and momentum arithmetic.
  """

  weight_decays = ("weight_decay_rate",)
  learning_rates = ("learning_rate",)

  _t5x_numerics = True  # the momentum is read back as float32 before the update
  constructor_only = ("factored", "min_dim_size_to_factor", "factor_map", "logical_factor_rules")
  # The originals branch on these being None (or falsy): None switches the step off.
  none_means_off = (
    "clipping_threshold",
    "weight_decay_rate",
    "weight_decay_rate_lr_exponent",
    "global_norm_clip_threshold",
    "max_parameter_scale",
  )

  def __init__(
    self,
    learning_rate: float | None = None,
    factored: bool = True,
    multiply_by_parameter_scale: bool | HParamMap = True,
    beta1: float | None = None,
    decay_rate: float = 0.8,
    step_offset: int = 0,
    clipping_threshold: float | None = 1.0,
    weight_decay_rate: float | None = None,
    min_dim_size_to_factor: int = 128,
    epsilon1: float = 1e-30,
    epsilon2: float = 1e-3,
    dtype_momentum: Any = jnp.float32,
    factor_map: HParamMap | None = None,
    logical_factor_rules: Mapping[str, Any] | None = None,
    weight_decay_rate_lr_exponent: float | None = None,
    global_norm_clip_threshold: float | None = None,
    max_parameter_scale: float | None = None,
    skip_nan_updates: bool = False,
    *,
    skip_nonfinite_updates: bool = False,
  ):
    if not factored and factor_map is not None:
      raise ValueError(
        "Adafactor factored is False but factorization rules have been provided (factor_map): "
        "drop factor_map, or set factored=True."
      )
    super().__init__(
      HyperParams.of_arguments(locals(), leave=("dtype_momentum", "skip_nonfinite_updates"))
    )
    self.dtype_momentum = jnp.dtype(dtype_momentum)
    self.skip_nonfinite_updates = bool(skip_nonfinite_updates)

  def update_hyper_params(self, **hyper_param_overrides: Any) -> HyperParams:
    if "beta1" in hyper_param_overrides and self.hyper_params.beta1 is None:
      warn(
        f"{type(self).__name__}: the override beta1={hyper_param_overrides['beta1']!r} has no "
        "effect: this Adafactor was built without momentum (beta1=None), so its state has no "
        "momentum to update. Build it with beta1=... to use momentum.",
        UserWarning,
      )
    return super().update_hyper_params(**hyper_param_overrides)

  # State.

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    keyed, treedef = jax.tree_util.tree_flatten_with_path(params)
    states = [self._init_param(t5x_path(keys), p) for keys, p in keyed]
    return OptimizerState(jnp.asarray(0, jnp.int32), treedef.unflatten(states))

  def _init_param(self, path: str, param: jax.Array) -> AdafactorParamState:
    roles = self._roles(path, tuple(param.shape))
    unused = jnp.zeros(_UNUSED, jnp.float32)
    shape = np.shape(param)
    if roles.factored:
      v_row = jnp.zeros([shape[d] for d in roles.kept(roles.cols)], jnp.float32)
      v_col = jnp.zeros([shape[d] for d in roles.kept(roles.rows)], jnp.float32)
      v = unused
    else:
      v_row, v_col, v = unused, unused, jnp.zeros(shape, jnp.float32)
    m = unused if self.hyper_params.beta1 is None else jnp.zeros(shape, self.dtype_momentum)
    return AdafactorParamState(v_row, v_col, v, m)

  # Update.

  def apply_gradient(self, hyper_params, params, state, grads, **extra_args):
    if extra_args:
      raise TypeError(f"Adafactor takes no extra update arguments; got {sorted(extra_args)}")
    check_learning_rate(self, hyper_params)
    hyper_params = at_step(hyper_params, state.step)  # a schedule is read at this step
    keyed, treedef = jax.tree_util.tree_flatten_with_path(params)
    grads_flat = treedef.flatten_up_to(paths.conform(params, grads))
    states_flat = treedef.flatten_up_to(paths.conform(params, state.param_states))
    threshold = hyper_params.get("global_norm_clip_threshold")
    if threshold:  # T5X: a falsy threshold (None or 0) means no clipping
      # T5X's arithmetic, bitwise: thr * min(1/thr, 1/|g|) over the stacked squared norms.
      norm = jnp.sqrt(jnp.sum(jnp.array([jnp.sum(jnp.square(g)) for g in grads_flat])))
      scale = threshold * jnp.minimum(1.0 / threshold, 1.0 / norm)
      grads_flat = [g * scale for g in grads_flat]
    out = [
      _param_update(self, state.step, hyper_params, t5x_path(keys), p, s, g)
      for (keys, p), s, g in zip(keyed, states_flat, grads_flat, strict=True)
    ]
    return (
      treedef.unflatten([p for p, _ in out]),
      OptimizerState(state.step + 1, treedef.unflatten([s for _, s in out])),
    )

  # Partitioning: the accumulators keep the axes their reduction spares.

  def derive_param_states_axes(self, param_states, params, params_axes):
    keyed, treedef = jax.tree_util.tree_flatten_with_path(params)
    specs = treedef.flatten_up_to(params_axes)
    out = []
    for (keys, param), spec in zip(keyed, specs, strict=True):
      roles = self._roles(t5x_path(keys), tuple(param.shape))
      unused = PartitionSpec(None)
      pick = lambda dims: PartitionSpec(*(spec[d] for d in dims))  # noqa: B023
      if roles.factored:
        v_row, v_col, v = pick(roles.kept(roles.cols)), pick(roles.kept(roles.rows)), unused
      else:
        v_row, v_col, v = unused, unused, spec
      m = unused if self.hyper_params.beta1 is None else spec
      out.append(AdafactorParamState(v_row, v_col, v, m))
    return treedef.unflatten(out)

  def _static_key(self) -> tuple:
    return (*super()._static_key(), self.dtype_momentum, self.skip_nonfinite_updates)


def _param_update(opt_def: Adafactor, step, hp, path, param, state, grad):
  """One parameter's Adafactor step, with ``opt_def``'s numerics (T5X's or flax.optim's)."""
  roles = opt_def._roles(path, tuple(param.shape))
  # Clamped: below step_offset the base would be negative (NaN in the originals).
  t = jnp.maximum(jnp.asarray(step - hp.step_offset, jnp.float32), 0.0) + 1.0
  decay = 1.0 - t ** (-hp.decay_rate)
  mixing = 1.0 - decay
  # flax.optim read the flag from its constructor; T5X from the step's hyper-parameters.
  scale_by_param = (
    hp if opt_def._t5x_numerics else opt_def.hyper_params
  ).multiply_by_parameter_scale
  if isinstance(scale_by_param, HParamMap):
    scale_by_param = scale_by_param[path]
  update_scale = hp.learning_rate
  if scale_by_param:
    rms = jnp.sqrt(jnp.mean(param * param, axis=roles.non_batch, keepdims=True))
    param_scale = jnp.maximum(rms, hp.epsilon2)
    if hp.get("max_parameter_scale") is not None:
      param_scale = jnp.minimum(param_scale, hp.max_parameter_scale)
    update_scale = update_scale * param_scale

  unused = jnp.zeros(_UNUSED, jnp.float32)
  grad_sqr = grad * grad + hp.epsilon1
  if roles.factored:
    v_row = decay * state.v_row + mixing * jnp.mean(grad_sqr, axis=roles.cols)
    v_col = decay * state.v_col + mixing * jnp.mean(grad_sqr, axis=roles.rows)
    v_row_full = jnp.expand_dims(v_row, roles.cols)
    v_col_full = jnp.expand_dims(v_col, roles.rows)
    row_col_mean = jnp.mean(v_row_full, axis=roles.rows, keepdims=True)
    row_factor = (v_row_full / row_col_mean) ** -0.5
    col_factor = v_col_full**-0.5
    y = grad * row_factor * col_factor
    new_v = unused
  else:
    new_v = decay * state.v + mixing * grad_sqr
    v_row, v_col = unused, unused
    y = grad * new_v**-0.5

  if hp.clipping_threshold is not None:
    rms_y = jnp.sqrt(jnp.mean(y * y, axis=roles.non_batch, keepdims=True))
    y = y / jnp.maximum(1.0, rms_y / hp.clipping_threshold)

  subtrahend = update_scale * y
  new_m = unused
  if opt_def.hyper_params.beta1 is not None:
    m = state.m.astype(jnp.float32) if opt_def._t5x_numerics else state.m
    subtrahend = hp.beta1 * m + (1.0 - hp.beta1) * subtrahend
    new_m = subtrahend.astype(opt_def.dtype_momentum)

  weight_decay = hp.weight_decay_rate
  if hp.get("weight_decay_rate_lr_exponent"):  # T5X: a falsy exponent means none
    weight_decay = _or_one(weight_decay) * hp.learning_rate**hp.weight_decay_rate_lr_exponent
  if weight_decay is not None:
    new_param = (1.0 - weight_decay) * param - subtrahend
  else:
    new_param = param - subtrahend
  new_state = AdafactorParamState(v_row, v_col, new_v, new_m)
  # Which new values to discard: every non-finite one, or (T5X's flag) NaN only.
  skipped = (lambda x: ~jnp.isfinite(x)) if opt_def.skip_nonfinite_updates else None
  if skipped is None and hp.get("skip_nan_updates"):
    skipped = jnp.isnan
  if skipped is not None:
    keep = lambda new, old: jnp.where(skipped(new), old, new)
    new_param = keep(new_param, param)
    new_state = jax.tree.map(keep, new_state, state)
  # float64 params are float32 unless x64 is on: say so without JAX's truncation warning.
  return new_param.astype(jax.dtypes.canonicalize_dtype(param.dtype)), new_state


def _or_one(rate: Any) -> Any:
  """T5X's ``weight_decay_rate or 1.0``: None and 0 both mean 1 (traced values too)."""
  if rate is None:
    return 1.0
  if isinstance(rate, (int, float)):
    return rate or 1.0
  return jnp.where(rate == 0, 1.0, rate)


class LegacyAdafactor(Adafactor):
  """flax.optim's Adafactor (v0.5.3): the size heuristic only, and the
  momentum multiplied in its storage dtype, as flax.optim did.

  Its ``hyper_params`` are flax.optim's 11 fields. ``factored``,
  ``multiply_by_parameter_scale`` and ``min_dim_size_to_factor`` are read
  from the constructor, as flax.optim read them: an override of one changes
  nothing and warns.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.Adafactor(0.1, min_dim_size_to_factor=2).create({'w': jnp.ones((3, 4))})
    >>> s = opt.state.param_states['w']
    >>> s.v_row.shape, s.v_col.shape, s.v.shape
    ((3,), (4,), (1,))
    >>> len(opt.optimizer_def.hyper_params)
    11
  """

  _t5x_numerics = False
  constructor_only = ("factored", "multiply_by_parameter_scale", "min_dim_size_to_factor")

  def __init__(
    self,
    learning_rate: float | None = None,
    factored: bool = True,
    multiply_by_parameter_scale: bool = True,
    beta1: float | None = None,
    decay_rate: float = 0.8,
    step_offset: int = 0,
    clipping_threshold: float | None = 1.0,
    weight_decay_rate: float | None = None,
    min_dim_size_to_factor: int = 128,
    epsilon1: float = 1e-30,
    epsilon2: float = 1e-3,
    dtype_momentum: Any = jnp.float32,
  ):
    super().__init__(
      learning_rate,
      factored,
      multiply_by_parameter_scale,
      beta1,
      decay_rate,
      step_offset,
      clipping_threshold,
      weight_decay_rate,
      min_dim_size_to_factor,
      epsilon1,
      epsilon2,
      dtype_momentum,
    )
    # flax.optim's record: T5X's first 11 fields (its constructor's arguments, the dtype aside).
    fields = list(inspect.signature(LegacyAdafactor.__init__).parameters)[1:-1]
    self.hyper_params = HyperParams(**{name: self.hyper_params[name] for name in fields})


LegacyAdafactor.__name__ = LegacyAdafactor.__qualname__ = "Adafactor"
