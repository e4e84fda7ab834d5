"""The core over Equinox modules: the same numbers as optax, attribute paths."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import optcore
import optcore_equinox


def test_adapter_imports_with_the_core_version():
  assert optcore_equinox.__version__ == optcore.__version__


def mlp():
  return eqx.nn.MLP(3, 2, width_size=4, depth=2, key=jax.random.key(0))


def assert_same_training_as_optax(opt_def, tx, steps=5):
  """``opt_def`` through optcore and ``tx`` in a hand-written eqx + optax loop: bitwise."""
  params, static = eqx.partition(mlp(), eqx.is_inexact_array)
  x = jnp.linspace(-1, 1, 3)
  grad_fn = jax.jit(jax.grad(lambda p: jnp.sum(eqx.combine(p, static)(x) ** 2)))
  opt, state, expected = opt_def.create(params), tx.init(params), params
  for _ in range(steps):
    updates, state = tx.update(grad_fn(expected), state, expected)
    expected = eqx.apply_updates(expected, updates)
    opt = opt.apply_gradient(grad_fn(opt.target))
  for a, b in zip(jax.tree.leaves(opt.target), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(a, b)


def test_core_on_filtered_module_equals_optax_bitwise():
  assert_same_training_as_optax(optcore.adamw(1e-2), optax.adamw(1e-2))


def test_state_dict_keys_are_attribute_names():
  params = eqx.filter(mlp(), eqx.is_inexact_array)
  sd = optcore.adam(1e-3).create(params).state_dict()
  assert set(sd["target"]["layers"]["0"]) >= {"weight", "bias"}
  assert sd["state"]["param_states"]["0"]["mu"]["layers"]["2"]["weight"].shape == (2, 4)


def test_selectors_see_equinox_attribute_paths():
  params = eqx.filter(mlp(), eqx.is_inexact_array)
  mask = optcore.selector_mask(r"^/layers/\d+/weight$", params)
  assert [layer.weight for layer in mask.layers] == [True, True, True]
  assert [layer.bias for layer in mask.layers] == [False, False, False]
  # An Equinox module of booleans is a mask too (it is callable, but a pytree).
  assert optcore.selector_mask(mask, params) == mask


def test_multi_optimizer_equals_optax_partition_on_an_mlp():
  labels = jax.tree_util.tree_map_with_path(
    lambda path, _: "w" if jax.tree_util.keystr(path).endswith(".weight") else "b",
    eqx.filter(mlp(), eqx.is_inexact_array),
  )
  # An MLP is callable, so optax.partition would call a labels module: wrap it.
  tx = optax.partition({"w": optax.adam(1e-2), "b": optax.sgd(0.1)}, lambda _: labels)
  multi = optcore.MultiOptimizer((r"/weight$", optcore.adam(1e-2)), (r"/bias$", optcore.sgd(0.1)))
  assert_same_training_as_optax(multi, tx)
