"""Partition rules: the logical axes of every leaf of every optax state."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from optimizer_catalogue import CASES
from sharding_setup import param_for

import optcore
from optcore import partitioning

# Every dimension size differs, so a leaf's shape tells which dimensions it kept.
PARAMS = {
  "dense": {"kernel": jnp.zeros((6, 16)), "bias": jnp.zeros((16,))},
  "attn": jnp.zeros((4, 10, 12)),
  "scale": jnp.zeros(()),
}
AXES = {
  "dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")},
  "attn": P("layers", "embed", "heads"),
  "scale": None,
}
FULL_AXES = {**AXES, "scale": P()}
MASK = {"dense": {"kernel": True, "bias": False}, "attn": True, "scale": False}


def _combinators() -> dict[str, object]:
  adam = lambda: optax.adam(0.1)
  return {
    "chain": optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9)),
    "masked": optax.masked(optax.adam(0.1), MASK),
    "masked_prefix": optax.masked(
      optax.adafactor(0.1, min_dim_size_to_factor=2), {"dense": False, "attn": True, "scale": False}
    ),
    "partition": optax.partition(
      {"a": adam(), "b": optax.sgd(0.1, momentum=0.9)},
      {"dense": {"kernel": "a", "bias": "b"}, "attn": "a", "scale": "b"},
    ),
    "inject_hyperparams": optax.inject_hyperparams(optax.adam)(learning_rate=0.1),
    "inject_schedule": optax.inject_hyperparams(optax.adam)(
      learning_rate=optax.linear_schedule(0.1, 0.0, 10)
    ),
    "inject_stateful": optax.inject_hyperparams(optax.adam)(
      learning_rate=optax.schedules.WrappedSchedule(optax.linear_schedule(0.1, 0.0, 10))
    ),
    "multi_steps": optax.MultiSteps(adam(), every_k_schedule=2),
    "multi_steps_skip": optax.MultiSteps(
      adam(), every_k_schedule=2, should_skip_update_fn=optax.skip_not_finite
    ),
    "apply_if_finite": optax.apply_if_finite(adam(), max_consecutive_errors=3),
    "conditionally_mask": optax.transforms.conditionally_mask(adam(), lambda step: step > 1),
    "conditionally_transform": optax.transforms.conditionally_transform(
      adam(), lambda step: step > 1
    ),
    "apply_every": optax.apply_every(2),
    "monitor": optax.transforms.monitor({"norm": optax.tree.norm}),
    "snapshot": optax.transforms.snapshot("norm", optax.tree.norm),
    "zero_nans": optax.zero_nans(),
    "ema": optax.ema(0.9),
    "add_noise": optax.add_noise(0.1, 0.5, 0),
    "rmsprop_centered_bias_correction": optax.rmsprop(0.1, centered=True, bias_correction=True),
    "optimistic": optax.optimistic_gradient_descent(0.1),
    "adafactor_factored": optax.adafactor(0.1, min_dim_size_to_factor=2),
    "adafactor_momentum": optax.adafactor(0.1, min_dim_size_to_factor=2, momentum=0.9),
    "reduce_on_plateau": optax.chain(optax.sgd(0.1), optax.contrib.reduce_on_plateau()),
    "decayed_weights_schedule": optax.add_decayed_weights(optax.linear_schedule(0.1, 0.0, 10)),
  }


def _state_cases():
  for case in CASES:
    yield pytest.param(lambda c=case: c.optax_factory()(**c.optax_kwargs()), id=case.name)
  for name in _combinators():
    yield pytest.param(lambda n=name: _combinators()[n], id=name)


def _check_axes(state, axes, params, full_axes) -> None:
  """Same structure; every spec has its leaf's rank; parameter-shaped leaves at a
  parameter's path carry that parameter's axes; scalars are replicated."""
  state_leaves, state_def = jax.tree_util.tree_flatten_with_path(state)
  axes_leaves, axes_def = jax.tree_util.tree_flatten_with_path(axes)
  assert axes_def == state_def
  param_at = {
    tuple(keys): (p, s)
    for (keys, p), s in zip(
      jax.tree_util.tree_flatten_with_path(params)[0],
      jax.tree.leaves(full_axes),
      strict=True,
    )
  }
  for (keys, leaf), (_, spec) in zip(state_leaves, axes_leaves, strict=True):
    assert isinstance(spec, P), (keys, spec)
    assert len(spec) == leaf.ndim, (jax.tree_util.keystr(keys), leaf.shape, spec)
    if leaf.ndim == 0:
      assert spec == P()
    param = param_for(keys, param_at, leaf.shape)
    if param is not None and leaf.ndim:
      assert spec == param[1], (jax.tree_util.keystr(keys), spec, param[1])


@pytest.mark.parametrize("make", list(_state_cases()))
def test_every_leaf_gets_axes_of_its_rank(make):
  tx = make()
  state = jax.eval_shape(tx.init, PARAMS)
  axes = optcore.derive_optax_logical_axes(state, AXES, PARAMS)
  _check_axes(state, axes, PARAMS, FULL_AXES)


def test_lookahead_derives_the_fast_state_from_the_fast_params():
  params = optax.LookaheadParams.init_synced(PARAMS)
  axes = optax.LookaheadParams(AXES, AXES)
  state = optax.lookahead(optax.adam(0.1), 2, 0.5).init(params)
  derived = optcore.derive_optax_logical_axes(state, axes, params)
  _check_axes(state.fast_state, derived.fast_state, PARAMS, FULL_AXES)
  assert derived.fast_state[0].mu == FULL_AXES


def test_complex_params_split_into_halves_with_the_params_axes():
  params = {"w": jnp.zeros((4, 6), jnp.complex64), "b": jnp.zeros((6,))}
  tx = optax.contrib.split_real_and_imaginary(optax.adam(0.1))
  derived = optcore.derive_optax_logical_axes(
    tx.init(params), {"w": P("a", "b"), "b": P("b")}, params
  )
  mu = derived.inner_state[0].mu
  assert (mu["w"].real, mu["w"].imaginary, mu["b"]) == (P("a", "b"), P("a", "b"), P("b"))


def test_factored_accumulators_keep_the_axes_that_survive_the_reduction():
  # optax reduces the largest (v_row) and the second largest (v_col) dimension.
  params = {"w": jnp.zeros((6, 16, 10))}
  state = optax.adafactor(0.1, min_dim_size_to_factor=2).init(params)[0]
  derived = optcore.derive_optax_logical_axes(state, {"w": P("a", "b", "c")}, params)
  assert state.v_row["w"].shape == (6, 10) and derived.v_row["w"] == P("a", "c")
  assert state.v_col["w"].shape == (6, 16) and derived.v_col["w"] == P("a", "b")
  assert state.v["w"].shape == (1,) and derived.v["w"] == P(None)


def test_unfactored_parameters_keep_a_parameter_shaped_second_moment():
  params = {"w": jnp.zeros((6, 16))}  # below min_dim_size_to_factor: not factored
  state = optax.adafactor(0.1).init(params)[0]
  derived = optcore.derive_optax_logical_axes(state, {"w": P("a", "b")}, params)
  assert state.v["w"].shape == (6, 16) and derived.v["w"] == P("a", "b")
  assert derived.v_row["w"] == derived.v_col["w"] == P(None)


def test_sm3_keeps_one_axis_per_dimension_accumulator():
  params = {"w": jnp.zeros((6, 16, 10)), "b": jnp.zeros((16,))}
  state = optax.sm3(0.1).init(params)[0]
  derived = optcore.derive_optax_logical_axes(state, {"w": P("a", "b", "c"), "b": P("b")}, params)
  assert [x.shape for x in state.mu["w"]] == [(6,), (16,), (10,)]
  assert derived.mu["w"] == [P("a"), P("b"), P("c")]
  assert derived.mu["b"] == [P("b")]


def test_lbfgs_memory_stacks_on_a_replicated_leading_axis():
  state = optax.lbfgs(memory_size=3).init(PARAMS)[0]
  derived = optcore.derive_optax_logical_axes(state, AXES, PARAMS)
  assert state.diff_params_memory["attn"].shape == (3, 4, 10, 12)
  assert derived.diff_params_memory["attn"] == P(None, "layers", "embed", "heads")
  assert derived.weights_memory == P(None)


def test_galore_projector_keeps_the_larger_side_and_proxies_the_smaller():
  params = {"w": jnp.zeros((6, 16))}
  state = optax.contrib.galore(0.1, rank=2).init(params)[0]
  derived = optcore.derive_optax_logical_axes(state, {"w": P("embed", "mlp")}, params)
  assert state.projector["w"].shape == (16, 2) and derived.projector["w"] == P("mlp", None)
  assert state.base_optimizer_state.mu["w"].shape == (6, 2)
  assert derived.base_optimizer_state.mu["w"] == P("embed", None)


def test_masked_out_leaves_keep_their_masked_nodes():
  state = optax.masked(optax.adam(0.1), MASK).init(PARAMS)
  derived = optcore.derive_optax_logical_axes(state, AXES, PARAMS)
  mu = derived.inner_state[0].mu
  assert mu["dense"]["bias"] == optax.MaskedNode() and mu["scale"] == optax.MaskedNode()
  assert mu["dense"]["kernel"] == P("embed", "mlp")


def test_short_and_tuple_axes_are_padded_to_full_rank():
  params = {"w": jnp.zeros((6, 16)), "v": jnp.zeros((6, 16))}
  state = optax.adam(0.1).init(params)
  derived = optcore.derive_optax_logical_axes(state, {"w": P("embed"), "v": ("a", "b")}, params)
  assert derived[0].mu == {"w": P("embed", None), "v": P("a", "b")}


def test_axes_longer_than_the_parameter_name_the_parameter():
  state = optax.adam(0.1).init(PARAMS)
  bad = {**AXES, "dense": {**AXES["dense"], "bias": P("mlp", "embed")}}
  with pytest.raises(optcore.PartitionRuleError, match=r"'/dense/bias'.*2 entries.*1 dim"):
    optcore.derive_optax_logical_axes(state, bad, PARAMS)


def test_axes_of_another_structure_are_refused():
  state = optax.adam(0.1).init(PARAMS)
  with pytest.raises(optcore.PartitionRuleError, match="structure of the parameters"):
    optcore.derive_optax_logical_axes(state, {"dense": AXES["dense"]}, PARAMS)


class _CustomState(NamedTuple):
  count: jax.Array
  trace: dict


def _custom(decay: float = 0.9) -> optax.GradientTransformation:
  def init(params):
    return _CustomState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params))

  def update(updates, state, params=None):
    trace = jax.tree.map(lambda t, g: decay * t + g, state.trace, updates)
    return trace, _CustomState(state.count + 1, trace)

  return optax.GradientTransformation(init, update)


@pytest.fixture
def registry():
  """Restores the rule registry after a test registers into it."""
  saved = dict(optcore.OptaxStatePartitionRules._RULES)
  yield
  optcore.OptaxStatePartitionRules._RULES.clear()
  optcore.OptaxStatePartitionRules._RULES.update(saved)


def test_an_unregistered_state_names_its_type_and_the_fix(registry):
  state = optax.chain(optax.clip(1.0), _custom()).init(PARAMS)
  with pytest.raises(optcore.PartitionRuleError) as info:
    optcore.derive_optax_logical_axes(state, AXES, PARAMS)
  message = str(info.value)
  assert "_CustomState" in message and "at '/1'" in message
  assert "@partitioning.register_state_rule(_CustomState)" in message
  assert "trace=partitioning.like_params(state.trace, params_axes)" in message


def test_a_registered_rule_is_used_inside_combinators(registry):
  @optcore.register_state_rule(_CustomState)
  def _(state, params_axes, params):
    return _CustomState(count=None, trace=partitioning.like_params(state.trace, params_axes))

  tx = optax.chain(optax.clip(1.0), optax.masked(_custom(), MASK))
  state = tx.init(PARAMS)
  derived = optcore.derive_optax_logical_axes(state, AXES, PARAMS)
  trace = derived[1].inner_state.trace
  assert trace["attn"] == P("layers", "embed", "heads") and trace["scale"] == optax.MaskedNode()
  assert derived[1].inner_state.count == P()


def test_t5x_style_two_argument_rules_are_accepted(registry):
  optcore.OptaxStatePartitionRules.register(
    _CustomState, lambda state, params_axes: _CustomState(count=None, trace=params_axes)
  )
  derived = optcore.derive_optax_logical_axes(_custom().init(PARAMS), AXES, PARAMS)
  assert derived.trace == FULL_AXES


def test_a_rule_of_the_wrong_rank_is_caught(registry):
  optcore.register_state_rule(
    _CustomState,
    lambda state, axes, params: _CustomState(None, jax.tree.map(lambda _: P("x"), state.trace)),
  )
  with pytest.raises(
    optcore.PartitionRuleError,
    match=r"_CustomState at '/trace/attn'.*1 entries.*shape \(4, 10, 12\)",
  ):
    optcore.derive_optax_logical_axes(_custom().init(PARAMS), AXES, PARAMS)


def test_a_non_scalar_array_outside_any_state_type_is_not_silently_replicated():
  state = (optax.EmptyState(), {"buffer": jnp.zeros((6, 16)), "count": jnp.zeros([], jnp.int32)})
  with pytest.raises(optcore.PartitionRuleError, match=r"'/1/buffer'.*shape \(6, 16\)"):
    optcore.derive_optax_logical_axes(state, AXES, PARAMS)
  derived = optcore.derive_optax_logical_axes(
    (optax.EmptyState(), {"n": jnp.zeros(())}), AXES, PARAMS
  )
  assert derived[1]["n"] == P()


def test_every_optax_state_type_has_a_rule():
  """Walks optax's modules for NamedTuple state types; a new one fails here."""
  import importlib
  import pkgutil
  import sys

  for module in pkgutil.walk_packages(optax.__path__, "optax.", onerror=lambda _: None):
    if "test" not in module.name:
      try:
        importlib.import_module(module.name)
      except Exception:  # optional dependencies of optax's extras
        pass
  not_states = {
    "GradientTransformation", "GradientTransformationExtraArgs", "LookaheadParams",
    "GaLoreDimensionNumbers", "MuonDimensionNumbers", "SplitRealAndImaginaryArrays",
    "Aggregator", "Aux", "BacktrackingLinesearchInfo", "ZoomLinesearchInfo",
    # Loop states of the line searches, never stored in an optimizer state.
    "BacktrackingLineSearchState", "ZoomLinesearchState",
  }  # fmt: skip
  missing = sorted(
    f"{obj.__module__}.{obj.__qualname__}"
    for name, mod in list(sys.modules.items())
    if name.startswith("optax")
    for obj in vars(mod).values()
    if isinstance(obj, type)
    and issubclass(obj, tuple)
    and hasattr(obj, "_fields")
    and obj.__module__.startswith("optax")
    and obj.__name__ not in not_states
    and partitioning.rule_for(obj) is None
  )
  assert not missing


