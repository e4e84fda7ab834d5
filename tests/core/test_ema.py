"""optcore.ema: a moving average of the parameters in the optimizer state,
bitwise equal to the loop a user writes by hand beside raw optax."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, PartitionSpec

import optcore
from optcore import legacy


def make_params(dtype=jnp.float32) -> dict:
  key = jax.random.key(0)
  return {
    "w": jax.random.normal(key, (5, 3), dtype),
    "b": jax.random.normal(jax.random.fold_in(key, 1), (3,), dtype),
  }


def grads_at(i: int, params) -> dict:
  key = jax.random.key(100 + i)
  return jax.tree.map(lambda p: jax.random.normal(jax.random.fold_in(key, p.size), p.shape), params)


def assert_bitwise(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def by_hand(tx, params, steps, decay, debias=False):
  """Raw optax with the EMA written beside it, as in a user's train step."""
  state = tx.init(params)
  average = jax.tree.map(jnp.zeros_like if debias else jnp.copy, params)

  @jax.jit
  def step(p, s, e, g):
    u, s = tx.update(g, s, p)
    p = optax.apply_updates(p, u)
    e = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, e, p)
    return p, s, e

  for i in range(steps):
    params, state, average = step(params, state, average, grads_at(i, params))
  if debias:
    average = jax.tree.map(lambda e: e / (1 - jnp.float32(decay) ** steps), average)
  return params, average


@pytest.mark.parametrize("debias", [False, True])
@pytest.mark.parametrize(
  "name,kwargs",
  [("adam", {"learning_rate": 1e-2}), ("sgd", {"learning_rate": 0.1, "momentum": 0.9})],
)
def test_ema_equals_the_hand_written_loop_bitwise(name, kwargs, debias):
  params = make_params()
  opt = optcore.ema(getattr(optcore, name)(**kwargs), decay=0.99, debias=debias).create(params)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(6):
    opt = step(opt, grads_at(i, params))
  want_params, want_ema = by_hand(getattr(optax, name)(**kwargs), params, 6, 0.99, debias)
  assert_bitwise(opt.target, want_params)
  assert_bitwise(opt.ema_params, want_ema)
  assert int(opt.state.param_states.count) == 6 and int(opt.state.step) == 6


def test_ema_of_a_legacy_definition_and_in_float32_for_bfloat16_parameters():
  params = make_params(jnp.bfloat16)
  opt = optcore.ema(legacy.Momentum(0.1, beta=0.9), decay=0.9, dtype=jnp.float32).create(params)
  plain = legacy.Momentum(0.1, beta=0.9).create(params)
  average = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  for i in range(4):
    g = jax.tree.map(lambda x: x.astype(jnp.bfloat16), grads_at(i, params))
    opt, plain = opt.apply_gradient(g), plain.apply_gradient(g)
    average = jax.tree.map(
      lambda e, p: 0.9 * e + (1 - 0.9) * p.astype(e.dtype), average, plain.target
    )
  assert_bitwise(opt.target, plain.target)
  np.testing.assert_allclose(opt.ema_params["w"], average["w"], rtol=1e-6)
  assert opt.ema_params["w"].dtype == jnp.float32


def test_overrides_pass_through_and_the_state_round_trips():
  params = make_params()
  opt_def = optcore.ema(optcore.adam(1e-2), decay=0.9)
  opt = opt_def.create(params)
  opt = jax.jit(lambda o, g: o.apply_gradient(g, learning_rate=0.5))(opt, grads_at(0, params))
  plain = optcore.adam(1e-2).create(params).apply_gradient(grads_at(0, params), learning_rate=0.5)
  np.testing.assert_allclose(opt.target["w"], plain.target["w"], rtol=1e-6)
  saved = opt.state_dict()
  assert set(saved["state"]["param_states"]) == {"inner", "ema", "count"}
  restored = opt_def.create(params).restore_state(saved)
  assert_bitwise(restored.ema_params, opt.ema_params)
  axes = {"w": PartitionSpec("embed", "mlp"), "b": PartitionSpec("mlp")}
  logical = opt_def.derive_logical_axes(opt, axes).state.param_states
  assert logical.ema == axes and logical.count == PartitionSpec()


def test_accumulate_around_ema_averages_the_applied_updates_only():
  params = make_params()
  opt = optcore.accumulate(optcore.ema(optcore.sgd(0.1), decay=0.5), every=2).create(params)
  for i in range(4):
    opt = opt.apply_gradient(grads_at(i, params))
  assert int(opt.state.param_states.inner.count) == 2
  assert opt.ema_params.keys() == params.keys()


def test_ema_in_host_memory():
  params = make_params()
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  opt = optcore.ema(optcore.adam(1e-2)).create_sharded(
    params, mesh=mesh, state_axis="data", state_memory_kind="pinned_host"
  )
  opt = jax.jit(lambda o, g: o.apply_gradient(g))(opt, grads_at(0, params))
  assert opt.state.param_states.ema["w"].sharding.memory_kind == "pinned_host"


