"""optcore's logical-to-mesh mapping against Flax's own, on random specs and rules."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import optcore

LOGICAL = ["batch", "embed", "mlp", "heads", "kv", "vocab", "layers"]
MESH = ["data", "model", ("data", "model"), None]


def _random_case(rng: np.random.Generator) -> tuple[P, list]:
  rank = int(rng.integers(1, 5))
  names = list(rng.choice(LOGICAL, size=rank, replace=False))
  names = [None if rng.random() < 0.2 else n for n in names]
  rules = [
    (str(rng.choice(LOGICAL)), MESH[int(rng.integers(len(MESH)))])
    for _ in range(int(rng.integers(0, 8)))
  ]
  return P(*names), rules


@pytest.mark.parametrize("seed", range(400))
def test_logical_to_mesh_axes_equals_flax(seed):
  spec, rules = _random_case(np.random.default_rng(seed))
  assert optcore.logical_to_mesh_axes(spec, rules) == nn.logical_to_mesh_axes(tuple(spec), rules)


def test_linen_partition_specs_drive_the_optimizer_axes():
  """Logical axes from a Linen model's boxed params, as T5X users have them."""

  class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
      init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
      return nn.Dense(16, kernel_init=init, use_bias=False)(x)

  boxed = Mlp().init(jax.random.key(0), jnp.zeros((1, 8)))["params"]
  axes = nn.get_partition_spec(boxed)
  params = nn.unbox(boxed)
  state = optax.adafactor(0.1, min_dim_size_to_factor=4).init(params)
  derived = optcore.derive_optax_logical_axes(state, axes, params)
  kernel = derived[0]
  # (8, 16): the largest dimension (mlp) is reduced in v_row, the other in v_col.
  assert kernel.v_row["Dense_0"]["kernel"] == P("embed")
  assert kernel.v_col["Dense_0"]["kernel"] == P("mlp")
  mesh_axes = optcore.logical_to_mesh(derived, [("mlp", "model"), ("embed", "data")])
  assert mesh_axes[0].v_col["Dense_0"]["kernel"] == nn.logical_to_mesh_axes(
    ("mlp",), [("mlp", "model")]
  )
