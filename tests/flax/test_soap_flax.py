"""optcore.contrib.soap in the Flax face: Linen's partitioning metadata (a scanned block's
``layers`` axis) and an nnx model's axis names give SOAP its batch and matrix dimensions,
through `optcore_flax.create_sharded` and `optcore_flax.nnx.Optimizer`, as the same axes
written by hand give."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from axes_models import Model, NnxModel
from flax import linen as nn
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import optcore
import optcore_flax


def random_like(tree, seed):
  leaves, treedef = jax.tree.flatten(tree)
  key = jax.random.key(seed)
  return treedef.unflatten(
    [jax.random.normal(jax.random.fold_in(key, i), x.shape) for i, x in enumerate(leaves)]
  )


def test_linen_metadata_gives_soap_its_stacked_factors():
  boxed = Model().init(jax.random.key(0), jnp.ones((2, 8)))
  axes = optcore_flax.param_logical_axes(boxed)
  mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
  opt_def = optcore.contrib.soap(0.01, precondition_frequency=2)
  opt = optcore_flax.create_sharded(opt_def, boxed, mesh, [("mlp", "model")])
  explicit = optcore.contrib.soap(0.01, precondition_frequency=2, param_logical_axes=axes)
  explicit = explicit.create(nn.unbox(boxed))
  for i in range(3):
    grads = random_like(explicit.target, i)
    opt, explicit = opt.apply_gradient(grads), explicit.apply_gradient(grads)
  jax.tree.map(np.testing.assert_array_equal, opt.target, explicit.target)
  factors = opt.state.param_states.gg["params"]["ScanBlock_0"]["Dense_0"]["kernel"]
  assert [m.shape for m in factors.matrices] == [(3, 8, 8), (3, 16, 16)]  # per layer
  assert factors.batch_dims == (0,)


def test_the_nnx_face_gives_soap_the_models_own_axes():
  from optcore_flax import nnx as ocnnx

  with nnx.use_eager_sharding(False):
    model = NnxModel(nnx.Rngs(0))
  plain = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  optimizer = ocnnx.Optimizer(model, optcore.contrib.soap(0.01), wrt=nnx.Param)
  axes = {"dense": {"kernel": P("embed", "mlp")}, "stack": P("layers", "embed", "mlp")}
  axes |= {"scale": P("mlp")}
  by_hand = optcore.contrib.soap(0.01, param_logical_axes=axes).create(plain)
  for i in range(3):
    grads = random_like(plain, i)
    as_state = jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
    nnx.replace_by_pure_dict(as_state, grads)
    optimizer.update(model, as_state)
    by_hand = by_hand.apply_gradient(grads)
  jax.tree.map(
    np.testing.assert_array_equal, nnx.to_pure_dict(nnx.state(model, nnx.Param)), by_hand.target
  )
  assert not np.array_equal(by_hand.target["stack"], plain["stack"])
