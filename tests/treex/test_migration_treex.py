"""The Treex migration guide: the "after" program gives the numbers of the optax loop Treex's
Optimizer ran; the "before" program (Treex cannot be installed) is checked for what it uses."""

from __future__ import annotations

import ast

import jax
import jax.numpy as jnp
import optax
import treeo as to
from doc_blocks import named_block, run_block
from tree_testing import assert_trees_equal

# Treex 0.6's names the guide's "before" program uses: tx.Module (a treeo.Tree with Treex's
# filter/merge methods), tx.Parameter (the parameter kind) and tx.Optimizer.
TREEX_NAMES = {"Module", "Parameter", "Optimizer"}


def test_before_program_is_python_that_uses_treexs_api_only():
  tree = ast.parse(named_block("treex-before").source)
  used = {
    node.attr
    for node in ast.walk(tree)
    if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "tx"
  }
  assert used == TREEX_NAMES


def test_after_program_gives_the_optax_loops_numbers_bitwise():
  after = run_block(named_block("treex-after"))
  model = after["Linear"](jax.random.key(1))
  x, y = after["x"], after["y"]
  params = to.filter(model, after["Parameter"])
  tx = optax.adam(5e-2)
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((to.merge(model, p)(x) - y) ** 2))(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  losses = []
  with jax.numpy_rank_promotion("allow"):  # the guide's model broadcasts its bias, as Treex's did
    for _ in range(200):
      params, state, loss = step(params, state)
      losses.append(float(loss))
  assert losses == after["losses"]
  assert_trees_equal(jax.tree.leaves(params), jax.tree.leaves(after["model"]))
  assert_trees_equal(jax.tree.leaves(after["optimizer"]), jax.tree.leaves(state))  # Treex's leaves
