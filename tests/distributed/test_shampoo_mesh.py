"""`optcore.contrib.shampoo` on the 8-device CPU mesh: the statistics and preconditioners
follow the axis they precondition (and ZeRO-1's split), host memory holds them where asked,
the numbers are one device's, and orbax round-trips the sharded state onto another mesh."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

import optcore

LAYERS, EMBED, MLP, VOCAB = 2, 16, 32, 64
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


# Blocks of 32 (no dimension here is cut), no merging (embed and mlp stay apart), the
# preconditioned update from the third step. The default matrix_epsilon (1e-6) leaves the
# statistics of a few gradients near-singular, and their inverse roots amplify the mesh's
# reordered sums beyond float32 rounding (see tests/support/sharding_setup.py): 1e-2 here.
KWARGS = dict(
  block_size=32, best_effort_shape_interpretation=False, start_preconditioning_step=2,
  graft_type="rmsprop_normalized", matrix_epsilon=1e-2,
)  # fmt: skip


def opt_def(**extra):
  return optcore.contrib.shampoo(0.01, **KWARGS, **extra)


def assert_targets_close(got_tree, want_tree):
  for got, want in zip(jax.tree.leaves(got_tree), jax.tree.leaves(want_tree), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)  # sums in another order


def test_shampoo_from_axes_on_the_mesh_with_zero1(mesh):
  opt = opt_def().create_sharded(params(), AXES, mesh, RULES, state_axis="data")
  one = opt_def(param_logical_axes=AXES).create(params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(4):
    opt, one = step(opt, grads_at(i)), step(one, grads_at(i))
  assert_targets_close(opt.target, one.target)
  state = opt.state.param_states
  stats, precs = state.statistics["wi"].matrices, state.preconditioners["wi"].matrices
  assert [m.shape for m in stats] == [(LAYERS, EMBED, EMBED), (LAYERS, MLP, MLP)]
  # the mlp statistic keeps 'mlp' on 'model' along its rows; ZeRO-1 adds 'data' where it fits
  assert "model" in stats[1].sharding.spec and "data" in stats[1].sharding.spec
  assert {s.data.size for s in stats[1].addressable_shards} == {stats[1].size // 8}
  assert precs[1].sharding.spec == stats[1].sharding.spec
  assert state.statistics["emb"].matrices == ()  # vocab: the graft alone, by its rule
  assert state.momentum["wi"].sharding.spec == state.diagonal_momentum["wi"].sharding.spec


def test_statistics_in_host_memory(mesh):
  where = {"/(statistics|preconditioners)/": "pinned_host"}
  opt = opt_def().create_sharded(params(), AXES, mesh, RULES, state_memory_kind=where)
  one = opt_def(param_logical_axes=AXES).create(params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3):
    opt, one = step(opt, grads_at(i)), step(one, grads_at(i))
    state = opt.state.param_states
    assert state.statistics["wi"].matrices[0].sharding.memory_kind == "pinned_host"
    assert state.preconditioners["wo"].matrices[1].sharding.memory_kind == "pinned_host"
    assert state.momentum["wi"].sharding.memory_kind == "device"
  assert_targets_close(opt.target, one.target)


def test_orbax_restores_the_sharded_statistics_onto_another_mesh(tmp_path, mesh, cpu_devices):
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
  statistic = restored.state.param_states.statistics["wo"].matrices[0]
  assert len(statistic.sharding.device_set) == 4
  one, two = step(restored, grads_at(3)), step(opt, grads_at(3))
  assert_targets_close(one.target, two.target)
