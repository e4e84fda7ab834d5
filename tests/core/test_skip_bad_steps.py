"""optcore.skip_bad_steps against a hand-written rolling window beside raw optax: which steps
are skipped, the parameters bitwise, the step count and schedules on a skipped step, a restore
in the middle of the window, and both orders with accumulate (issue 40)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tree_testing import assert_trees_equal

import optcore

WINDOW, SIGMAS, WARMUP = 8, 3.0, 5
SPIKE, NAN, INF = 14, 19, 23


def params():
  return {"kernel": jnp.arange(6.0).reshape(2, 3) / 6, "bias": jnp.array([0.1, -0.2, 0.3])}


def grads(i):
  key = jax.random.key(i)
  g = {
    "kernel": jax.random.normal(key, (2, 3)),
    "bias": jax.random.normal(jax.random.fold_in(key, 1), (3,)),
  }
  if i == SPIKE:  # a bad batch: every gradient x40
    g = jax.tree.map(lambda x: 40 * x, g)
  if i == NAN:
    g["bias"] = g["bias"].at[1].set(jnp.nan)
  if i == INF:
    g["kernel"] = g["kernel"].at[0, 0].set(jnp.inf)
  return g


def decisions_by_hand(gradients):
  """The rule, in NumPy: skip a non-finite norm, or, with WARMUP accepted norms in the window
  (the last WINDOW accepted), one above their mean + SIGMAS population deviations."""
  window, skipped = [], []
  for g in gradients:
    norm = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(g)))
    recent = np.asarray(window[-WINDOW:])
    bad = not np.isfinite(norm) or (
      len(recent) >= WARMUP and norm > recent.mean() + SIGMAS * recent.std()
    )
    skipped.append(bad)
    if not bad:
      window.append(norm)
  return skipped


def optax_by_hand(gradients, skipped, tx=None):
  tx = tx or optax.adam(0.05)
  p, s = params(), tx.init(params())

  @jax.jit
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  for g, bad in zip(gradients, skipped, strict=True):
    if not bad:
      p, s = step(p, s, g)
  return p


def skipping(inner=None):
  return optcore.skip_bad_steps(
    inner or optcore.adam(0.05), window=WINDOW, sigmas=SIGMAS, warmup=WARMUP
  )


STEP = jax.jit(lambda opt, g: opt.apply_gradient(g))


def test_the_skipped_steps_and_the_parameters_are_the_hand_written_windows():
  gradients = [grads(i) for i in range(30)]
  skipped = decisions_by_hand(gradients)
  assert [i for i, bad in enumerate(skipped) if bad] == [SPIKE, NAN, INF]  # the data's own
  opt = skipping().create(params())
  counts = []
  for g in gradients:
    opt = STEP(opt, g)
    counts.append(int(optcore.skipped_steps(opt)))
  assert counts == list(np.cumsum(skipped))
  assert int(opt.state.step) == 30 - 3
  assert_trees_equal(opt.target, optax_by_hand(gradients, skipped))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(opt.state))


def test_a_skipped_step_keeps_the_step_count_and_the_schedule():
  schedule = optax.linear_schedule(0.1, 0.0, 40)
  opt = skipping(optcore.sgd(schedule)).create(params())
  for i in range(NAN):
    opt = STEP(opt, grads(i))
  before = opt
  opt = STEP(opt, grads(NAN))
  assert int(opt.state.step) == int(before.state.step)
  assert opt.current_hyper_params() == before.current_hyper_params()
  assert_trees_equal(opt.target, before.target)
  assert_trees_equal(opt.state.param_states.inner, before.state.param_states.inner)


def test_a_restore_in_the_middle_of_the_window_decides_as_the_uninterrupted_run():
  gradients = [grads(i) for i in range(30)]
  straight = skipping().create(params())
  for g in gradients:
    straight = STEP(straight, g)
  half = skipping().create(params())
  for g in gradients[:11]:  # the window part full, before the spike
    half = STEP(half, g)
  written = jax.tree.map(np.asarray, half.state_dict())
  resumed = skipping().create(params()).restore_state(written)
  for g in gradients[11:]:
    resumed = STEP(resumed, g)
  assert int(optcore.skipped_steps(resumed)) == 3
  assert_trees_equal(resumed.target, straight.target)
  assert_trees_equal(resumed.state, straight.state)


def test_a_window_of_another_length_is_refused_by_path():
  written = skipping().create(params()).state_dict()
  other = optcore.skip_bad_steps(optcore.adam(0.05), window=4, warmup=2).create(params())
  shapes = r"state/param_states/norms'.*shape \(4,\).*shape \(8,\).*skip_bad_steps window"
  with pytest.raises(optcore.StateDictError, match=shapes):
    other.restore_state(written)


def test_under_accumulate_a_skipped_mini_batch_is_not_in_the_mean():
  """skip_bad_steps(accumulate(...)): each mini-batch is judged; a NaN one is dropped, so the
  mean is of the good ones. accumulate(skip_bad_steps(...)): the applied mean is judged."""
  good = [grads(i) for i in range(4)]
  nan = jax.tree.map(lambda x: x.at[0].set(jnp.nan), grads(9))
  outer = optcore.skip_bad_steps(optcore.accumulate(optcore.adam(0.05), every=2), warmup=1)
  opt = outer.create(params())
  for g in (good[0], nan, good[1], good[2], good[3]):
    opt = STEP(opt, g)
  plain = optcore.accumulate(optcore.adam(0.05), every=2).create(params())
  for g in good:
    plain = STEP(plain, g)
  assert_trees_equal(opt.target, plain.target)
  assert int(optcore.skipped_steps(opt)) == 1 and int(opt.state.step) == 2

  inner = optcore.accumulate(optcore.skip_bad_steps(optcore.adam(0.05), warmup=1), every=2)
  opt = inner.create(params())
  for g in (good[0], nan, good[1], good[2]):  # the first mean has the NaN: that update skipped
    opt = STEP(opt, g)
  by_hand = optax_by_hand([jax.tree.map(lambda a, b: (a + b) / 2, good[1], good[2])], [False])
  assert int(optcore.skipped_steps(opt)) == 1 and int(opt.state.step) == 1
  np.testing.assert_allclose(opt.target["kernel"], by_hand["kernel"], rtol=1e-6)


@pytest.mark.parametrize(
  ("kwargs", "match"),
  [
    ({"window": 0}, "window must be an integer >= 1"),
    ({"warmup": 1.5}, "warmup must be an integer >= 1; got 1.5"),
    ({"sigmas": -1.0}, "sigmas must be a number > 0; got -1.0"),
    ({"window": 4, "warmup": 8}, "warmup=8 is longer than window=4"),
  ],
)
def test_wrong_arguments_are_refused_by_name(kwargs, match):
  with pytest.raises(ValueError, match=match):
    optcore.skip_bad_steps(optcore.adam(0.1), **kwargs)


def test_skipped_steps_of_a_definition_that_skips_nothing_says_how_to():
  with pytest.raises(TypeError, match=r"skips no steps; wrap it: optcore\.skip_bad_steps"):
    optcore.skipped_steps(optcore.adam(0.1).create(params()))
  with pytest.raises(TypeError, match="wraps skip_bad_steps twice"):
    optcore.skip_bad_steps(optcore.ema(skipping(), 0.9))


def test_watching_the_loss_skips_its_spike_and_its_nan_as_the_hand_written_window():
  losses = [2.0 - 0.05 * i for i in range(20)]
  losses[9], losses[15] = 30.0, float("nan")
  window = []
  skipped = []
  for loss in losses:
    recent = np.asarray(window[-WINDOW:])
    bad = not np.isfinite(loss) or (
      len(recent) >= WARMUP and loss > recent.mean() + SIGMAS * recent.std()
    )
    skipped.append(bad)
    if not bad:
      window.append(loss)
  assert [i for i, bad in enumerate(skipped) if bad] == [9, 15]
  opt_def = optcore.skip_bad_steps(
    optcore.adam(0.05), window=WINDOW, sigmas=SIGMAS, warmup=WARMUP, watch="loss"
  )
  opt = opt_def.create(params())
  step = jax.jit(lambda opt, g, loss: opt.apply_gradient(g, extra_args={"value": loss}))
  plain = [grads(i) for i in range(40, 60)]  # no bad gradients: only the losses decide
  for g, loss in zip(plain, losses, strict=True):
    opt = step(opt, g, jnp.float32(loss))
  assert int(optcore.skipped_steps(opt)) == 2
  assert_trees_equal(opt.target, optax_by_hand(plain, skipped))
  with pytest.raises(TypeError, match=r"judges the loss: pass it, a scalar.*found nothing"):
    opt.apply_gradient(plain[0])
  with pytest.raises(ValueError, match="watch must be one of"):
    optcore.skip_bad_steps(optcore.adam(0.1), watch="norm")


def test_a_step_that_donates_the_optimizer_takes_a_fresh_one():
  """Every state array is its own buffer: a jitted step with donate_argnums=0 (the usual
  way to update in place) takes the optimizer skip_bad_steps creates."""
  step = jax.jit(lambda opt, g: opt.apply_gradient(g), donate_argnums=(0,))
  opt = skipping().create(jax.tree.map(jnp.copy, params()))
  for i in range(3):
    opt = step(opt, grads(i))
  assert int(opt.state.step) == 3
