"""The matrix optimizers in the Flax face, one catalogue row each: Linen's partitioning metadata
(a scanned block's ``layers`` axis) and an nnx model's axis names give SOAP and Shampoo their
batch and matrix dimensions, through `optcore_flax.create_sharded` and
`optcore_flax.nnx.Optimizer`, as the same axes written by hand give (bitwise: the same program)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from axes_models import Model, NnxModel
from flax import linen as nn
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import optcore
import optcore_flax


@dataclass(frozen=True)
class MatrixOptimizer:
  make: Callable[..., optcore.OptimizerDef]  # (**param_logical_axes) -> definition
  field: str  # the state field holding the per-parameter `Preconditioners`
  stacked: list[tuple[int, ...]]  # their shapes for the scanned (3, 8, 16) Linen kernel


CATALOGUE = {
  "soap": MatrixOptimizer(
    lambda **axes: optcore.contrib.soap(0.01, precondition_frequency=2, **axes),
    "gg",
    [(3, 8, 8), (3, 16, 16)],  # per layer: one factor a side
  ),
  "shampoo": MatrixOptimizer(
    lambda **axes: optcore.contrib.shampoo(0.01, 8, start_preconditioning_step=1, **axes),
    "statistics",
    [(3, 8, 8)] * 16,  # per layer: (8, 16) merged into 128 and cut into blocks of 8
  ),
}


def random_like(tree, seed):
  leaves, treedef = jax.tree.flatten(tree)
  key = jax.random.key(seed)
  return treedef.unflatten(
    [jax.random.normal(jax.random.fold_in(key, i), x.shape) for i, x in enumerate(leaves)]
  )


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_linen_metadata_gives_the_stacked_matrices(name):
  row = CATALOGUE[name]
  boxed = Model().init(jax.random.key(0), jnp.ones((2, 8)))
  axes = optcore_flax.param_logical_axes(boxed)
  mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
  opt = optcore_flax.create_sharded(row.make(), boxed, mesh, [("mlp", "model")])
  explicit = row.make(param_logical_axes=axes).create(nn.unbox(boxed))
  for i in range(3):
    grads = random_like(explicit.target, i)
    opt, explicit = opt.apply_gradient(grads), explicit.apply_gradient(grads)
  jax.tree.map(np.testing.assert_array_equal, opt.target, explicit.target)
  kernel = getattr(opt.state.param_states, row.field)["params"]["ScanBlock_0"]["Dense_0"]
  matrices = kernel["kernel"]
  assert [m.shape for m in matrices.matrices] == row.stacked
  assert matrices.batch_dims == (0,)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_the_nnx_face_gives_the_models_own_axes(name):
  from optcore_flax import nnx as ocnnx

  row = CATALOGUE[name]
  with nnx.use_eager_sharding(False):
    model = NnxModel(nnx.Rngs(0))
  plain = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  optimizer = ocnnx.Optimizer(model, row.make(), wrt=nnx.Param)
  axes = {"dense": {"kernel": P("embed", "mlp")}, "stack": P("layers", "embed", "mlp")}
  axes |= {"scale": P("mlp")}
  by_hand = row.make(param_logical_axes=axes).create(plain)
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
