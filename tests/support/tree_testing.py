"""Test helpers shared by the per-package suites (they import only jax and numpy)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


def assert_trees_equal(actual, expected):
  """Same structure, and every leaf bitwise equal (dtype included; PRNG keys by their data)."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    assert jnp.result_type(a) == jnp.result_type(e)
    if jax.dtypes.issubdtype(jnp.result_type(a), jax.dtypes.prng_key):
      a, e = jax.random.key_data(a), jax.random.key_data(e)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Linear:
  """A module-like pytree: attribute names become keys, as for Equinox."""

  weight: jax.Array
  bias: jax.Array
