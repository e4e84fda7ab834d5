"""The matrix optimizers on the 8-device CPU mesh, one catalogue row each (SOAP, Shampoo): the
per-dimension matrices follow the axis they precondition (and ZeRO-1's split), host memory holds
them where asked, the numbers are one device's, and orbax round-trips the sharded state onto
another mesh.

Tolerance: the mesh sums in another order; rtol 2e-5 / atol 2e-6 holds after the refreshes
below under XLA's default, SSE4_2 and AVX instruction sets (the float-sensitive pass reruns it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

import optcore

LAYERS, EMBED, VOCAB = 2, 16, 64
RULES = [("mlp", "model"), ("embed", None), ("layers", None), ("vocab", "model")]
AXES = {
  "wi": P("layers", "embed", "mlp"),
  "wo": P("layers", "mlp", "embed"),
  "norm": P("layers", "embed"),
  "emb": P("vocab", "embed"),
}


@dataclass(frozen=True)
class MatrixOptimizer:
  make: Callable[..., optcore.OptimizerDef]  # (**param_logical_axes) -> definition
  mlp: int  # the kernels' mlp size
  steps: int  # steps to the comparison: past the set-up and a refresh or two
  matrices: str  # the state field of the per-dimension matrices (a factor, a statistic)
  paired: str  # the field whose matrices share their placement (a basis, an inverse root)
  moments: tuple[str, str]  # two parameter-shaped fields placed alike
  vocab_matrices: Callable[[tuple], bool]  # the 'vocab' axis keeps the identity, by its rule


CATALOGUE = {
  # Square kernels: a first gradient of full rank. A tall one's first factor has a null space
  # whose eigenbasis rounding decides, on one device as on eight (docs/concepts/soap.md).
  "soap": MatrixOptimizer(
    lambda **axes: optcore.contrib.soap(0.01, precondition_frequency=2, **axes),
    mlp=16, steps=5, matrices="gg", paired="q", moments=("exp_avg", "exp_avg_sq"),
    vocab_matrices=lambda matrices: matrices[0] is None,
  ),
  # Blocks of 32 (no dimension here is cut), no merging (embed and mlp stay apart), the
  # preconditioned update from the third step. The default matrix_epsilon (1e-6) leaves the
  # statistics of a few gradients near-singular, and their inverse roots amplify the mesh's
  # reordered sums beyond float32 rounding (see tests/support/sharding_setup.py): 1e-2 here.
  "shampoo": MatrixOptimizer(
    lambda **axes: optcore.contrib.shampoo(
      0.01, block_size=32, best_effort_shape_interpretation=False, start_preconditioning_step=2,
      graft_type="rmsprop_normalized", matrix_epsilon=1e-2, **axes,
    ),
    mlp=32, steps=4, matrices="statistics", paired="preconditioners",
    moments=("momentum", "diagonal_momentum"), vocab_matrices=lambda matrices: matrices == (),
  ),
}  # fmt: skip
NAMES = sorted(CATALOGUE)


def shapes(row):
  return {
    "wi": (LAYERS, EMBED, row.mlp),
    "wo": (LAYERS, row.mlp, EMBED),
    "norm": (LAYERS, EMBED),
    "emb": (VOCAB, EMBED),
  }


def params(row):
  key = jax.random.key(0)
  return {
    k: 0.1 * jax.random.normal(jax.random.fold_in(key, i), s)
    for i, (k, s) in enumerate(shapes(row).items())
  }


def grads_at(row, i):
  key = jax.random.key(10 + i)
  return {k: jax.random.normal(jax.random.fold_in(key, j), s) for j, (k, s) in
          enumerate(shapes(row).items())}  # fmt: skip


def assert_targets_close(got_tree, want_tree):
  for got, want in zip(jax.tree.leaves(got_tree), jax.tree.leaves(want_tree), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)  # sums in another order


@pytest.fixture
def mesh(cpu_devices):
  return Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))


@pytest.mark.parametrize("name", NAMES)
def test_from_axes_on_the_mesh_with_zero1(mesh, name):
  row = CATALOGUE[name]
  opt = row.make().create_sharded(params(row), AXES, mesh, RULES, state_axis="data")
  one = row.make(param_logical_axes=AXES).create(params(row))
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(row.steps):
    opt, one = step(opt, grads_at(row, i)), step(one, grads_at(row, i))
  assert_targets_close(opt.target, one.target)
  state = opt.state.param_states
  matrices = getattr(state, row.matrices)["wi"].matrices
  paired = getattr(state, row.paired)["wi"].matrices
  assert [m.shape for m in matrices] == [(LAYERS, EMBED, EMBED), (LAYERS, row.mlp, row.mlp)]
  # the mlp matrix keeps 'mlp' on 'model' along its rows; ZeRO-1 adds 'data' where it fits
  assert "model" in matrices[1].sharding.spec and "data" in matrices[1].sharding.spec
  assert {s.data.size for s in matrices[1].addressable_shards} == {matrices[1].size // 8}
  assert paired[1].sharding.spec == matrices[1].sharding.spec
  assert row.vocab_matrices(getattr(state, row.matrices)["emb"].matrices)
  first, second = (getattr(state, f)["wi"].sharding.spec for f in row.moments)
  assert first == second


@pytest.mark.parametrize("name", NAMES)
def test_the_matrices_in_host_memory(mesh, name):
  row = CATALOGUE[name]
  where = {f"/({row.matrices}|{row.paired})/": "pinned_host"}
  opt = row.make().create_sharded(params(row), AXES, mesh, RULES, state_memory_kind=where)
  one = row.make(param_logical_axes=AXES).create(params(row))
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3):
    opt, one = step(opt, grads_at(row, i)), step(one, grads_at(row, i))
    state = opt.state.param_states
    assert getattr(state, row.matrices)["wi"].matrices[0].sharding.memory_kind == "pinned_host"
    assert getattr(state, row.paired)["wo"].matrices[1].sharding.memory_kind == "pinned_host"
    assert getattr(state, row.moments[0])["wi"].sharding.memory_kind == "device"
  assert_targets_close(opt.target, one.target)


@pytest.mark.parametrize("name", NAMES)
def test_orbax_restores_the_sharded_matrices_onto_another_mesh(tmp_path, mesh, cpu_devices, name):
  ocp = pytest.importorskip(
    "orbax.checkpoint", reason="needs orbax-checkpoint (the nox variant all installs it)"
  )
  row = CATALOGUE[name]
  opt = row.make().create_sharded(params(row), AXES, mesh, RULES, state_axis="data")
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3):
    opt = step(opt, grads_at(row, i))
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "ckpt", opt.state_dict())
  checkpointer.wait_until_finished()

  other = Mesh(np.array(cpu_devices[:4]).reshape(1, 4), ("data", "model"))
  fresh = row.make().create_sharded(params(row), AXES, other, RULES)
  like = fresh.state_dict()
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
  )
  restored = fresh.restore_state(ocp.StandardCheckpointer().restore(tmp_path / "ckpt", abstract))
  assert_trees_equal(restored.state, jax.device_get(opt.state))
  matrix = getattr(restored.state.param_states, row.matrices)["wo"].matrices[0]
  assert len(matrix.sharding.device_set) == 4
  one, two = step(restored, grads_at(row, 3)), step(opt, grads_at(row, 3))
  assert_targets_close(one.target, two.target)