def test_t5x_derive_params_axes_maps_a_parameter_shaped_field():
  masked = {"dense": optax.MaskedNode(), "attn": jnp.zeros((4, 10, 12)), "scale": jnp.zeros(())}
  derived = optcore.OptaxStatePartitionRules.derive_params_axes(
    masked, partitioning.normalize_param_axes(PARAMS, AXES)
  )
  assert derived == {"dense": optax.MaskedNode(), "attn": FULL_AXES["attn"], "scale": P()}


# The Optimizer-level API.


def _flat_keys(state_dict, prefix=()):
  out = set()
  for k, v in state_dict.items():
    if isinstance(v, dict) and v:
      out |= _flat_keys(v, (*prefix, k))
    else:
      out.add((*prefix, k))
  return out


@pytest.mark.parametrize(
  "opt_def",
  [
    optcore.adafactor(0.1, min_dim_size_to_factor=2),
    optcore.MultiOptimizer(
      (r"kernel|attn", optcore.adafactor(0.1, min_dim_size_to_factor=2)),
      (r"bias", optcore.sgd(0.1, momentum=0.9)),
    ),
    optcore.MultiOptimizer(
      (
        r"dense",
        optcore.MultiOptimizer((r"kernel", optcore.adam(0.1)), (r"bias", optcore.lion(0.1))),
      ),
      (r"attn", optcore.sm3(0.1)),
    ),
  ],
  ids=["adafactor", "multi", "nested_multi"],
)
def test_derive_logical_axes_gives_an_optimizer_of_specs_that_round_trips(opt_def):
  opt = opt_def.create(PARAMS)
  axes = opt_def.derive_logical_axes(opt, AXES)
  assert isinstance(axes, optcore.Optimizer) and axes.target == FULL_AXES
  assert axes.state.step == P()
  # One spec per state leaf, None exactly where the state holds None.
  is_none = lambda x: x is None
  state_leaves, state_def = jax.tree.flatten(opt.state, is_leaf=is_none)
  axes_leaves, axes_def = jax.tree.flatten(axes.state, is_leaf=is_none)
  assert state_def == axes_def
  for leaf, spec in zip(state_leaves, axes_leaves, strict=True):
    assert (leaf is None) == (spec is None)
    assert leaf is None or len(spec) == leaf.ndim
  # The state dict has the optimizer's keys; restoring it gives the same axes.
  assert _flat_keys(axes.state_dict()) == _flat_keys(opt.state_dict())
  assert axes.restore_state(axes.state_dict()) == axes
  # An abstract optimizer (no memory allocated) gives the same axes.
  assert opt_def.derive_logical_axes(jax.eval_shape(opt_def.create, PARAMS), AXES) == axes


