"""Training at scale through the Flax face's optax door: `as_optax()` of
`optcore.accumulate` and `optcore.mixed_precision` in a Linen TrainState and
an nnx.Optimizer, and optimizer state kept in pinned host memory there; and
the flax.optim face's own definitions wrapped."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from tree_testing import assert_trees_equal

import optcore
import optcore_flax  # noqa: F401  (registers the Flax layout)
from optcore_flax import optim


def _linen_train(tx, steps=5, dtype=jnp.float32):
  from flax import linen as nn
  from flax.training import train_state

  model = nn.Dense(3, param_dtype=dtype, dtype=dtype)
  x = jnp.linspace(-1.0, 1.0, 8, dtype=dtype).reshape(4, 2)
  variables = model.init(jax.random.key(0), x)
  loss = lambda p: jnp.sum(model.apply(p, x).astype(jnp.float32) ** 2)
  state = train_state.TrainState.create(apply_fn=model.apply, params=variables, tx=tx)
  step = jax.jit(lambda s: s.apply_gradients(grads=jax.grad(loss)(s.params)))
  for _ in range(steps):
    state = step(state)
  return state


def test_accumulate_as_optax_in_a_train_state_is_multisteps_bitwise():
  ours = _linen_train(optcore.accumulate(optcore.adam(0.1), every=2).as_optax())
  reference = _linen_train(
    optax.MultiSteps(optax.adam(0.1), every_k_schedule=2).gradient_transformation()
  )
  assert_trees_equal(ours.params, reference.params)
  assert int(ours.opt_state.step) == 2 and int(ours.opt_state.param_states.mini_step) == 1


def test_mixed_precision_as_optax_in_an_nnx_optimizer():
  from flax import nnx

  x = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.bfloat16).reshape(4, 2)

  def train(tx):
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    for _ in range(4):
      grads = nnx.grad(lambda m: jnp.sum(m(x).astype(jnp.float32) ** 2))(model)
      optimizer.update(model, grads)
    return model, optimizer

  opt_def = optcore.mixed_precision(
    optcore.adam(0.01), state_dtype=jnp.bfloat16, master_dtype=jnp.float32
  )
  model, optimizer = train(opt_def.as_optax())
  state = optimizer.opt_state
  master = jax.tree.leaves(state.param_states.master)
  assert master and {m.dtype for m in master} == {jnp.dtype(jnp.float32)}
  mu = jax.tree.leaves(state.param_states.inner[0].mu)
  assert {m.dtype for m in mu} == {jnp.dtype(jnp.bfloat16)}
  # The parameters are the master copies rounded to bfloat16 (as_optax's
  # updates new - old are exact in bfloat16 for steps this small).
  params = jax.tree.leaves(nnx.state(model, nnx.Param))
  for p, m in zip(sorted(params, key=jnp.size), sorted(master, key=jnp.size), strict=True):
    np.testing.assert_array_equal(np.asarray(p), np.asarray(m.astype(jnp.bfloat16)))


def test_train_state_keeps_its_optimizer_state_in_pinned_host_memory():
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  opt_def = optcore.accumulate(optcore.adam(0.1), every=2)
  on_device = _linen_train(opt_def.as_optax(), steps=3)

  from flax import linen as nn
  from flax.training import train_state

  model = nn.Dense(3)
  x = jnp.linspace(-1.0, 1.0, 8).reshape(4, 2)
  variables = model.init(jax.random.key(0), x)
  state = train_state.TrainState.create(
    apply_fn=model.apply, params=variables, tx=opt_def.as_optax()
  )
  shardings = optcore.adapter.state_shardings(
    opt_def, state.opt_state, variables, None, mesh, state_memory_kind="pinned_host"
  )
  state = state.replace(opt_state=jax.device_put(state.opt_state, shardings))
  loss = lambda p: jnp.sum(model.apply(p, x) ** 2)
  step = jax.jit(lambda s: s.apply_gradients(grads=jax.grad(loss)(s.params)))
  for _ in range(3):
    state = step(state)
    kinds = {x.sharding.memory_kind for x in jax.tree.leaves(state.opt_state) if x.ndim}
    assert kinds == {"pinned_host"}
  assert_trees_equal(state.params, on_device.params)


def test_flax_optim_definitions_accumulate_as_the_core_does():
  params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)}
  gs = [{"w": jnp.full((2, 3), float(i + 1))} for i in range(4)]
  opt = optcore.accumulate(optim.Momentum(0.1, beta=0.9), every=2).create(params)
  for g in gs:
    opt = opt.apply_gradient(g)
  plain = optim.Momentum(0.1, beta=0.9).create(params)
  for a, b in zip(gs[::2], gs[1::2], strict=True):
    plain = plain.apply_gradient(jax.tree.map(lambda x, y: x + (y - x) / 2, a, b))
  assert_trees_equal(opt.target, plain.target)
  assert_trees_equal(opt.state.param_states.inner, plain.state.param_states)
