"""The Equinox migration guide: the hand-written eqx + optax loop and the optcore_equinox one."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from doc_blocks import named_block, run_block
from tree_testing import assert_trees_equal


def test_after_program_is_optaxs_adamw_with_the_rate_of_each_step_bitwise():
  after = run_block(named_block("equinox-after"))
  # What the guide claims: each step is optax.adamw with that step's rate, the rest as given.
  model, x, y, loss_fn = after["model"], after["x"], after["y"], after["loss_fn"]
  model = eqx.nn.MLP(1, 1, 32, 2, activation=jnp.tanh, key=jax.random.key(1))
  state = optax.adamw(3e-2, weight_decay=1e-4).init(eqx.filter(model, eqx.is_inexact_array))

  @eqx.filter_jit
  def step(model, state, lr):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    params = eqx.filter(model, eqx.is_inexact_array)
    updates, state = optax.adamw(lr, weight_decay=1e-4).update(grads, state, params)
    return eqx.apply_updates(model, updates), state, loss

  losses = []
  for i in range(100):
    model, state, loss = step(model, state, after["schedule"](i))
    losses.append(float(loss))
  assert losses == after["losses"]
  assert_trees_equal(eqx.filter(model, eqx.is_array), eqx.filter(after["model"], eqx.is_array))


def test_before_and_after_programs_agree_to_float_rounding():
  before = run_block(named_block("equinox-before"))
  after = run_block(named_block("equinox-after"))
  # inject_hyperparams holds b1, b2 and eps as float32 arrays, so its `1 - b1` is rounded in
  # float32 where optax's Python rounds it in float64: the runs part in the last bits
  # (measured: 2e-5 relative on the loss after 100 steps).
  np.testing.assert_allclose(after["losses"], before["losses"], rtol=1e-4)
  leaves = lambda ns: jax.tree.leaves(eqx.filter(ns["model"], eqx.is_array))
  for a, b in zip(leaves(after), leaves(before), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  assert after["losses"][-1] < 0.02 * after["losses"][0]
