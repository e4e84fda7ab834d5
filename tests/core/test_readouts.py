"""optcore.ema_params and optcore.current_hyper_params: one function for every face's optimizer
and for a bare state with its definition, finding the average and the schedule's step where the
definition keeps them (under any wrapper, in a MultiOptimizer group, in an as_optax() state),
checked against the same quantities computed by hand beside raw optax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optcore

PARAMS = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array([0.5])}


def grads_at(i: int) -> dict:
  return jax.tree.map(lambda p: jnp.full_like(p, 0.1 * (i + 1)), PARAMS)


def by_hand_average(tx: optax.GradientTransformation, steps: int, decay: float) -> tuple:
  """Raw optax with the average written beside it."""
  params, state, average = PARAMS, tx.init(PARAMS), PARAMS
  for i in range(steps):
    updates, state = tx.update(grads_at(i), state, params)
    params = optax.apply_updates(params, updates)
    average = jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, average, params)
  return params, average


def run(opt_def: optcore.OptimizerDef, steps: int) -> optcore.Optimizer:
  opt = opt_def.create(PARAMS)
  for i in range(steps):
    opt = opt.apply_gradient(grads_at(i))
  return opt


def assert_same(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


@pytest.mark.parametrize(
  "wrap",
  [
    lambda d: d,
    lambda d: optcore.accumulate(d, every=1),
    lambda d: optcore.mixed_precision(d, master_dtype=jnp.float32),
  ],
  ids=["ema", "accumulate(ema)", "mixed_precision(ema)"],
)
def test_the_average_is_found_under_any_wrapper_and_is_the_hand_written_one(wrap):
  opt_def = wrap(optcore.ema(optcore.adam(0.1), decay=0.5))
  opt = run(opt_def, 3)
  _, average = by_hand_average(optax.adam(0.1), 3, 0.5)
  np.testing.assert_allclose(optcore.ema_params(opt)["w"], average["w"], rtol=1e-6)
  assert_same(optcore.ema_params(opt), opt.ema_params)  # the face's accessor is an alias
  # The same state, bare, with its definition (a TrainState's or an nnx.Optimizer's opt_state).
  assert_same(optcore.ema_params(opt.state, optimizer_def=opt_def), opt.ema_params)


def test_the_average_of_one_multioptimizer_group_comes_back_with_the_other_parameters():
  opt_def = optcore.MultiOptimizer(
    ("w", optcore.ema(optcore.sgd(0.1), decay=0.5)), ("b", optcore.sgd(0.1))
  )
  opt = run(opt_def, 2)
  _, average = by_hand_average(optax.sgd(0.1), 2, 0.5)
  read = optcore.ema_params(opt)
  np.testing.assert_allclose(read["w"], average["w"], rtol=1e-6)
  assert_same(read["b"], opt.target["b"])  # no group averages b: the parameter itself
  bare = optcore.ema_params(opt.state, optimizer_def=opt_def)
  assert bare["b"] is None  # without parameters to fill from
  assert_same(optcore.ema_params(opt.state, opt.target, optimizer_def=opt_def), read)


def test_an_as_optax_state_is_read_with_its_definition():
  opt_def = optcore.ema(optcore.sgd(0.1), decay=0.5)
  tx = opt_def.as_optax()
  params, state = PARAMS, tx.init(PARAMS)
  for i in range(2):
    updates, state = tx.update(grads_at(i), state, params)
    params = optax.apply_updates(params, updates)
  _, average = by_hand_average(optax.sgd(0.1), 2, 0.5)
  read = optcore.ema_params(state, optimizer_def=opt_def)
  np.testing.assert_allclose(read["w"], average["w"], rtol=1e-6)


def test_a_schedule_is_read_at_its_own_definitions_step():
  schedule = optax.exponential_decay(1.0, 1, 0.5)
  # Under accumulate the schedule advances once per applied update: 3 calls, 1 update.
  opt_def = optcore.accumulate(optcore.sgd(schedule), every=2)
  opt = run(opt_def, 3)
  assert float(optcore.current_hyper_params(opt)["learning_rate"]) == float(schedule(1))
  assert_same(optcore.current_hyper_params(opt), opt.current_hyper_params())
  # In an optax chain: apply_every's count cycles 0, 1, 0; the schedule's own count is 3.
  chained = optcore.chain([optax.apply_every(2), optcore.sgd(schedule)])
  tx = chained.as_optax()
  state = tx.init(PARAMS)
  for i in range(3):
    _, state = tx.update(grads_at(i), state, PARAMS)
  read = optcore.current_hyper_params(state, optimizer_def=chained)
  assert float(read["transformations/1/learning_rate"]) == float(schedule(3))


def test_the_grouped_optimizer_is_read_like_the_others():
  schedule = optax.exponential_decay(1.0, 1, 0.5)
  opt = optcore.grouped(optcore.sgd(schedule)).create(PARAMS).apply_gradient(grads_at(0))
  assert float(optcore.current_hyper_params(opt)["learning_rate"]) == float(schedule(1))


def test_wrong_sources_are_refused_with_the_fix():
  opt_def = optcore.ema(optcore.sgd(0.1))
  opt = opt_def.create(PARAMS)
  with pytest.raises(TypeError, match=r"optimizer_def=opt_def"):
    optcore.ema_params(opt.state)  # a bare state needs its definition
  with pytest.raises(TypeError, match=r"names another"):
    optcore.ema_params(opt, optimizer_def=optcore.ema(optcore.adam(0.1)))
  with pytest.raises(TypeError, match=r"optcore.ema\("):
    optcore.ema_params(optcore.sgd(0.1).create(PARAMS))  # no average: how to keep one
  with pytest.raises(TypeError, match=r"optimizer_def must be the optcore definition"):
    optcore.current_hyper_params(opt.state, optimizer_def=optax.sgd(0.1))


def test_a_grouped_optimizers_missing_average_points_at_the_ungrouped_definition():
  """The hint was optcore.ema(grouped(...)), which is refused; it names the ungrouped one."""
  opt = optcore.grouped(optcore.adam(0.1)).create(PARAMS)
  with pytest.raises(TypeError, match=r"grouped definition cannot keep one.*optcore\.ema\(adam"):
    optcore.ema_params(opt)