@pytest.mark.parametrize(
  "opt_def",
  [
    optcore.ema(optcore.adam(1e-3)),
    optcore.ema(optcore.sgd(0.1), decay=0.9, debias=True, dtype=jnp.float32),
    optcore.accumulate(optcore.ema(legacy.Adam(1e-3), decay=0.99), every=2),
  ],
  ids=repr,
)
def test_configs_round_trip(opt_def):
  config = optcore.config.to_config(opt_def)
  assert optcore.config.from_config(json.loads(json.dumps(config))) == opt_def


@pytest.mark.parametrize(
  "build,error,match",
  [
    (
      lambda: optcore.ema(optcore.sgd(0.1), decay=1.0),
      ValueError,
      r"decay must be a number in \[0, 1\)",
    ),
    (
      lambda: optcore.ema(optcore.sgd(0.1), debias="yes"),
      TypeError,
      "debias must be True or False",
    ),
    (lambda: optcore.ema(optcore.ema(optcore.sgd(0.1))), TypeError, "wraps ema twice"),
    (
      lambda: optcore.ema(optcore.sgd(0.1), dtype=jnp.int8),
      TypeError,
      "dtype must be a real floating",
    ),
    (lambda: optcore.grouped(optcore.ema(optcore.sgd(0.1))), TypeError, r"ema\(sgd\)"),
    (
      lambda: optcore.sgd(0.1).create({"w": jnp.ones(2)}).ema_params,
      TypeError,
      r"sgd keeps no moving average of the parameters: wrap the definition, optcore.ema\(",
    ),
  ],
)
def test_wrong_inputs_are_named(build, error, match):
  with pytest.raises(error, match=match):
    build()


@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_an_average_kept_in_host_memory_is_read_where_the_parameters_are(jitted):
  """With state_memory_kind="pinned_host", ema_params came back in host memory and the first
  matmul with it failed inside JAX (issue 37)."""
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  params = {"w": jnp.ones((4, 4))}
  opt_def = optcore.ema(optcore.adam(1e-2), 0.9)
  opt = opt_def.create_sharded(params, mesh=mesh, state_memory_kind="pinned_host")
  opt = jax.jit(lambda o, g: o.apply_gradient(g))(opt, {"w": jnp.ones((4, 4))})
  assert opt.state.param_states.ema["w"].sharding.memory_kind == "pinned_host"
  read = jax.jit(lambda o: o.ema_params) if jitted else (lambda o: o.ema_params)
  average = read(opt)["w"]
  assert average.sharding.memory_kind == "device"
  plain = optcore.ema(optcore.adam(1e-2), 0.9).create(params)
  plain = plain.apply_gradient({"w": jnp.ones((4, 4))})
  np.testing.assert_array_equal(
    average @ jnp.ones((4, 4)), plain.ema_params["w"] @ jnp.ones((4, 4))
  )


def test_an_average_kept_by_one_group_of_a_multi_optimizer_is_read_out():
  """ema_params of an EMA inside a MultiOptimizer group advised wrapping the whole
  MultiOptimizer in ema again (issue 37): the group's average, the other parameters as they
  are."""
  params = {"w": jnp.ones(3), "b": jnp.ones(2)}
  multi = optcore.MultiOptimizer(("w", optcore.ema(optcore.sgd(0.1), 0.9)), ("b", optcore.sgd(0.1)))
  opt = multi.create(params)
  plain = optcore.ema(optcore.sgd(0.1), 0.9).create({"w": params["w"]})
  for _ in range(3):
    opt = opt.apply_gradient({"w": jnp.ones(3), "b": jnp.ones(2)})
    plain = plain.apply_gradient({"w": jnp.ones(3)})
  np.testing.assert_array_equal(opt.ema_params["w"], plain.ema_params["w"])
  np.testing.assert_array_equal(opt.ema_params["b"], opt.target["b"])  # no group averages b
  assert multi.keeps_ema() and not optcore.MultiOptimizer(("w", optcore.sgd(0.1))).keeps_ema()
  with pytest.raises(TypeError, match="keeps no moving average"):
    _ = optcore.MultiOptimizer(("w|b", optcore.sgd(0.1))).create(params).ema_params


@pytest.mark.parametrize("dtype", [None, jnp.float32])
def test_a_step_that_donates_the_optimizer_takes_a_fresh_ema_optimizer(dtype):
  """The average starts as a copy of the parameters, not their buffers: a jitted step with
  donate_argnums=0 refused a fresh ema optimizer ("donate the same buffer twice")."""
  step = jax.jit(lambda opt, g: opt.apply_gradient(g), donate_argnums=(0,))
  opt = optcore.ema(optcore.adam(0.1), 0.9, dtype=dtype).create({"w": jnp.ones(3)})
  for _ in range(2):
    opt = step(opt, {"w": jnp.ones(3)})
  assert int(opt.state.step) == 2
