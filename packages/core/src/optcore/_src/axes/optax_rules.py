"""The built-in partition rules for optax's and optax.contrib's state types.

Each state type names every one of its fields: ``P`` for a parameter-shaped
field, ``R`` for a replicated one (counters, scalars, RNG keys, per-step
statistics), ``N`` for a nested optax state, or a function for a field that
needs its own reasoning (factored accumulators, lookahead's fast parameters,
GaLore's projections). A field that optax adds later and this table does not
name raises instead of being guessed.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
import optax.contrib
from jax.sharding import PartitionSpec

from optcore._src.axes import partition_rules as pr
from optcore._src.ground import declarations, paths

P, R, N = "params", "replicated", "nested"
#: A parameter-shaped moment (`optcore.FirstMoment`, `optcore.SecondMoment`): quantized by
#: `low_bit_state` with the signed or the unsigned map, carried over by `transplant`'s roles.
FM, SM = declarations.FIRST_MOMENT, declarations.SECOND_MOMENT
#: A step counter (`optcore.Count`): replicated, and what `transplant` reads as the count.
C = declarations.COUNT
FieldRule = Callable[[Any, Any, Any, Any], Any]  # (field, state, params_axes, params) -> axes
field_rule = pr.field_rule


def fields(state_type: type | None, **kinds: Any) -> None:
  """Declares ``state_type``'s fields (`declarations.declare_state`: ``P``, ``R``, ``N``,
  ``FM``, ``SM``, or an axes rule) and registers the axes rule they give; None: the type is
  absent in this optax."""
  if state_type is None:
    return
  declarations.declare_known(state_type, **kinds)
  pr.register_state_rule(state_type, pr.declared_rule(declarations.declared_fields(state_type)))


_HOMES = (
  "optax",
  "optax.contrib",
  "optax.transforms",
  "optax.schedules",
  # Types that optax uses in states but does not export.
  "optax._src.transform",
  "optax.transforms._adding",
  "optax.schedules._inject",
  "optax.contrib._complex_valued",
)


def T(name: str) -> type | None:
  """The optax type called ``name`` where this optax version has it, else None."""
  for home in _HOMES:
    try:
      module = importlib.import_module(home)
    except ImportError:
      continue
    if isinstance(found := getattr(module, name, None), type):
      return found
  return None


# Factored second moments (optax.adafactor): v_row drops the largest dimension,
# v_col the second largest; unfactored parameters keep v and carry (1,) rows/cols.


def _factored_dims(shape: tuple[int, ...]) -> tuple[int, int]:
  """(second largest, largest) dimension, ties in argsort order, as optax picks them."""
  order = np.argsort(np.asarray(shape))
  return int(order[-2]), int(order[-1])


def _drop(spec: PartitionSpec, dim: int) -> PartitionSpec:
  return PartitionSpec(*(a for i, a in enumerate(spec) if i != dim))


def _factored_rule(state, params_axes, params):
  param_at = {tuple(keys): p for keys, p in jax.tree_util.tree_flatten_with_path(params)[0]}

  def pick(field_name: str) -> Any:
    def per_param(leaf, spec, keys):
      param = param_at[keys]
      v = _at(state.v, keys)
      factored = tuple(v.shape) != tuple(param.shape)
      if not factored:
        return spec if field_name == "v" else PartitionSpec(None)
      if field_name == "v":
        return PartitionSpec(None)
      d1, d0 = _factored_dims(tuple(param.shape))
      dropped = d0 if field_name == "v_row" else d1
      expected = tuple(s for i, s in enumerate(param.shape) if i != dropped)
      if tuple(leaf.shape) != expected:
        raise pr.PartitionRuleError(
          f"{field_name} at {keys!r} has shape {tuple(leaf.shape)}; optax's factoring of "
          f"{tuple(param.shape)} gives {expected}."
        )
      return _drop(spec, dropped)

    return pr.map_params(per_param, getattr(state, field_name), params_axes)

  return type(state)(count=None, v_row=pick("v_row"), v_col=pick("v_col"), v=pick("v"))


def _at(tree: Any, keys: tuple) -> Any:
  for key in keys:
    children = paths.children_with_keys(tree)
    assert children is not None, keys  # keys came from flattening this tree
    tree = dict(children[0])[key]
  return tree


# SM3 keeps, per parameter, one accumulator per dimension: dimension i keeps axis i.


def _sm3_mu(field, state, params_axes, params):
  def per_param(accumulators, spec, keys):
    if len(spec) < 2:  # rank 0 and 1 accumulate elementwise (optax: g.ndim < 2)
      return [spec for _ in accumulators]
    return [PartitionSpec(spec[i]) for i in range(len(accumulators))]

  return pr.map_params(per_param, field, params_axes)


# L-BFGS stacks `memory_size` past differences on a new leading axis.


def _memory(field, state, params_axes, params):
  return pr.map_params(lambda leaf, spec, keys: PartitionSpec(None, *spec), field, params_axes)


# Lookahead's inner state belongs to the fast parameters.


def _lookahead_fast(field, state, params_axes, params):
  if isinstance(params, optax.LookaheadParams):
    return pr.derive_normalized(field, params_axes.fast, params.fast)
  return pr.derive_normalized(field, params_axes, params)


# split_real_and_imaginary: a complex parameter becomes (real, imaginary) halves,
# each with the parameter's axes.


def _split_complex(field, state, params_axes, params):
  pair: Any = T("SplitRealAndImaginaryArrays")  # present wherever its state is

  def split(value, spec):
    dtype = np.dtype(value.dtype)
    if np.issubdtype(dtype, np.complexfloating):
      half = jax.ShapeDtypeStruct(value.shape, np.finfo(dtype).dtype)
      return pair(half, half), pair(spec, spec)
    return value, spec

  treedef = jax.tree.structure(params)
  pairs = [
    split(v, s)
    for v, s in zip(jax.tree.leaves(params), treedef.flatten_up_to(params_axes), strict=True)
  ]
  inner_params = treedef.unflatten([p for p, _ in pairs])
  inner_axes = treedef.unflatten([s for _, s in pairs])
  return pr.derive_normalized(field, inner_axes, inner_params)


# GaLore projects each matrix to rank r: the projector keeps the larger side's
# axis, the base optimizer sees (r, smaller side) or (smaller side, r) proxies.
# Parameters of rank > 2 flatten several axes into one: those are replicated.


def _galore_projection(projector: Any, spec: PartitionSpec, param: Any):
  """(projector spec, proxy shape, proxy spec) for one parameter."""
  shape = tuple(param.shape)
  if tuple(projector.shape) == (0, 0):
    return PartitionSpec(None, None), shape, spec
  big, rank = projector.shape
  small = math.prod(shape) // big
  if len(shape) == 2:
    m, n = shape
    use_left = m >= n
    if big != (m if use_left else n):
      raise pr.PartitionRuleError(
        f"a GaLore projector of shape {tuple(projector.shape)} for a parameter of shape {shape} "
        "does not follow the default dimension numbers (reduction axis 0, output axis 1); "
        "register a rule for GaLoreState that knows yours."
      )
    big_axis, small_axis = (spec[0], spec[1]) if use_left else (spec[1], spec[0])
    proxy_shape = (rank, small) if use_left else (small, rank)
    proxy_spec = PartitionSpec(None, small_axis) if use_left else PartitionSpec(small_axis, None)
    return PartitionSpec(big_axis, None), proxy_shape, proxy_spec
  return PartitionSpec(None, None), None, None  # rank > 2: grouped axes, replicated


def _galore_rule(state, params_axes, params):
  treedef = jax.tree.structure(params)
  projectors = treedef.flatten_up_to(state.projector)
  specs = treedef.flatten_up_to(params_axes)
  leaves = jax.tree.leaves(params)
  out = [
    _galore_projection(proj, s, p) for proj, s, p in zip(projectors, specs, leaves, strict=True)
  ]
  if any(proxy_shape is None for _, proxy_shape, _ in out):
    base = pr.replicated(state.base_optimizer_state)
  else:
    proxies = treedef.unflatten(
      [jax.ShapeDtypeStruct(shape, p.dtype) for (_, shape, _), p in zip(out, leaves, strict=True)]
    )
    base = pr.derive_normalized(
      state.base_optimizer_state, treedef.unflatten([s for _, _, s in out]), proxies
    )
  return type(state)(
    count=None, base_optimizer_state=base, projector=treedef.unflatten([s for s, _, _ in out])
  )


def _register_builtin() -> None:
  o, c = optax, optax.contrib
  # Core transformations.
  fields(o.EmptyState)
  fields(o.MaskedNode)
  fields(o.ScaleByAdamState, count=C, mu=FM, nu=SM)
  fields(o.ScaleByAmsgradState, count=C, mu=FM, nu=SM, nu_max=SM)
  fields(o.ScaleByBeliefState, count=C, mu=FM, nu=SM)
  fields(o.ScaleByNovogradState, count=C, mu=FM, nu=SM)
  fields(o.ScaleByLionState, count=C, mu=FM)
  fields(o.ScaleByRmsState, nu=SM)
  fields(T("ScaleByRmsWithCountState"), count=C, nu=SM)
  fields(o.ScaleByRStdDevState, mu=FM, nu=SM)
  fields(T("ScaleByRStdDevWithCountState"), count=C, mu=FM, nu=SM)
  fields(o.ScaleByRssState, sum_of_squares=SM)
  fields(o.ScaleByAdaDeltaState, e_g=SM, e_x=SM)
  fields(o.ScaleByAdanState, m=FM, v=FM, n=SM, g=P, t=R)
  fields(o.ScaleByRpropState, step_sizes=FM, prev_updates=FM)
  fields(o.ScaleByScheduleState, count=C)
  fields(T("ScaleByOptimisticGradientState"), is_initial_step=R, previous_gradient=P)
  fields(T("ScaleByDistanceOverGradientsState"), max_dist=P, grad_sum_of_squares=SM, init_params=P)
  fields(o.ScaleBySM3State, mu=SM.with_axes(_sm3_mu), nu=FM)
  fields(o.ScaleByLBFGSState, count=C, params=P, updates=P,
         diff_params_memory=_memory, diff_updates_memory=_memory, weights_memory=R)  # fmt: skip
  declarations.declare_known(o.FactoredState, count=C, v_row=SM, v_col=SM, v=SM)
  pr.register_state_rule(o.FactoredState, _factored_rule)
  fields(o.TraceState, trace=FM)
  fields(o.EmaState, count=C, ema=FM)
  fields(o.AddNoiseState, count=C, rng_key=R)
  fields(o.ApplyEvery, count=C, grad_acc=FM)
  fields(o.ZeroNansState, found_nan=P)
  fields(o.ScaleByBacktrackingLinesearchState, learning_rate=R, value=R, grad=P, info=R)
  fields(o.ScaleByZoomLinesearchState, learning_rate=R, value=R, grad=P, info=R)
  fields(T("WeightDecaySchedule"), count=C)
  fields(T("WrappedScheduleState"), count=C)
  # Combinators: the inner states are derived with the same parameters.
  fields(o.MaskedState, inner_state=N)
  fields(o.transforms.PartitionState, inner_states=N)
  fields(o.InjectHyperparamsState, count=C, hyperparams=R, inner_state=N)
  fields(o.InjectStatefulHyperparamsState, count=C, hyperparams=R, hyperparams_states=N,
         inner_state=N)  # fmt: skip
  fields(o.MultiStepsState, mini_step=R, gradient_step=R, inner_opt_state=N, acc_grads=FM,
         skip_state=N)  # fmt: skip
  fields(o.ApplyIfFiniteState, notfinite_count=C, last_finite=R, total_notfinite=R, inner_state=N)
  fields(o.ConditionallyMaskState, step=R, inner_state=N)
  fields(o.ConditionallyTransformState, inner_state=N, step=R)
  fields(o.LookaheadState, fast_state=_lookahead_fast, steps_since_sync=R)
  # Monitoring: measurements are whatever the measure returns; each is derived
  # like a nested state (a scalar is replicated, an array outside a rule raises).
  fields(o.transforms.MonitorState, measurements=N, measure_states=N)
  fields(o.transforms.SnapshotState, measurement=N)
  # optax.contrib.
  fields(c.ScaleByAdemamixState, count=C, count_m2=R, m1=FM, m2=FM, nu=SM)
  fields(c.ScaleBySimplifiedAdEMAMixState, t=R, m=FM, n=SM)
  fields(c.COCOBState, init_particles=P, cumulative_gradients=FM, scale=FM, subgradients=FM,
         reward=FM)  # fmt: skip
  fields(c.DAdaptAdamWState, exp_avg=FM, exp_avg_sq=SM, grad_sum=FM, estim_lr=R,
         numerator_weighted=R, count=C)  # fmt: skip
  fields(c.DoGState, is_init_step=R, init_params=P, max_dist=P, sum_sq_norm_grads=SM)
  fields(c.DoWGState, init_params=P, weighted_sq_norm_grads=SM, estim_sq_dist=SM)
  declarations.declare_known(c.GaLoreState, count=C, base_optimizer_state=N, projector=P)
  pr.register_state_rule(c.GaLoreState, _galore_rule)
  fields(c.MadgradState, count=C, grad_sum_sq=SM, s=FM, x0=P)
  fields(c.MechanicState, base_optimizer_state=N, count=C, r=R, m=R, v=R, s=R, x0=P)
  fields(c.MomoState, exp_avg=FM, barf=R, gamma=R, lb=R, count=C)
  fields(c.MomoAdamState, exp_avg=FM, exp_avg_sq=SM, barf=R, gamma=R, lb=R, count=C)
  fields(c.MuonState, count=C, mu=FM, ns_coeffs=R)
  fields(c.DifferentiallyPrivateAggregateState, rng_key=R)
  fields(c.ProdigyState, exp_avg=FM, exp_avg_sq=SM, grad_sum=FM, params0=P, estim_lr=R,
         numerator_weighted=R, count=C)  # fmt: skip
  fields(c.ReduceLROnPlateauState, scale=R, best_value=R, plateau_count=C, cooldown_count=C,
         count=C, avg_value=R)  # fmt: skip
  fields(c.SAMState, steps_since_sync=R, opt_state=N, adv_state=N, cache=P)
  fields(c.ScheduleFreeState, b1=R, weight_sum=R, step_count=C, max_lr=R,
         base_optimizer_state=N, z=P)  # fmt: skip
  fields(c.SophiaState, count=C, mu=FM, nu=SM, hessian_fn_state=N)
  fields(c.HutchinsonState, key=R)
  fields(c.SplitRealAndImaginaryState, inner_state=_split_complex)
  # optax.experimental aggregators (gradient accumulation).
  try:
    from optax.experimental import _aggregating as agg
  except ImportError:  # moved or gone in this optax: nothing to register
    return
  fields(agg.AccumulateAvgUpdatesState, micro_step=R, ready=R, avg_grad=FM)
  fields(agg.PerElementMeanAndSumSqDiffGradsState, micro_step=R, ready=R, mean_grads=FM,
         sum_sq_diff_grads=SM)  # fmt: skip
  fields(agg.PerElementMeanAndVarianceEMAState, count=C, ema_decay=R, mean_grads_ema=FM,
         variance_grads_ema=SM)  # fmt: skip


_register_builtin()
