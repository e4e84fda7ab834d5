"""`optcore.stochastic_rounding`: bfloat16 parameters with no float32 master copy, each step's
float32 result rounded up or down at random in proportion to its nearness (torchao's and
llm.c's method), against a NumPy rounding of the same random bits and against raw optax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import optcore
from optcore._src.wrappers.stochastic_rounding import round_to_bfloat16


def numpy_stochastic_round(x: np.ndarray, noise16: np.ndarray) -> np.ndarray:
  """The published method in NumPy: add a random 16-bit number to the float32 bits bfloat16
  drops, then drop them."""
  bits = x.astype(np.float32).view(np.uint32)
  kept = ((bits + noise16.astype(np.uint32)) & np.uint32(0xFFFF0000)).view(np.float32)
  return kept.astype(ml_dtypes.bfloat16)


def test_the_rounding_is_the_published_method_bitwise():
  x = np.concatenate(
    [
      np.random.default_rng(0).normal(size=5000).astype(np.float32),
      np.array([0.0, -0.0, 1.0, -1.0, 3.0e38, 1e-40], np.float32),
    ]
  )
  key = jax.random.key(3)
  noise = np.asarray(jax.random.bits(key, x.shape, jnp.uint32)) >> 16
  got = np.asarray(round_to_bfloat16(jnp.asarray(x), key))
  np.testing.assert_array_equal(
    got.view(np.uint16), numpy_stochastic_round(x, noise).view(np.uint16)
  )


def test_each_value_goes_to_a_neighbour_with_the_probability_of_its_nearness():
  low, high = np.float32(1.0), np.float32(1.0078125)  # neighbouring bfloat16 values
  for fraction in (0.125, 0.5, 0.75):
    x = jnp.full((40000,), low + fraction * (high - low), jnp.float32)
    y = np.asarray(round_to_bfloat16(x, jax.random.key(1)).astype(jnp.float32))
    assert set(np.unique(y)) <= {low, high}
    sigma = np.sqrt(fraction * (1 - fraction) / y.size)
    assert abs(np.mean(y == high) - fraction) < 5 * sigma
  special = jnp.array([jnp.inf, -jnp.inf, jnp.nan], jnp.float32)
  out = round_to_bfloat16(special, jax.random.key(0)).astype(jnp.float32)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(special))


def test_a_step_is_the_float32_step_of_raw_optax_rounded_to_a_neighbour():
  params = {"w": jax.random.normal(jax.random.key(0), (64, 32), jnp.bfloat16)}
  grads = {"w": jax.random.normal(jax.random.key(1), (64, 32), jnp.bfloat16)}
  opt = optcore.stochastic_rounding(optcore.adam(1e-3)).create(params).apply_gradient(grads)
  assert opt.target["w"].dtype == jnp.bfloat16
  tx = optax.adam(1e-3)
  working = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  updates, _ = tx.update(jax.tree.map(lambda g: g.astype(jnp.float32), grads), tx.init(working))
  exact = np.asarray(optax.apply_updates(working, updates)["w"])
  got = np.asarray(opt.target["w"].astype(jnp.float32))
  down = exact.astype(ml_dtypes.bfloat16).astype(np.float32)
  # The neighbour on the other side of the exact value.
  other = np.nextafter(
    down.astype(ml_dtypes.bfloat16),
    np.where(exact > down, np.inf, -np.inf).astype(ml_dtypes.bfloat16),
  ).astype(np.float32)
  assert np.all((got == down) | (got == other))
  assert 0.1 < np.mean(got != down) < 0.9  # both neighbours are taken


def test_small_updates_move_bfloat16_parameters_as_float32_ones_do_on_average():
  """sgd at 1e-4 on bfloat16 ones: rounding to nearest loses every update (a bfloat16 step
  at 1 is 2**-7); stochastic rounding follows the float32 run."""
  params = {"w": jnp.ones((4096,), jnp.bfloat16)}
  grads = {"w": jnp.ones((4096,), jnp.bfloat16)}
  nearest = optcore.sgd(1e-4).create(params)
  rounded = optcore.stochastic_rounding(optcore.sgd(1e-4), seed=5).create(params)
  step = jax.jit(lambda o: o.apply_gradient(grads))
  for _ in range(200):
    nearest, rounded = step(nearest), step(rounded)
  float32_run = 1.0 - 200 * 1e-4
  assert float(nearest.target["w"].astype(jnp.float32).mean()) == 1.0
  # The mean of 4096 random walks: its spread is about 1.4e-4 here, the loss of rounding 2e-2.
  assert abs(float(rounded.target["w"].astype(jnp.float32).mean()) - float32_run) < 1e-3


def test_the_key_is_in_the_state_and_a_restore_continues_bitwise():
  params = {"w": jnp.linspace(-1, 1, 256, dtype=jnp.bfloat16)}
  grads = {"w": jnp.full((256,), 0.3, jnp.bfloat16)}
  opt_def = optcore.stochastic_rounding(optcore.adam(1e-3), seed=7)
  opt = opt_def.create(params).apply_gradient(grads)
  saved = opt.state_dict()
  assert saved["state"]["param_states"]["key"].dtype == np.uint32
  restored = opt_def.create(params).restore_state(saved)
  a, b = opt.apply_gradient(grads), restored.apply_gradient(grads)
  np.testing.assert_array_equal(np.asarray(a.target["w"]), np.asarray(b.target["w"]))
  other_seed = optcore.stochastic_rounding(optcore.adam(1e-3), seed=8).create(params)
  assert not np.array_equal(
    np.asarray(other_seed.apply_gradient(grads).target["w"]),
    np.asarray(opt_def.create(params).apply_gradient(grads).target["w"]),
  )


def test_float32_parameters_are_stepped_as_they_are():
  params = {"w": jnp.linspace(-1, 1, 8)}
  grads = {"w": jnp.ones(8)}
  plain = optcore.adam(1e-2).create(params).apply_gradient(grads)
  rounded = optcore.stochastic_rounding(optcore.adam(1e-2)).create(params).apply_gradient(grads)
  np.testing.assert_array_equal(np.asarray(rounded.target["w"]), np.asarray(plain.target["w"]))


def test_bad_input_is_refused_by_name():
  with pytest.raises(TypeError, match=r"the parameter at '/h' is float16.*bfloat16"):
    optcore.stochastic_rounding(optcore.sgd(0.1)).create({"h": jnp.ones(2, jnp.float16)})
  with pytest.raises(TypeError, match=r"seed must be an integer; got 0\.5"):
    optcore.stochastic_rounding(optcore.sgd(0.1), seed=0.5)
  with pytest.raises(TypeError, match="wraps stochastic_rounding twice; round once"):
    optcore.stochastic_rounding(optcore.ema(optcore.stochastic_rounding(optcore.sgd(0.1)), 0.9))
