"""optcore.contrib.shampoo in the Flax face: Linen's partitioning metadata (a scanned block's
``layers`` axis) and an nnx model's axis names give Shampoo its batch and matrix dimensions,
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


def test_linen_metadata_gives_shampoo_its_stacked_statistics():
  boxed = Model().init(jax.random.key(0), jnp.ones((2, 8)))
  axes = optcore_flax.param_logical_axes(boxed)
  mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
  opt_def = optcore.contrib.shampoo(0.01, 8, start_preconditioning_step=1)
  opt = optcore_flax.create_sharded(opt_def, boxed, mesh, [("mlp", "model")])
  explicit = optcore.contrib.shampoo(0.01, 8, start_preconditioning_step=1, param_logical_axes=axes)
  explicit = explicit.create(nn.unbox(boxed))
  for i in range(3):
    grads = random_like(explicit.target, i)
    opt, explicit = opt.apply_gradient(grads), explicit.apply_gradient(grads)
  jax.tree.map(np.testing.assert_array_equal, opt.target, explicit.target)
  stats = opt.state.param_states.statistics["params"]["ScanBlock_0"]["Dense_0"]["kernel"]
  # per layer: (8, 16) merged into 128 and cut into blocks of 8
  assert [m.shape for m in stats.matrices] == [(3, 8, 8)] * 16
  assert stats.batch_dims == (0,)


def test_the_nnx_face_gives_shampoo_the_models_own_axes():
  from optcore_flax import nnx as ocnnx

  with nnx.use_eager_sharding(False):
    model = NnxModel(nnx.Rngs(0))
  plain = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  optimizer = ocnnx.Optimizer(model, optcore.contrib.shampoo(0.01, 8), wrt=nnx.Param)
  axes = {"dense": {"kernel": P("embed", "mlp")}, "stack": P("layers", "embed", "mlp")}
  axes |= {"scale": P("mlp")}
  by_hand = optcore.contrib.shampoo(0.01, 8, param_logical_axes=axes).create(plain)
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