def test_multi_optimizer_groups_derive_through_their_own_rules():
  opt_def = optcore.MultiOptimizer(
    (r"kernel|attn", optcore.adafactor(0.1, min_dim_size_to_factor=2)), (r"bias", optcore.adam(0.1))
  )
  axes = opt_def.derive_logical_axes(opt_def.create(PARAMS), AXES)
  factored, adam = axes.state.param_states
  assert factored[0].v_row == {
    "dense": {"kernel": P("embed"), "bias": None},
    "attn": P("layers", "embed"),
    "scale": None,
  }
  assert adam[0].mu == {"dense": {"kernel": None, "bias": P("mlp")}, "attn": None, "scale": None}


class _Sign(optcore.OptimizerDef):
  def __init__(self, learning_rate=0.1):
    super().__init__(optcore.HyperParams(learning_rate=learning_rate))

  def init_param_state(self, param):
    return {"momentum": jnp.zeros_like(param), "norm": jnp.zeros(())}

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    return param - hyper_params.learning_rate * jnp.sign(grad), state


class _Rowwise(_Sign):
  def init_param_state(self, param):
    return {"rows": jnp.zeros(param.shape[:1])}


def test_per_parameter_definitions_derive_param_shaped_and_scalar_state():
  axes = _Sign().derive_logical_axes(_Sign().create(PARAMS), AXES)
  assert axes.state.param_states["attn"] == {"momentum": P("layers", "embed", "heads"), "norm": P()}


