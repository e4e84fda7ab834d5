"""flax.optim (v0.5.3) through optcore_flax.optim: the original's layout, numbers and errors.

Each test pins one behaviour of the original (shared/REFERENCE.md and the
original's source): what its users' programs, tests and checkpoints rely on.
"""

from __future__ import annotations

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization, traverse_util
from flax.core import FrozenDict
from tree_testing import assert_trees_equal

import optcore
import optcore_flax
from optcore_flax import optim


def flax_traversal(build):
  """Today's Flax warns when a traversal is built (flax 0.5.3 did not)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return build()


# 1. MultiOptimizer and create(focus=...): ONE parameter-shaped state tree.


def test_focus_keeps_one_tree_with_none_for_the_leaves_outside_it():
  params = {"a": 0.0, "b": 0.0}
  focus = flax_traversal(lambda: traverse_util.t_identity["a"])
  optimizer = optim.GradientDescent(learning_rate=1.0).create(params, focus=focus)
  assert optimizer.state == optim.OptimizerState(0, {"a": (), "b": None})
  assert isinstance(optimizer.optimizer_def, optim.MultiOptimizer)
  assert len(optimizer.optimizer_def.hyper_params) == 1
  new = optimizer.apply_gradient({"a": -1.0, "b": -2.0})
  assert new.target == {"a": 1.0, "b": 0.0}
  assert new.state == optim.OptimizerState(1, {"a": (), "b": None})


def test_multi_optimizer_state_is_parameter_shaped_and_overrides_reach_every_group():
  from optcore_flax.optim.sgd import _GradientDescentHyperParams

  params = {"a": 0.0, "b": 0.0, "c": {}}
  t_a, t_b = flax_traversal(lambda: (traverse_util.t_identity["a"], traverse_util.t_identity["b"]))
  opt_def = optim.MultiOptimizer(
    (t_a, optim.GradientDescent(learning_rate=1.0)),
    (t_b, optim.GradientDescent(learning_rate=10.0)),
  )
  assert opt_def.hyper_params == [
    _GradientDescentHyperParams(1.0),
    _GradientDescentHyperParams(10.0),
  ]
  state = opt_def.init_state(params)
  assert state == optim.OptimizerState(0, {"a": (), "b": (), "c": {}})
  new_params, new_state = opt_def.apply_gradient(
    opt_def.hyper_params, params, state, {"a": -1.0, "b": -2.0, "c": {}}
  )
  assert new_params == {"a": 1.0, "b": 20.0, "c": {}}
  assert new_state == optim.OptimizerState(1, {"a": (), "b": (), "c": {}})
  overridden = opt_def.update_hyper_params(learning_rate=2.0)
  new_params, _ = opt_def.apply_gradient(overridden, params, state, {"a": -1.0, "b": -2.0, "c": {}})
  assert new_params == {"a": 2.0, "b": 4.0, "c": {}}


def make_dense_params():
  rng = np.random.default_rng(0)
  return {
    "Dense_0": {
      "kernel": rng.normal(size=(3, 4)).astype(np.float32),
      "bias": np.zeros(4, np.float32),
    },
    "Dense_1": {
      "kernel": rng.normal(size=(4, 2)).astype(np.float32),
      "bias": np.zeros(2, np.float32),
    },
    "scale": np.ones(2, np.float32),
  }


def test_multi_optimizer_state_dict_is_flax_optims_and_restores_its_checkpoint():
  params = jax.tree.map(jnp.asarray, make_dense_params())
  kernels = optim.ModelParamTraversal(lambda path, _: path.endswith("/kernel"))
  biases = optim.ModelParamTraversal(lambda path, _: path.endswith("/bias"))
  opt_def = optim.MultiOptimizer((kernels, optim.Adam(0.1)), (biases, optim.Momentum(0.1)))
  optimizer = opt_def.create(params)
  grads = jax.tree.map(jnp.ones_like, params)
  optimizer = optimizer.apply_gradient(grads).apply_gradient(grads)
  param_states = optimizer.state_dict()["state"]["param_states"]
  assert param_states["scale"] is None
  assert sorted(param_states["Dense_0"]["kernel"]) == ["grad_ema", "grad_sq_ema"]
  assert sorted(param_states["Dense_1"]["bias"]) == ["momentum"]

  # What flax 0.5.3 wrote: the same dict, as msgpack (None as nil), restores.
  written_by_flax = {
    "target": jax.tree.map(np.asarray, optimizer.target),
    "state": {
      "step": np.asarray(2, np.int32),
      "param_states": jax.tree.map(np.asarray, param_states),
    },
  }
  fresh = opt_def.create(params)
  restored = serialization.from_bytes(fresh, serialization.msgpack_serialize(written_by_flax))
  assert_trees_equal(restored, optimizer)
  # And a focus optimizer's checkpoint: the same layout with one group.
  head = optim.ModelParamTraversal(lambda path, _: path.startswith("/Dense_1/"))
  focused = optim.Adam(0.1).create(params, focus=head).apply_gradient(grads)
  focus_states = focused.state_dict()["state"]["param_states"]
  assert focus_states["Dense_0"] == {"bias": None, "kernel": None}
  assert sorted(focus_states["Dense_1"]["kernel"]) == ["grad_ema", "grad_sq_ema"]
  again = optim.Adam(0.1).create(params, focus=head).restore_state(focused.state_dict())
  np.testing.assert_array_equal(
    again.state.param_states["Dense_1"]["kernel"].grad_sq_ema,
    focused.state.param_states["Dense_1"]["kernel"].grad_sq_ema,
  )


def test_multi_optimizer_of_optax_groups_keeps_one_state_per_group():
  params = jax.tree.map(jnp.asarray, make_dense_params())
  opt_def = optcore.MultiOptimizer((r"kernel", optcore.adam(0.1)), (r"bias", optim.Momentum(0.1)))
  param_states = opt_def.create(params).state_dict()["state"]["param_states"]
  assert sorted(param_states) == ["0", "1"]  # optax's state is not per parameter
  assert param_states["1"]["Dense_0"]["kernel"] is None


# 2. flax.traverse_util's traversals are selectors.


def test_flax_traversals_select_like_flax_optim():
  params = jax.tree.map(jnp.asarray, make_dense_params())
  picks = flax_traversal(
    lambda: [
      traverse_util.ModelParamTraversal(lambda path, _: "kernel" in path),
      traverse_util.t_identity["Dense_1"],
      traverse_util.t_identity["Dense_0"]["bias"],
    ]
  )
  masks = [optcore.selector_mask(p, params) for p in picks]
  assert masks[0]["Dense_0"] == {"bias": False, "kernel": True} and masks[0]["scale"] is False
  assert masks[1]["Dense_1"] == {"bias": True, "kernel": True} and not masks[1]["Dense_0"]["kernel"]
  assert masks[2]["Dense_0"] == {"bias": True, "kernel": False} and not masks[2]["Dense_1"]["bias"]
  frozen = (
    optim.Adam(0.1)
    .create(FrozenDict(params), focus=picks[1])
    .apply_gradient(FrozenDict(jax.tree.map(jnp.ones_like, params)))
  )
  np.testing.assert_array_equal(frozen.target["Dense_0"]["kernel"], params["Dense_0"]["kernel"])
  assert not np.array_equal(frozen.target["Dense_1"]["kernel"], params["Dense_1"]["kernel"])


# 3. Overlapping traversals: flax.optim's message, then optcore's paths.


def test_overlapping_traversals_raise_flax_optims_value_error_under_jit():
  params = {"a": {"x": 0.0, "y": 0.0}, "b": {"y": 0, "z": 0.0}}
  t_a = optim.ModelParamTraversal(lambda path, _: path.endswith(("/x", "/y")))
  t_b = optim.ModelParamTraversal(
    lambda path, value: value.dtype == jnp.int32 or path.endswith("/z")
  )
  opt_def = optim.MultiOptimizer(
    (t_a, optim.GradientDescent(1.0)), (t_b, optim.GradientDescent(1.0))
  )
  for init in (opt_def.init_state, jax.jit(opt_def.init_state)):
    with pytest.raises(ValueError, match=r"^Multiple optimizers match the same leaves : ") as e:
      init(params)
    assert "{'a': {'x': [0], 'y': [0]}, 'b': {'y': [0, 1], 'z': [1]}}" in str(e.value)
    assert "/b/y (selectors 0 and 1)" in str(e.value)


# 4. ModelParamTraversal in the flax face.


def test_model_param_traversal_is_flaxs_and_refuses_anything_but_a_params_dict():
  traversal = optim.ModelParamTraversal(lambda *_: True)
  assert isinstance(traversal, traverse_util.ModelParamTraversal)
  with pytest.raises(ValueError):
    list(traversal.iterate([]))
  params = {"x": {"kernel": 1, "bias": 2, "y": {"kernel": 3, "bias": 4}, "z": {}}}
  seen = []
  kernels = optim.ModelParamTraversal(lambda path, _: seen.append(path) or "kernel" in path)
  for tree in (params, FrozenDict(params)):
    assert list(kernels.iterate(tree)) == [1, 3]
    doubled = kernels.update(lambda x: x + x, tree)
    assert doubled == type(tree)(
      {"x": {"kernel": 2, "bias": 2, "y": {"kernel": 6, "bias": 4}, "z": {}}}
    )
  assert set(seen) == {"/x/kernel", "/x/bias", "/x/y/kernel", "/x/y/bias"}


# 5. DynamicScale, against a float16 reference of flax.optim's definition.


def reference_dynamic_scale(loss16, grad_of_scaled, scale, fin_steps, interval):
  """One step of flax.optim's DynamicScale in NumPy: the scale as float16 where it
  meets the float16 loss, value (scale*loss)/scale in float16, grads float32/scale."""
  with np.errstate(over="ignore", invalid="ignore"):
    scale16 = np.float16(scale)
    value = np.float16(scale16 * loss16) / scale16
    grad = np.float32(grad_of_scaled(scale16)) / np.float32(scale)
  finite = bool(np.isfinite(grad))
  grow = fin_steps == interval
  new_scale = (scale * 2.0 if grow else scale) if finite else scale * 0.5
  new_steps = 0 if (grow or not finite) else fin_steps + 1
  return finite, value, new_scale, new_steps, grad


def test_dynamic_scale_returns_flax_optims_values_on_float16_overflow():
  loss_fn = lambda p: jnp.asarray(p, jnp.float16) ** 2
  p = jnp.asarray(1.0, jnp.float32)
  dyn_scale = optim.DynamicScale(growth_interval=2)
  step = jax.jit(lambda ds, p: ds.value_and_grad(loss_fn)(p))
  scale, fin_steps = 65536.0, 0
  # d(scale * p^2)/dp at p = 1, computed in float16 as the scaled loss is.
  grad_of_scaled = lambda scale16: np.float16(2.0) * scale16
  seen_overflow = seen_growth = False
  for _ in range(8):
    want_finite, want_value, scale, fin_steps, want_grad = reference_dynamic_scale(
      np.float16(1.0), grad_of_scaled, scale, fin_steps, 2
    )
    dyn_scale, finite, value, grad = step(dyn_scale, p)
    assert bool(finite) == want_finite
    assert value.dtype == jnp.float16 and grad.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(value), want_value)  # nan where flax gave nan
    np.testing.assert_array_equal(np.asarray(grad), want_grad)
    assert float(dyn_scale.scale) == scale and int(dyn_scale.fin_steps) == fin_steps
    seen_overflow |= not want_finite
    seen_growth |= want_finite and fin_steps == 0
  assert seen_overflow and seen_growth


def test_dynamic_scale_averages_after_dividing():
  grad_fn = optim.DynamicScale(scale=8.0).value_and_grad(
    lambda w: jnp.sum(w * jax.lax.axis_index("d")), axis_name="d"
  )
  _, finite, _, grad = jax.pmap(grad_fn, axis_name="d")(jnp.ones((1, 2)))
  assert bool(finite[0]) and grad.dtype == jnp.float32
  np.testing.assert_array_equal(grad, np.zeros((1, 2), np.float32))


# 6. flax.optim's Adafactor and RMSProp: their hyper-parameters, constructor-only flags.


def test_adafactor_has_flax_optims_eleven_hyper_parameters():
  from optcore_flax.optim.adafactor import _AdafactorHyperParams, _AdafactorParamState

  opt_def = optim.Adafactor(learning_rate=0.1, decay_rate=0.8, beta1=None, min_dim_size_to_factor=0)
  assert len(opt_def.hyper_params) == 11
  assert opt_def.hyper_params == _AdafactorHyperParams(
    0.1, True, True, None, 0.8, 0, 1.0, None, 0, 1e-30, 1e-3
  )
  state = opt_def.init_state(np.zeros((3, 2)))
  assert isinstance(state.param_states, _AdafactorParamState)
  assert [x.shape for x in state.param_states] == [(2,), (3,), (1,), (1,)]


@pytest.mark.parametrize(
  ("make", "override"),
  [
    (lambda: optim.Adafactor(0.1, min_dim_size_to_factor=2), {"factored": False}),
    (lambda: optim.Adafactor(0.1), {"multiply_by_parameter_scale": False}),
    (lambda: optim.Adafactor(0.1, min_dim_size_to_factor=2), {"min_dim_size_to_factor": 100}),
    (lambda: optim.RMSProp(0.1), {"centered": True}),
    (lambda: optim.RMSProp(0.1, centered=True), {"centered": False}),
  ],
)
def test_constructor_only_overrides_change_nothing_and_warn(make, override):
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)}
  grads = {"w": jnp.full((4, 3), 0.5)}
  plain = make().create(params).apply_gradient(grads)
  with pytest.warns(UserWarning, match=rf"\['{next(iter(override))}'\] have no effect"):
    overridden = make().create(params).apply_gradient(grads, **override)
  assert_trees_equal(overridden, plain)


# 7. WeightNorm: flax.optim's operation order, bitwise.


def test_weight_norm_merges_in_flax_optims_operation_order():
  params = np.ones((2, 2)) * 2.0
  opt_def = optim.WeightNorm(optim.Momentum(0.1))
  state = opt_def.init_state(params)
  assert jax.tree.map(np.shape, state.param_states) == optim.weight_norm._WeightNormParamState(
    direction_state=optim.momentum._MomentumParamState(momentum=(2, 2)),
    scale_state=optim.momentum._MomentumParamState(momentum=(1, 2)),
    direction=(2, 2),
    scale=(1, 2),
  )
  new_params, new_state = opt_def.apply_gradient(
    opt_def.hyper_params, params, state, np.ones((2, 2))
  )
  # flax.optim's result: 1.9 to the float32 ulp (the other order gives 1.9000002).
  np.testing.assert_array_equal(np.asarray(new_params), np.full((2, 2), np.float32(1.9)))
  # The order: direction * (scale * rsqrt(sum(direction^2) + eps)), with XLA's rsqrt as flax.
  d, s = new_state.param_states.direction, new_state.param_states.scale
  sq_norm = jnp.sum(jnp.square(d), axis=0, keepdims=True) + 1e-8
  np.testing.assert_array_equal(new_params, d * (s * jax.lax.rsqrt(sq_norm)))
  assert not np.array_equal(new_params, s * d / jnp.sqrt(sq_norm))


# The legacy namespace and the original's records.


def test_the_legacy_namespace_serves_flax_optims_submodules_and_records():
  optcore_flax.install_legacy_namespace()
  from flax.optim.adagrad import _AdagradHyperParams, _AdagradParamState
  from flax.optim.adam import _AdamHyperParams, _AdamParamState
  from flax.optim.momentum import _MomentumHyperParams
  from flax.optim.rmsprop import _RMSPropHyperParams, _RMSPropParamState

  assert sys.modules["flax.optim.adam"] is optim.adam
  assert optim.Adam(0.1, 0.2, 0.9, 0.01, 0.0).hyper_params == _AdamHyperParams(
    0.1, 0.2, 0.9, 0.01, 0.0
  )
  assert optim.Adam(0.1).hyper_params != _AdamHyperParams(0.1, 0.2, 0.9, 0.01, 0.0)
  assert optim.Momentum(0.1, 0.2).hyper_params == _MomentumHyperParams(0.1, 0.2, 0, False)
  assert optim.Adagrad(0.1, 0.01).hyper_params == _AdagradHyperParams(0.1, 0.01)
  assert optim.RMSProp(0.1, 0.9, 0.01).hyper_params == _RMSPropHyperParams(0.1, 0.9, 0.01, False)
  state = optim.Adagrad(0.1, 0.01).init_state(np.zeros((1,)))
  assert state == optim.OptimizerState(0, _AdagradParamState(np.zeros((1,))))
  assert optim.RMSProp(0.1).init_state(np.zeros(1)).param_states == _RMSPropParamState(
    np.zeros(1), None
  )
  new_params, new_state = optim.Adam(0.1, 0.2, 0.9, 0.01, 0.0).apply_gradient(
    _AdamHyperParams(0.1, 0.2, 0.9, 0.01, 0.0),
    np.array([1.0]),
    optim.OptimizerState(1, _AdamParamState(np.array([0.1]), np.array([0.9]))),
    np.array([4.0]),
  )
  # Adam's definition with t = 2: m = 0.2*0.1 + 0.8*4, v = 0.9*0.9 + 0.1*16.
  assert new_state == optim.OptimizerState(2, _AdamParamState(np.array([3.22]), np.array([2.41])))
  m_hat, v_hat = 3.22 / (1 - 0.2**2), 2.41 / (1 - 0.9**2)
  np.testing.assert_allclose(new_params, 1.0 - 0.1 * m_hat / (np.sqrt(v_hat) + 0.01), rtol=1e-6)
