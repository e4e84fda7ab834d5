"""The treex adapter installs next to treeo on today's JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import treeo as to

import optcore
import optcore_treex


def test_adapter_imports_with_the_core_version():
  assert optcore_treex.__version__ == optcore.__version__


class Linear(to.Tree):
  w: jnp.ndarray = to.field(node=True)
  b: jnp.ndarray = to.field(node=True)

  def __init__(self):
    self.w = jnp.ones((2, 3))
    self.b = jnp.zeros(3)


def test_core_on_a_treeo_tree_equals_optax():
  params = Linear()
  grads = Linear()
  tx = optax.sgd(0.1, momentum=0.9)
  updates, _ = tx.update(grads, tx.init(params), params)
  expected = optax.apply_updates(params, updates)
  opt = optcore.sgd(0.1, momentum=0.9).create(params).apply_gradient(grads)
  assert isinstance(opt.target, Linear)
  np.testing.assert_array_equal(opt.target.w, expected.w)
  np.testing.assert_array_equal(opt.target.b, expected.b)


def test_multi_optimizer_equals_optax_partition_on_a_treeo_tree():
  params, grads = Linear(), Linear()
  grads.w, grads.b = jnp.full((2, 3), 0.5), jnp.full(3, -1.0)
  labels = Linear()
  labels.w, labels.b = "w", "b"
  tx = optax.partition({"w": optax.adam(1e-2), "b": optax.sgd(0.1)}, labels)
  multi = optcore.MultiOptimizer((r"^/w$", optcore.adam(1e-2)), (r"^/b$", optcore.sgd(0.1)))
  opt, state, expected = multi.create(params), tx.init(params), params
  for _ in range(3):
    updates, state = tx.update(grads, state, expected)
    expected = optax.apply_updates(expected, updates)
    opt = opt.apply_gradient(grads)
  np.testing.assert_array_equal(opt.target.w, expected.w)
  np.testing.assert_array_equal(opt.target.b, expected.b)


def test_treeo_paths_and_state_dicts_have_no_internal_level():
  # treeo flattens a Tree into one dict child; optcore_treex hides that level.
  seen = []
  optcore.ModelParamTraversal(lambda path, _: seen.append(path) or True).mask(Linear())
  assert seen == ["/b", "/w"]
  tree_sd = optcore.sgd(0.1, momentum=0.9).create(Linear()).state_dict()
  dict_sd = optcore.sgd(0.1, momentum=0.9).create({"b": Linear().b, "w": Linear().w}).state_dict()
  assert jax.tree.structure(tree_sd) == jax.tree.structure(dict_sd)
  restored = optcore.sgd(0.1, momentum=0.9).create(Linear()).restore_state(dict_sd)
  assert isinstance(restored.target, Linear)
  np.testing.assert_array_equal(restored.target.w, Linear().w)
