"""Flax models whose parameters carry logical axes: a Linen model scanning a block over a
``layers`` axis, and an nnx model with axis names on its variables (a stacked
``(layers, embed, mlp)`` kernel among them). Shared by the Flax face's Muon and SOAP tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import nnx


class Block(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    h = nn.Dense(16, kernel_init=init, use_bias=False)(x)
    init_out = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("mlp", "embed"))
    return x + nn.Dense(8, kernel_init=init_out, use_bias=False)(jnp.tanh(h)), None


class Model(nn.Module):
  @nn.compact
  def __call__(self, x):
    scanned = nn.scan(
      Block,
      variable_axes={"params": 0},
      split_rngs={"params": True},
      length=3,
      metadata_params={nn.PARTITION_NAME: "layers"},
    )
    x, _ = scanned()(x, None)
    return x


class NnxModel(nnx.Module):
  """An nnx model whose parameters carry axis names (nnx.with_partitioning), a
  stacked (layers, embed, mlp) kernel among them."""

  def __init__(self, rngs):
    kernel_init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))
    self.dense = nnx.Linear(8, 16, kernel_init=kernel_init, use_bias=False, rngs=rngs)
    stacked = jax.random.normal(rngs.params(), (3, 8, 16)) * 0.1
    self.stack = nnx.Param(stacked, out_sharding=("layers", "embed", "mlp"))
    self.scale = nnx.Param(jnp.ones(16), out_sharding=("mlp",))
