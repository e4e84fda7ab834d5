"""optcore.contrib.muon in the Flax face: a Linen model's partitioning metadata
gives Muon its matrix dimensions through `optcore_flax.create_sharded`, and a
scanned layer's kernel is a batch of matrices, as the same axes by hand give."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import optcore
import optcore_flax


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


def test_linen_metadata_gives_muon_its_matrices():
  x = jnp.ones((2, 8))
  boxed = Model().init(jax.random.key(0), x)
  axes = optcore_flax.param_logical_axes(boxed)
  kernel_axes = axes["params"]["ScanBlock_0"]["Dense_0"]["kernel"]
  assert kernel_axes == P("layers", "embed", "mlp")
  mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
  opt = optcore_flax.create_sharded(optcore.contrib.muon(0.02), boxed, mesh, [("mlp", "model")])
  explicit = optcore.contrib.muon(0.02, param_logical_axes=axes).create(nn.unbox(boxed))
  grads = jax.tree.map(jnp.ones_like, opt.target)
  opt, explicit = opt.apply_gradient(grads), explicit.apply_gradient(grads)
  jax.tree.map(np.testing.assert_array_equal, opt.target, explicit.target)
  mu = opt.state.param_states.inner_states["muon"].inner_state[0].mu
  assert mu["params"]["ScanBlock_0"]["Dense_0"]["kernel"].shape == (3, 8, 16)
