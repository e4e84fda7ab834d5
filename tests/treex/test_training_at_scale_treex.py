"""Training at scale in the Treex face, on a treeo module: accumulate equals
optax.MultiSteps bitwise, mixed_precision keeps float32 master copies of
bfloat16 parameters, and `shard(..., state_memory_kind="pinned_host")` keeps
the state in host memory through Treex's jitted loop."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import treeo as to
from jax.sharding import Mesh
from tree_testing import assert_trees_equal

import optcore
from optcore_treex import Optimizer


class Dense(to.Tree):
  kernel: jnp.ndarray = to.field(node=True)
  bias: jnp.ndarray = to.field(node=True)

  def __init__(self, dtype=jnp.float32):
    rng = np.random.default_rng(0)
    self.kernel = jnp.asarray(rng.normal(size=(4, 8)), dtype)
    self.bias = jnp.zeros(8, dtype)


def loss(params):
  x = jnp.linspace(-1.0, 1.0, 8, dtype=params.kernel.dtype).reshape(2, 4)
  return jnp.sum(jnp.tanh(x @ params.kernel + params.bias[None]).astype(jnp.float32) ** 2)


def train(optimizer, params, steps):
  @jax.jit
  def step(params, optimizer):
    return optimizer.update(jax.grad(loss)(params), params), optimizer

  for _ in range(steps):
    params, optimizer = step(params, optimizer)
  return params, optimizer


def test_accumulate_in_the_treex_face_is_multisteps_bitwise():
  opt_def = optcore.accumulate(optcore.adam(0.05), every=3)
  ours, optimizer = train(Optimizer(opt_def).init(Dense()), Dense(), 7)
  tx = optax.MultiSteps(optax.adam(0.05), every_k_schedule=3)
  params, state = Dense(), tx.init(Dense())
  step = jax.jit(
    lambda p, s: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(jax.grad(loss)(p), s, p))
  )
  for _ in range(7):
    params, state = step(params, state)
  assert_trees_equal(ours, params)
  assert int(optimizer.step) == 2 and int(optimizer.opt_state.mini_step) == 1


def test_master_copies_and_host_memory_in_the_treex_face():
  opt_def = optcore.mixed_precision(
    optcore.adam(0.01), state_dtype=jnp.bfloat16, master_dtype=jnp.float32
  )
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  start = Dense(jnp.bfloat16)
  host = (
    Optimizer(opt_def)
    .init(start)
    .shard(start, mesh=mesh, state_axis="data", state_memory_kind="pinned_host")
  )
  ours, host = train(host, start, 4)
  on_device, _ = train(Optimizer(opt_def).init(start), start, 4)
  assert_trees_equal(ours, on_device)
  master = host.opt_state.master
  assert master.kernel.dtype == jnp.float32
  assert master.kernel.sharding.memory_kind == "pinned_host"
  assert_trees_equal(ours.kernel, master.kernel.astype(jnp.bfloat16))


def test_the_read_out_functions_take_the_treex_optimizer():
  params = {"w": jnp.array([1.0, 2.0])}
  schedule = optax.exponential_decay(1.0, 1, 0.5)
  optimizer = Optimizer(
    optcore.mixed_precision(optcore.ema(optcore.sgd(schedule), 0.5), master_dtype=jnp.float32)
  ).init(params)
  new_params = optimizer.update({"w": jnp.ones(2)}, params)
  np.testing.assert_allclose(
    optcore.ema_params(optimizer)["w"], 0.5 * params["w"] + 0.5 * new_params["w"]
  )
  assert_trees_equal(optcore.ema_params(optimizer), optimizer.ema_params)
  assert float(optcore.current_hyper_params(optimizer)["learning_rate"]) == float(schedule(1))
