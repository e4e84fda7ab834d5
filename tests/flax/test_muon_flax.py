"""optcore.contrib.muon in the Flax face: a Linen model's partitioning metadata
(and an nnx model's axis names) gives Muon its matrix dimensions through
`optcore_flax.create_sharded`, and a scanned layer's kernel is a batch of
matrices, as the same axes by hand give."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
from axes_models import Model, NnxModel
from flax import linen as nn
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import optcore
import optcore_flax


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


def test_nnx_metadata_gives_muon_its_matrices():
  with nnx.use_eager_sharding(False):  # axis names as metadata, no mesh at construction
    params = nnx.state(NnxModel(nnx.Rngs(0)), nnx.Param)
  axes = optcore_flax.param_logical_axes(params)
  assert axes["stack"].get_value() == P("layers", "embed", "mlp")
  mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
  opt = optcore_flax.create_sharded(optcore.contrib.muon(0.02), params, mesh, [("mlp", "model")])
  # The same algorithm with the dimensions written by hand, on plain arrays.
  plain = {"dense": {"kernel": params["dense"]["kernel"].get_value()}}
  plain |= {"stack": params["stack"].get_value(), "scale": params["scale"].get_value()}
  dims = {
    "dense": {"kernel": optax.contrib.MuonDimensionNumbers((0,), (1,))},
    "stack": optax.contrib.MuonDimensionNumbers((1,), (2,)),
    "scale": None,
  }
  tx = optax.contrib.muon(0.02, muon_weight_dimension_numbers=dims)
  grads = jax.tree.map(jnp.ones_like, plain)
  updates, _ = tx.update(grads, tx.init(plain), plain)
  expected = optax.apply_updates(plain, updates)
  opt = opt.apply_gradient(jax.tree.map(jnp.ones_like, opt.target))
  got = nnx.to_pure_dict(opt.target)
  jax.tree.map(np.testing.assert_array_equal, got, expected)


def test_the_nnx_face_gives_muon_the_models_own_axes():
  """optcore_flax.nnx.Optimizer reads the axis names on the model's variables (no axes passed):
  the stacked kernel is three (embed, mlp) matrices, as with the axes written by hand."""
  from optcore_flax import nnx as ocnnx

  with nnx.use_eager_sharding(False):
    model = NnxModel(nnx.Rngs(0))
  plain = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  optimizer = ocnnx.Optimizer(model, optcore.contrib.muon(0.02), wrt=nnx.Param)
  optimizer.update(model, jax.tree.map(jnp.ones_like, nnx.state(model, nnx.Param)))
  axes = {"dense": {"kernel": P("embed", "mlp")}, "stack": P("layers", "embed", "mlp")}
  axes |= {"scale": P("mlp")}
  by_hand = optcore.contrib.muon(0.02, param_logical_axes=axes).create(plain)
  by_hand = by_hand.apply_gradient(jax.tree.map(jnp.ones_like, plain))
  jax.tree.map(
    np.testing.assert_array_equal, nnx.to_pure_dict(nnx.state(model, nnx.Param)), by_hand.target
  )
