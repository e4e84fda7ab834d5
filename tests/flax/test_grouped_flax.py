"""optcore.grouped in the Flax face: flax.optim's definitions grouped, Flax's
serialization of a grouped optimizer, and a Linen model trained grouped."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import serialization

import optcore
from optcore_flax import optim


class DeepMLP(nn.Module):
  depth: int = 6

  @nn.compact
  def __call__(self, x):
    for _ in range(self.depth):
      x = jnp.tanh(nn.Dense(8)(x))
    return nn.Dense(1)(x)


def setup():
  model = DeepMLP()
  x = jax.random.normal(jax.random.key(1), (4, 8))
  params = model.init(jax.random.key(0), x)["params"]
  loss = lambda p: jnp.mean(model.apply({"params": p}, x) ** 2)
  return params, loss


@pytest.mark.parametrize("make", [lambda: optim.Adam(1e-2), lambda: optim.Momentum(0.1, 0.9)])
def test_a_linen_model_trains_grouped_as_flax_optim_does(make):
  params, loss = setup()
  grouped = optcore.grouped(make(), max_leaf_size=1000).create(params)
  plain = make().create(params)
  step = jax.jit(lambda o: o.apply_gradient(jax.grad(loss)(o.target)))
  for _ in range(5):
    grouped, plain = step(grouped), step(plain)
  assert len(grouped.packed_target.buffers) == 1 and not grouped.packed_target.ungrouped
  for got, want in zip(
    jax.tree.leaves((grouped.target, grouped.state)),
    jax.tree.leaves((plain.target, plain.state)),
    strict=True,
  ):
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
  assert loss(grouped.target) < loss(params)


def test_flax_serialization_writes_the_ungrouped_state_dict_and_restores_it():
  params, loss = setup()
  grouped = optcore.grouped(optim.Adam(1e-2), max_leaf_size=1000).create(params)
  grouped = grouped.apply_gradient(jax.grad(loss)(grouped.target))
  plain = optim.Adam(1e-2).create(params)
  written = serialization.to_state_dict(grouped)
  assert jax.tree.structure(written) == jax.tree.structure(serialization.to_state_dict(plain))
  restored = serialization.from_state_dict(plain, written)
  for got, want in zip(
    jax.tree.leaves(restored.state), jax.tree.leaves(grouped.state), strict=True
  ):
    np.testing.assert_array_equal(got, want)
  blob = serialization.to_bytes(grouped)
  back = serialization.from_bytes(optcore.grouped(optim.Adam(1e-2), 1000).create(params), blob)
  assert isinstance(back.packed_target, optcore.GroupedParams)
  for got, want in zip(jax.tree.leaves(back.target), jax.tree.leaves(grouped.target), strict=True):
    np.testing.assert_array_equal(got, want)
