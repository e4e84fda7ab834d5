"""current_hyper_params(): the hyper-parameters the next step takes, for logging,
schedules evaluated at the current step, inside jit without a recompile."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optcore
from optcore import legacy

PARAMS = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
GRADS = jax.tree.map(jnp.ones_like, PARAMS)


def as_floats(values: dict) -> dict:
  return {k: float(v) for k, v in values.items()}


def test_a_schedule_is_read_at_the_step_optax_reads_it():
  schedule = optax.cosine_decay_schedule(0.1, decay_steps=10)
  opt = optcore.adam(schedule, b1=0.8).create(PARAMS)
  tx = optax.scale_by_learning_rate(schedule)
  count = tx.init(PARAMS)
  for step in range(4):
    values = opt.current_hyper_params()
    assert float(values["learning_rate"]) == pytest.approx(float(schedule(step)), rel=1e-7)
    assert float(values["b1"]) == pytest.approx(0.8)
    assert "nesterov" not in values and "mu_dtype" not in values  # flags and dtypes are left out
    opt = opt.apply_gradient(GRADS)
    _, count = tx.update(GRADS, count)
  assert int(opt.state.step) == 4


def test_inside_jit_the_values_change_without_a_recompile():
  traces = []

  @jax.jit
  def log(opt):
    traces.append(1)
    return opt.current_hyper_params()

  opt = optcore.sgd(optax.exponential_decay(1.0, 1, 0.5)).create(PARAMS)
  seen = []
  for _ in range(3):
    seen.append(float(log(opt)["learning_rate"]))
    opt = opt.apply_gradient(GRADS)
  assert seen == [1.0, 0.5, 0.25] and len(traces) == 1


def test_a_multi_optimizer_reports_each_group():
  opt_def = optcore.MultiOptimizer(
    ("w", optcore.adam(optax.linear_schedule(1.0, 0.0, 4))), ("b", legacy.Momentum(0.1, beta=0.9))
  )
  opt = opt_def.create(PARAMS).apply_gradient(GRADS)
  values = as_floats(opt.current_hyper_params())
  assert values["0/learning_rate"] == 0.75
  assert values["1/learning_rate"] == pytest.approx(0.1)
  assert values["1/beta"] == pytest.approx(0.9)


def test_legacy_t5x_and_wrapped_definitions():
  legacy_values = as_floats(legacy.Adam(0.01, beta2=0.99).create(PARAMS).current_hyper_params())
  assert legacy_values.keys() == {"learning_rate", "beta1", "beta2", "eps", "weight_decay"}
  t5x = optcore.t5x.Adafactor(learning_rate=0.5, decay_rate=0.8)
  t5x_values = as_floats(t5x.create(PARAMS).current_hyper_params())
  assert t5x_values["learning_rate"] == 0.5 and t5x_values["decay_rate"] == pytest.approx(0.8)
  assert "factored" not in t5x_values and "factor_map" not in t5x_values
  # A wrapper reports its wrapped definition's, at the steps it applies.
  schedule = optax.linear_schedule(1.0, 0.0, 4)
  accumulated = optcore.accumulate(optcore.ema(optcore.sgd(schedule)), every=2).create(PARAMS)
  for _ in range(3):
    accumulated = accumulated.apply_gradient(GRADS)
  assert as_floats(accumulated.current_hyper_params()) == {"learning_rate": 0.75}
  chained = optcore.chain([optax.clip_by_global_norm(1.0), optcore.sgd(0.2)])
  assert as_floats(chained.create(PARAMS).current_hyper_params()) == pytest.approx(
    {"transformations/1/learning_rate": 0.2}
  )


def test_a_state_from_as_optax_answers_through_the_definition():
  opt_def = optcore.adamw(optax.linear_schedule(1.0, 0.0, 4), weight_decay=0.1)
  tx = opt_def.as_optax()
  state = tx.init(PARAMS)
  _, state = tx.update(GRADS, state, PARAMS)
  values = opt_def.current_hyper_params(state)
  assert float(values["learning_rate"]) == 0.75
  np.testing.assert_allclose(values["weight_decay"], 0.1)


def test_an_as_optax_state_is_read_at_its_schedules_own_count():
  """chain([apply_every(2), sgd(schedule)]).as_optax(): the first count of the state is
  apply_every's, which cycles 0, 1, 0, ...; the schedule is evaluated at scale_by_schedule's."""
  params = {"w": jnp.ones(3)}
  schedule = optax.linear_schedule(1.0, 0.0, 10)
  opt_def = optcore.chain([optax.apply_every(2), optcore.sgd(schedule)])
  tx = opt_def.as_optax()
  state = tx.init(params)
  for i in range(4):
    got = opt_def.current_hyper_params(state)["transformations/1/learning_rate"]
    np.testing.assert_allclose(got, schedule(i))
    _, state = tx.update({"w": jnp.ones(3)}, state, params)


@pytest.mark.parametrize(
  "opt_def",
  [optcore.sgd(0.1), optcore.MultiOptimizer(("w", optcore.sgd(0.1)))],
  ids=["sgd", "multi"],
)
def test_constants_are_read_from_a_state_that_keeps_no_count(opt_def):
  """The documented call, opt_def.current_hyper_params(tx.init(p)), was refused for sgd, whose
  optax state holds no count: constants need none."""
  state = opt_def.as_optax().init({"w": jnp.ones(3)})
  values = opt_def.current_hyper_params(state)
  assert next(v for k, v in values.items() if k.endswith("learning_rate")) == jnp.float32(0.1)


def test_a_mask_function_is_not_read_as_a_schedule():
  """adamw's mask is a function of the parameters: it was called with the step count (and a mask
  that reads the parameters' keys crashed); it is left out, as other non-numeric settings are."""
  called = []

  def mask(params):
    called.append(params)
    return {k: v.ndim > 1 for k, v in params.items()}

  opt_def = optcore.adamw(1e-3, weight_decay=0.1, mask=mask)
  opt = opt_def.create({"w": jnp.ones((2, 2)), "b": jnp.ones(2)})
  before = len(called)
  read = optcore.current_hyper_params(opt)
  assert len(called) == before and "mask" not in read
  assert float(read["weight_decay"]) == pytest.approx(0.1)
  tx = opt_def.as_optax()
  state = tx.init({"w": jnp.ones((2, 2)), "b": jnp.ones(2)})
  assert "mask" not in optcore.current_hyper_params(state, optimizer_def=opt_def)
