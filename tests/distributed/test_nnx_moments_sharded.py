"""nnx.Optimizer over an optcore definition's as_optax() on an 8-device mesh: each moment is
split as its parameter is (it was replicated whole on every device once optcore_flax was
imported, issue 42), as raw optax's moments are."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh

import optcore
import optcore_flax  # noqa: F401  (optcore reads nnx Variables)
from optcore_flax import nnx as ocnnx


@pytest.mark.parametrize(
  "make_tx",
  [
    lambda: optax.adam(1e-2),
    lambda: optcore.adam(1e-2).as_optax(),
    lambda: optcore.legacy.Adam(1e-2).as_optax(),
  ],
  ids=["raw optax", "optcore.adam", "legacy.Adam"],
)
def test_each_moment_is_split_like_its_parameter(cpu_devices, make_tx):
  mesh = Mesh(np.array(cpu_devices), ("model",))
  with jax.set_mesh(mesh):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), sharding=(None, "model"))
    model = nnx.Linear(16, 64, rngs=nnx.Rngs(0), kernel_init=init, use_bias=False)
    optimizer = nnx.Optimizer(model, make_tx(), wrt=nnx.Param)
  moments = [
    leaf
    for leaf in jax.tree.leaves(nnx.state(optimizer)["opt_state"])
    if getattr(leaf, "shape", None) == (16, 64)
  ]
  assert len(moments) == 2
  for moment in moments:
    per_device = {s.data.nbytes for s in moment.addressable_shards}
    assert per_device == {16 * 64 * 4 // 8}, per_device  # 512 bytes each, not 4096


@pytest.mark.parametrize(
  "make_def",
  [lambda: optcore.adam(1e-2), lambda: optcore.ema(optcore.legacy.Adam(1e-2), 0.9)],
  ids=["adam", "ema(legacy.Adam)"],
)
def test_the_nnx_face_splits_its_moments_and_keeps_them_split_through_a_step(cpu_devices, make_def):
  mesh = Mesh(np.array(cpu_devices), ("model",))
  with jax.set_mesh(mesh):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), sharding=(None, "model"))
    model = nnx.Linear(16, 64, rngs=nnx.Rngs(0), kernel_init=init, use_bias=False)
    optimizer = ocnnx.Optimizer(model, make_def(), wrt=nnx.Param)
    grads = nnx.grad(lambda m: (m(np.ones((2, 16), np.float32)) ** 2).mean())(model)
    nnx.jit(lambda o, m, g: o.update(m, g))(optimizer, model, grads)
  split = [
    leaf
    for leaf in jax.tree.leaves(nnx.state(optimizer)["opt_state"])
    if getattr(leaf, "shape", None) == (16, 64)
  ]
  assert len(split) >= 2  # the moments (and the average)
  for leaf in split:
    assert {s.data.nbytes for s in leaf.addressable_shards} == {16 * 64 * 4 // 8}


def _partitioned_model():
  init = nnx.with_partitioning(nnx.initializers.lecun_normal(), sharding=(None, "model"))
  return nnx.Linear(16, 64, rngs=nnx.Rngs(0), kernel_init=init)


@pytest.mark.parametrize("memory_kind", [None, "pinned_host"], ids=["device", "pinned_host"])
def test_shard_places_zero1_and_host_state_from_the_models_metadata(cpu_devices, memory_kind):
  """optimizer.shard(model, mesh, state_axis=, state_memory_kind=): each moment follows its
  parameter's nnx.with_partitioning names and is split over 'data' as well (ZeRO-1), in host
  memory where asked; steps under nnx.jit keep it there, with one device's numbers."""
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))
  opt_def = optcore.accumulate(optcore.adam(1e-2), every=2)
  x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
  loss = lambda m: (m(x) ** 2).mean()
  step = nnx.jit(lambda o, m: o.update(m, nnx.grad(loss)(m)))
  with jax.set_mesh(mesh):
    model = _partitioned_model()
    optimizer = ocnnx.Optimizer(model, opt_def, wrt=nnx.Param)
    optimizer.shard(model, state_axis="data", state_memory_kind=memory_kind)  # jax.set_mesh's
    for _ in range(3):
      step(optimizer, model)
  reference = nnx.Linear(16, 64, rngs=nnx.Rngs(0))  # one device, no placement
  reference_opt = ocnnx.Optimizer(reference, opt_def, wrt=nnx.Param)
  for _ in range(3):
    step(reference_opt, reference)
  state = optimizer.state.param_states
  for leaf in (state.inner[0].mu["kernel"], state.accumulated["kernel"]):
    assert leaf.sharding.spec == jax.sharding.PartitionSpec("data", "model")
    assert {s.data.nbytes for s in leaf.addressable_shards} == {16 * 64 * 4 // 8}
    assert leaf.sharding.memory_kind == (memory_kind or "device")
  assert state.inner[0].mu["bias"].sharding.spec == jax.sharding.PartitionSpec("data")
  for got, want in zip(
    jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(reference)), strict=True
  ):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_shard_without_a_mesh_says_how_to_give_one():
  model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
  optimizer = ocnnx.Optimizer(model, optcore.adam(1e-2), wrt=nnx.Param)
  with pytest.raises(TypeError, match=r"pass mesh=, or call it inside `with jax.set_mesh"):
    optimizer.shard(model, state_axis="data")
