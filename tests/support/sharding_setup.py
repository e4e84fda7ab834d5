"""The parameters, logical axes and rules that the multi-device tests share."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

# Every parameter has one dimension that the 8-way mesh axis 'x' splits.
RULES = [("mlp", "x"), ("heads", "x"), ("embed", None), ("layers", None)]
# The same axes on a 2-D ('data', 'model') mesh: 'model' splits, 'data' is left to state_axis.
MODEL_RULES = [("mlp", "model"), ("heads", "model"), ("embed", None), ("layers", None)]
AXES = {
  "dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")},
  "attn": P("layers", "embed", "heads"),
}


# Optimizers that reduce across all leaves (L-BFGS's two-loop recursion, Momo's
# loss-based step size): sharding reorders their float32 sums, and they amplify
# the rounding. Measured: 1.6e-6 relative (lbfgs), 1.6e-6 absolute (momo).
# GaLore takes an SVD of each gradient matrix and projects onto its singular
# vectors: both contract the sharded dimension, so the sharded run sums per device
# and then across devices, another float32 order, which the SVD amplifies. Measured
# against the 1e-6 tolerance: 0.67x on jax 0.10.2, 0.91x on jax 0.12.0.1 (2-core
# x86 CPU), and 7e-6 relative on another machine with jax 0.12.
# SOAP takes eigh and QR of factors that the sharded run sums in another order.
# Shampoo's inverse roots (coupled Newton iterations) amplify that reordering by the
# statistics' condition number: 1.6e-6 relative with the catalogue's matrix_epsilon=1e-2
# (3.6e-4 with the default 1e-6, where a few gradients leave the statistics near-singular).
# Dion orthonormalises M Q, whose sharded rows the mesh sums in another order, by a QR that
# amplifies it: 1.1e-6 absolute on an element of 0.12 after 3 steps under ZeRO-1 (2-core x86
# CPU, jax 0.12), against 1e-6 + 1e-6 relative.
REORDERED_TOLERANCE = {
  "lbfgs": 1e-5,
  "contrib.momo": 1e-5,
  "contrib.galore": 1e-5,
  "contrib.soap": 1e-5,
  "contrib.shampoo": 1e-5,
  "contrib.dion": 1e-5,
}


def grads_at(i: int, params: Any) -> Any:
  """Step ``i``'s gradients: normal, in ``params``' structure, shapes and dtypes."""
  key = jax.random.key(i)
  leaves, treedef = jax.tree.flatten(params)
  return treedef.unflatten(
    [jax.random.normal(jax.random.fold_in(key, j), x.shape, x.dtype) for j, x in enumerate(leaves)]
  )


def make_params(seed: int = 0) -> dict[str, Any]:
  rng = np.random.default_rng(seed)
  return {
    "dense": {
      "kernel": jnp.asarray(rng.normal(size=(16, 32)), jnp.float32),
      "bias": jnp.asarray(rng.normal(size=(32,)), jnp.float32),
    },
    "attn": jnp.asarray(rng.normal(size=(2, 8, 16)), jnp.float32),
  }


def comparable(x: Any) -> np.ndarray:
  """A NumPy copy of any state leaf (typed PRNG keys as their key data)."""
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  return np.asarray(x)


def param_for(keys: tuple, by_path: dict[tuple, Any], shape: tuple[int, ...]) -> Any:
  """The entry of ``by_path`` (keyed by parameter key paths, each holding the
  parameter first) whose path ends a state leaf's ``keys`` and whose
  parameter has ``shape``; None when there is none."""
  for n in range(1, len(keys) + 1):
    entry = by_path.get(tuple(keys[-n:]))
    if entry is not None:
      param = entry[0] if isinstance(entry, tuple) else entry
      if param.shape == shape:
        return entry
  return None


def param_shaped_leaves(tree: Any, params: Any) -> list[tuple[str, Any]]:
  """The leaves of ``tree`` whose path ends with a parameter's path and whose
  shape is that parameter's."""
  param_at = {tuple(k): p for k, p in jax.tree_util.tree_flatten_with_path(params)[0]}
  return [
    (jax.tree_util.keystr(keys), leaf)
    for keys, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
    if param_for(keys, param_at, leaf.shape) is not None
  ]
