"""optcore.ema through the Flax face: flax.optim's Optimizer reads `ema_params`
in the target's FrozenDict, and a Linen TrainState built on ``as_optax()`` reads
it with ``opt_def.ema_params(state.opt_state)``, equal to a hand-written EMA."""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tree_testing import assert_trees_equal

import optcore
from optcore_flax import optim


def test_flax_optim_optimizer_reads_its_average_as_a_frozendict():
  params = flax.core.freeze({"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}})
  opt = optcore.ema(optim.Adam(0.1), decay=0.5).create(params)
  plain = optim.Adam(0.1).create(params)
  average = params
  for i in range(3):
    g = jax.tree.map(lambda p, i=i: jnp.full_like(p, i - 1.0), params)
    opt, plain = opt.apply_gradient(g), plain.apply_gradient(g)
    average = jax.tree.map(lambda e, p: 0.5 * e + (1 - 0.5) * p, average, plain.target)
  assert isinstance(opt.ema_params, flax.core.FrozenDict)
  assert_trees_equal(opt.ema_params, average)


def test_a_train_state_reads_the_average_from_its_opt_state():
  from flax import linen as nn
  from flax.training import train_state

  model = nn.Dense(3)
  x = jnp.linspace(-1.0, 1.0, 8).reshape(4, 2)
  variables = model.init(jax.random.key(0), x)
  loss = lambda p: jnp.sum(model.apply(p, x) ** 2)
  opt_def = optcore.ema(optcore.sgd(0.1), decay=0.8)
  state = train_state.TrainState.create(
    apply_fn=model.apply, params=variables, tx=opt_def.as_optax()
  )
  params, tx = variables, optax.sgd(0.1)
  raw_state, average = tx.init(params), variables
  for _ in range(3):
    state = jax.jit(lambda s: s.apply_gradients(grads=jax.grad(loss)(s.params)))(state)
    updates, raw_state = tx.update(jax.grad(loss)(params), raw_state, params)
    params = optax.apply_updates(params, updates)
    average = jax.tree.map(lambda e, p: 0.8 * e + (1 - 0.8) * p, average, params)
  # as_optax's updates are new - old, so the parameters agree up to rounding.
  got, want = opt_def.ema_params(state.opt_state), average
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6)
