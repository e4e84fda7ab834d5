"""Training at scale in the Equinox face, on an eqx.nn.MLP: accumulate equals
optax.MultiSteps bitwise under eqx.filter_jit, and the full stack (accumulate
over mixed_precision, ZeRO-1, state in pinned host memory) gives the
on-device numbers with float32 master copies of bfloat16 weights."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from tree_testing import assert_trees_equal

import optcore
import optcore_equinox


def make_model(dtype=jnp.float32):
  return eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(0), dtype=dtype)


X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)


def loss(model):
  out = jax.vmap(model)(X.astype(model.layers[0].weight.dtype))
  return jnp.sum(out.astype(jnp.float32) ** 2)


def train(model, opt, steps):
  @eqx.filter_jit
  def step(model, opt):
    return opt.update(eqx.filter_grad(loss)(model), model)

  for _ in range(steps):
    model, opt = step(model, opt)
  return model, opt


def test_accumulate_in_the_equinox_face_is_multisteps_bitwise():
  model = make_model()
  opt_def = optcore.accumulate(optcore.adam(0.05), every=2)
  ours, _ = train(model, optcore_equinox.Optimizer(opt_def, model), 5)
  tx = optax.MultiSteps(optax.adam(0.05), every_k_schedule=2)
  params, static = eqx.partition(model, eqx.is_inexact_array)
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    grads = jax.grad(lambda p: loss(eqx.combine(p, static)))(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(5):
    params, state = step(params, state)
  assert_trees_equal(eqx.filter(ours, eqx.is_inexact_array), params)


def test_the_stack_in_host_memory_gives_the_on_device_numbers():
  model = make_model(jnp.bfloat16)
  opt_def = optcore.accumulate(
    optcore.mixed_precision(optcore.adam(0.01), state_dtype=jnp.bfloat16, master_dtype=jnp.float32),
    every=2,
  )
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  host = optcore_equinox.Optimizer(opt_def, model).shard(
    model, mesh=mesh, state_axis="data", state_memory_kind="pinned_host"
  )
  ours, host = train(model, host, 4)
  on_device, _ = train(model, optcore_equinox.Optimizer(opt_def, model), 4)
  assert_trees_equal(eqx.filter(ours, eqx.is_array), eqx.filter(on_device, eqx.is_array))
  master = host.state.param_states.inner.master.layers[0].weight
  assert master.dtype == jnp.float32 and master.sharding.memory_kind == "pinned_host"
  assert_trees_equal(ours.layers[0].weight, master.astype(jnp.bfloat16))


def test_an_average_in_host_memory_comes_back_on_the_device():
  model = eqx.nn.Linear(4, 4, key=jax.random.key(0))
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  opt = optcore_equinox.Optimizer(optcore.ema(optcore.adam(1e-2), 0.9), model)
  opt = opt.shard(model, mesh=mesh, state_memory_kind="pinned_host")
  grads = jax.tree.map(jnp.ones_like, model)
  model, opt = eqx.filter_jit(lambda m, o: o.update(grads, m))(model, opt)
  average = opt.ema_params(model)
  assert average.weight.sharding.memory_kind == "device"
  assert average(jnp.ones(4)).shape == (4,)  # the matmul runs


def test_a_groups_average_fills_a_whole_model():
  model = eqx.nn.Linear(4, 2, key=jax.random.key(0))
  multi = optcore.MultiOptimizer(
    ("weight", optcore.ema(optcore.sgd(0.1), 0.5)), ("bias", optcore.sgd(0.1))
  )
  opt = optcore_equinox.Optimizer(multi, model)
  grads = jax.tree.map(jnp.ones_like, model)
  new_model, opt = opt.update(grads, model)
  average = opt.ema_params(new_model)
  np.testing.assert_allclose(average.weight, 0.5 * model.weight + 0.5 * new_model.weight)
  np.testing.assert_array_equal(average.bias, new_model.bias)  # no group averages the bias


def test_the_read_out_functions_take_the_equinox_optimizer():
  model = eqx.nn.Linear(4, 2, key=jax.random.key(0))
  schedule = optax.exponential_decay(1.0, 1, 0.5)
  opt_def = optcore.accumulate(optcore.ema(optcore.sgd(schedule), 0.5), every=1)
  opt = optcore_equinox.Optimizer(opt_def, model)
  new_model, opt = opt.update(jax.tree.map(jnp.ones_like, model), model)
  average = optcore.ema_params(opt, new_model)
  np.testing.assert_allclose(average.weight, 0.5 * model.weight + 0.5 * new_model.weight)
  assert float(optcore.current_hyper_params(opt)["learning_rate"]) == float(schedule(1))
  assert float(opt.current_hyper_params()["learning_rate"]) == float(schedule(1))


class _Named(eqx.Module):
  v: jax.Array
  q: jax.Array
  w: jax.Array


def test_an_attribute_named_like_a_moment_changes_nothing_in_low_bit_state():
  """Which state leaves are moments is declared on the state's type, not read from a path: a
  module attribute named ``v`` or ``q`` is stored as ``w`` is (every one quantized, the same
  numbers for the same values)."""
  leaf = jnp.linspace(-1.0, 1.0, 64 * 128).reshape(64, 128)
  model = _Named(leaf, leaf, leaf)
  opt_def = optcore.low_bit_state(optcore.adam(1e-2), bits=8, min_size=0)
  opt = optcore_equinox.Optimizer(opt_def, model)
  model, opt = opt.update(jax.tree.map(lambda x: 0.1 * x, model), model)
  mu, nu = opt.state.param_states.inner[0].mu, opt.state.param_states.inner[0].nu
  for moment in (mu, nu):
    assert all(isinstance(getattr(moment, n), optcore.QuantizedArray) for n in ("v", "q", "w"))
    assert_trees_equal(moment.v, moment.w)
    assert_trees_equal(moment.q, moment.w)
  assert_trees_equal(model.v, model.w)