def test_per_parameter_state_of_another_shape_asks_for_an_override():
  params = {"w": jnp.zeros((6, 16))}
  with pytest.raises(optcore.PartitionRuleError, match=r"shape \(6,\).*derive_param_state_axes"):
    _Rowwise().derive_logical_axes(_Rowwise().create(params), {"w": P("a", "b")})


# Logical axes to the mesh.


def test_logical_to_mesh_axes_follows_flax_priority_rules():
  # The example of flax.linen.logical_to_mesh_axes' documentation.
  rules = (("batch", "X"), ("features", "X"), ("heads", "Y"), ("batch", "Z"))
  spec = optcore.logical_to_mesh_axes(P("batch", "length", "heads", "features"), rules)
  assert spec == P("X", None, "Y", None)
  # 'batch' takes X first, so 'features' finds X used and stays replicated.
  assert optcore.logical_to_mesh_axes(P("features", "batch"), rules) == P(None, "X")
  assert optcore.logical_to_mesh_axes(P("a", None), None) == P("a", None)


def test_logical_rules_errors_are_clear():
  with pytest.raises(optcore.PartitionRuleError, match="more than once"):
    optcore.logical_to_mesh_axes(P("embed", "embed"), [("embed", "x")])
  with pytest.raises(optcore.PartitionRuleError, match=r"\('embed', 3\).*pair"):
    optcore.logical_to_mesh_axes(P("embed"), [("embed", 3)])
  with pytest.raises(optcore.PartitionRuleError, match="sequence of"):
    optcore.logical_to_mesh_axes(P("embed"), "embed")


def test_a_mesh_axis_the_mesh_lacks_names_the_path():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  with pytest.raises(optcore.PartitionRuleError, match=r"'/bias'.*\['model'\].*\['data'\]"):
    optcore.logical_to_mesh_sharding(AXES["dense"] | {"bias": P("mlp")}, mesh, [("mlp", "model")])


def test_create_sharded_on_one_device_equals_create():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
  opt_def = optcore.adafactor(0.1, min_dim_size_to_factor=2)
  sharded = opt_def.create_sharded(PARAMS, AXES, mesh, [("mlp", "model")])
  plain = opt_def.create(PARAMS)
  assert jax.tree.structure(sharded) == jax.tree.structure(plain)
  for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain), strict=True):
    np.testing.assert_array_equal(a, b)
  assert sharded.state.param_states[0].v_col["dense"]["kernel"].sharding.spec == P("model")
