"""`optcore.contrib.soap` on the 8-device CPU mesh: the factors follow the axis they
precondition (and ZeRO-1's split), host memory holds them where asked, the numbers are one
device's, and orbax round-trips the sharded state onto another mesh."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

import optcore

# Square kernels: a first gradient of full rank. A tall one's first factor has a null space
# whose eigenbasis rounding decides, on one device as on eight (docs/concepts/soap.md).
LAYERS, EMBED, MLP, VOCAB = 2, 16, 16, 64
RULES = [("mlp", "model"), ("embed", None), ("layers", None), ("vocab", "model")]
AXES = {
  "wi": P("layers", "embed", "mlp"),
  "wo": P("layers", "mlp", "embed"),
  "norm": P("layers", "embed"),
  "emb": P("vocab", "embed"),
}
SHAPES = {
  "wi": (LAYERS, EMBED, MLP),
  "wo": (LAYERS, MLP, EMBED),
  "norm": (LAYERS, EMBED),
  "emb": (VOCAB, EMBED),
}


def params():
  key = jax.random.key(0)
  return {
    k: 0.1 * jax.random.normal(jax.random.fold_in(key, i), s)
    for i, (k, s) in enumerate(SHAPES.items())
  }


def grads_at(i):
  key = jax.random.key(10 + i)
  return {k: jax.random.normal(jax.random.fold_in(key, j), s) for j, (k, s) in
          enumerate(SHAPES.items())}  # fmt: skip


@pytest.fixture
def mesh(cpu_devices):
  return Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))


def opt_def():
  return optcore.contrib.soap(0.01, precondition_frequency=2)


def test_soap_from_axes_on_the_mesh_with_zero1(mesh):
  opt = opt_def().create_sharded(params(), AXES, mesh, RULES, state_axis="data")
  one = optcore.contrib.soap(0.01, precondition_frequency=2, param_logical_axes=AXES)
  one = one.create(params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(5):  # the set-up step, refreshes at steps 2 and 4
    opt, one = step(opt, grads_at(i)), step(one, grads_at(i))
  for got, want in zip(jax.tree.leaves(opt.target), jax.tree.leaves(one.target), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)  # sums in another order
  state = opt.state.param_states
  gg, q = state.gg["wi"].matrices, state.q["wi"].matrices
  assert [m.shape for m in gg] == [(LAYERS, EMBED, EMBED), (LAYERS, MLP, MLP)]
  # the mlp factor keeps 'mlp' on 'model' along its rows; ZeRO-1 adds 'data' where it fits
  assert "model" in gg[1].sharding.spec and "data" in gg[1].sharding.spec
  assert {s.data.size for s in gg[1].addressable_shards} == {gg[1].size // 8}
  assert q[1].sharding.spec == gg[1].sharding.spec
  assert state.gg["emb"].matrices[0] is None  # vocab: the identity, by its rule
  assert state.exp_avg["wi"].sharding.spec == opt.state.param_states.exp_avg_sq["wi"].sharding.spec


def test_factors_in_host_memory(mesh):
  opt = opt_def().create_sharded(
    params(), AXES, mesh, RULES, state_memory_kind={"/(gg|q)/": "pinned_host"}
  )
  one = optcore.contrib.soap(0.01, precondition_frequency=2, param_logical_axes=AXES)
  one = one.create(params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3):
    opt, one = step(opt, grads_at(i)), step(one, grads_at(i))
    state = opt.state.param_states
    assert state.gg["wi"].matrices[0].sharding.memory_kind == "pinned_host"
    assert state.q["wo"].matrices[1].sharding.memory_kind == "pinned_host"
    assert state.exp_avg["wi"].sharding.memory_kind == "device"
  for got, want in zip(jax.tree.leaves(opt.target), jax.tree.leaves(one.target), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_orbax_restores_the_sharded_factors_onto_another_mesh(tmp_path, mesh, cpu_devices):
  ocp = pytest.importorskip(
    "orbax.checkpoint", reason="needs orbax-checkpoint (the nox variant all installs it)"
  )
  opt = opt_def().create_sharded(params(), AXES, mesh, RULES, state_axis="data")
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3):
    opt = step(opt, grads_at(i))
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "ckpt", opt.state_dict())
  checkpointer.wait_until_finished()

  other = Mesh(np.array(cpu_devices[:4]).reshape(1, 4), ("data", "model"))
  fresh = opt_def().create_sharded(params(), AXES, other, RULES)
  like = fresh.state_dict()
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
  )
  restored = fresh.restore_state(ocp.StandardCheckpointer().restore(tmp_path / "ckpt", abstract))
  assert_trees_equal(restored.state, jax.device_get(opt.state))
  factor = restored.state.param_states.gg["wo"].matrices[0]
  assert len(factor.sharding.device_set) == 4
  one, two = step(restored, grads_at(3)), step(opt, grads_at(3))
  for got, want in zip(jax.tree.leaves(one.target), jax.tree.leaves(two.target), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
