"""One config, the same parameters in three frameworks' containers: the core
gives identical trajectories and identical state-dict keys for each."""

from __future__ import annotations

from collections.abc import Mapping

import equinox as eqx
import flax
import jax
import jax.numpy as jnp
import numpy as np

import optcore


class Linear(eqx.Module):
  weight: jax.Array
  bias: jax.Array


def containers():
  w = jnp.arange(6.0).reshape(2, 3) / 6
  b = jnp.array([0.1, -0.2, 0.3])
  return {
    "dict": {"bias": b, "weight": w},
    "frozendict": flax.core.freeze({"bias": b, "weight": w}),
    "equinox": Linear(weight=w, bias=b),
  }


def loss(p):
  weight, bias = (p["weight"], p["bias"]) if isinstance(p, Mapping) else (p.weight, p.bias)
  return jnp.sum(weight**2) + jnp.sum(bias)


def test_identical_trajectories_and_portable_state_dicts():
  results = {}
  for name, params in containers().items():
    opt = optcore.adamw(1e-2, weight_decay=0.1).create(params)
    for step in range(4):
      opt = opt.apply_gradient(jax.grad(loss)(opt.target), learning_rate=1e-2 / (1 + step))
    results[name] = opt.state_dict()
  reference = results.pop("dict")
  for name, sd in results.items():
    assert jax.tree_util.tree_structure(sd) == jax.tree_util.tree_structure(reference), name
    for a, b in zip(jax.tree.leaves(sd), jax.tree.leaves(reference), strict=True):
      np.testing.assert_array_equal(a, b)
  # A checkpoint written from one container restores into another.
  eqx_opt = optcore.adamw(1e-2, weight_decay=0.1).create(containers()["equinox"])
  restored = eqx_opt.restore_state(results["frozendict"])
  assert isinstance(restored.target, Linear)
  np.testing.assert_array_equal(restored.target.weight, reference["target"]["weight"])
