"""`optcore.schedules.warmup_stable_decay` against the papers' formulas, written out here in
NumPy float64 (Hägele et al., arXiv 2405.18392, Section 3: a linear warm-up, a constant rate,
and a cooldown of 20% by default whose shapes are linear and 1 - sqrt; the cosine is the
usual half cosine); as an optax schedule and as a live override."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optcore
from optcore import schedules


def paper(t: int, peak: float, total: int, warmup: int, cooldown: int, shape: str,
          init: float = 0.0, end: float = 0.0) -> float:  # fmt: skip
  if t < warmup:
    return init + (peak - init) * t / warmup
  start = total - cooldown
  if t < start:
    return peak
  x = min((t - start) / cooldown, 1.0)
  left = {"linear": 1 - x, "cosine": 0.5 * (1 + math.cos(math.pi * x)), "1-sqrt": 1 - math.sqrt(x)}
  return end + (peak - end) * left[shape]


@pytest.mark.parametrize("shape", schedules.DECAY_SHAPES)
def test_every_step_follows_the_formula(shape):
  lr = schedules.warmup_stable_decay(3e-4, 100, 10, 30, decay_shape=shape, end_value=3e-5)
  got = np.asarray(jax.vmap(lr)(jnp.arange(111)))
  want = [paper(t, 3e-4, 100, 10, 30, shape, end=3e-5) for t in range(111)]
  # float32 of values below 3e-4: at most a few ulps (2.4e-11 each) apart
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-10)


def test_default_cooldown_is_a_fifth():
  lr = schedules.warmup_stable_decay(1.0, 50)
  assert float(lr(39)) == 1.0 and float(lr(40)) == 1.0 and float(lr(41)) < 1.0
  assert float(lr(50)) == 0.0


def test_an_optimizer_and_a_live_override_read_it_at_their_step():
  lr = schedules.warmup_stable_decay(0.1, total_steps=4, warmup_steps=2, decay_steps=2)
  params = {"w": jnp.zeros(1)}
  raw = optax.sgd(lr)
  state, p = raw.init(params), params
  opt = optcore.sgd(lr).create(params)
  # a schedule as a live override: read at the step it is given to (flax.optim's face)
  overridden = optcore.legacy.GradientDescent(1.0).create(params)
  for _ in range(5):
    g = {"w": jnp.ones(1)}
    u, state = raw.update(g, state, p)
    p = optax.apply_updates(p, u)
    opt = opt.apply_gradient(g)
    overridden = overridden.apply_gradient(g, learning_rate=lr)
  np.testing.assert_array_equal(opt.target["w"], p["w"])
  np.testing.assert_array_equal(overridden.target["w"], p["w"])


def test_bad_phases_are_named():
  with pytest.raises(ValueError, match="decay_shape must be one of"):
    schedules.warmup_stable_decay(1.0, 10, decay_shape="exp")
  with pytest.raises(ValueError, match="more than total_steps"):
    schedules.warmup_stable_decay(1.0, 10, warmup_steps=8, decay_steps=4)


def test_a_config_writes_and_reads_it():
  lr = schedules.warmup_stable_decay(1e-3, 1000, 100, decay_shape="cosine")
  opt_def = optcore.adamw(lr, weight_decay=0.1)
  config = optcore.config.to_config(opt_def)
  assert config["learning_rate"]["schedule"] == "warmup_stable_decay"
  back = optcore.config.from_config(config)
  assert back == opt_def
  assert float(back.hyper_params.learning_rate(950)) == float(lr(950))
  with pytest.raises(optcore.config.ConfigError, match="decay_shape"):
    optcore.config.from_config({**config, "learning_rate": {**config["learning_rate"],
                                                            "decay_shape": "exp"}})  # fmt: skip
