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


def assert_trees_within_ulps(actual, expected, ulps: int = 2):
  """Same structure and dtypes; floating leaves within ``ulps`` units in the last place of
  the leaf's scale (its largest magnitude), the others equal. For a sharded run against one
  device: XLA's CPU code for a shard-sized array rounds a division or square root in the last
  bit where the whole array's does not (which elements depends on how the loop is
  vectorised), and after a few steps that 1-ulp difference of an O(1) operand shows in a
  small element as several of its own ulps (CI saw 6 in 0.0069 of a leaf whose largest
  element is 1.8). A wrong algorithm moves leaves by a learning rate, orders of magnitude
  more."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
    dtype = jnp.result_type(a)
    assert dtype == jnp.result_type(e)
    if jnp.issubdtype(dtype, jnp.floating):
      eps = float(jnp.finfo(dtype).eps)
      a32, e32 = np.asarray(a, np.float32), np.asarray(e, np.float32)
      scale = float(np.max(np.abs(e32), initial=0.0)) or 1.0
      np.testing.assert_allclose(a32, e32, rtol=ulps * eps, atol=ulps * eps * scale)
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Linear:
  """A module-like pytree: attribute names become keys, as for Equinox."""

  weight: jax.Array
  bias: jax.Array
