"""optcore.grouped on the 8-device mesh: a grouped buffer is replicated, or split
over the data axis under state_axis (ZeRO-1), ungrouped leaves keep the axes
of their parameters; the steps equal the unsharded grouped run; an orbax
checkpoint of a grouped optimizer restores ungrouped and back."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from sharding_setup import AXES, RULES, make_params

import optcore

MAX_LEAF_SIZE = 300  # groups dense/bias (32) and attn (256); dense/kernel (512) stays


@pytest.fixture(scope="module")
def mesh(cpu_devices):
  return Mesh(np.array(cpu_devices).reshape(4, 2), ("data", "x"))


def loss(p):
  return (
    jnp.sum(jnp.tanh(p["dense"]["kernel"]) ** 2)
    + jnp.sum(p["dense"]["bias"] ** 3)
    + (jnp.sum(jnp.sin(p["attn"])))
  )


def step(opt):
  return opt.apply_gradient(jax.grad(loss)(opt.target))


@pytest.mark.parametrize("state_axis", [None, "data"])
def test_buffers_are_replicated_or_split_and_the_steps_equal_the_unsharded_run(mesh, state_axis):
  params = make_params()
  opt_def = optcore.grouped(optcore.adam(1e-2), max_leaf_size=MAX_LEAF_SIZE)
  sharded = opt_def.create_sharded(params, AXES, mesh, RULES, state_axis=state_axis)
  assert isinstance(sharded, optcore.GroupedOptimizer)
  (buffer,) = sharded.packed_target.buffers
  assert buffer.shape == (288,) and buffer.sharding.is_fully_replicated
  (kernel,) = sharded.packed_target.ungrouped
  assert kernel.sharding.spec == P(None, "x")
  mu = sharded.packed_state.param_states[0].mu
  if state_axis is None:
    assert mu.buffers[0].sharding.is_fully_replicated
    assert mu.ungrouped[0].sharding.spec == P(None, "x")
  else:  # ZeRO-1: each device holds a quarter of the grouped state
    assert mu.buffers[0].sharding.spec == P("data")
    assert mu.buffers[0].addressable_shards[0].data.shape == (72,)
    assert mu.ungrouped[0].sharding.spec == P("data", "x")
  shardings = opt_def.derive_shardings(sharded, AXES, mesh, RULES, state_axis=state_axis)
  actual = jax.tree.map(lambda x: x.sharding, sharded)
  assert jax.tree.structure(actual) == jax.tree.structure(shardings)
  assert jax.tree.leaves(actual) == jax.tree.leaves(shardings)
  sharded_step = jax.jit(step, in_shardings=(shardings,), out_shardings=shardings)
  plain = opt_def.create(params)
  for _ in range(3):
    sharded, plain = sharded_step(sharded), jax.jit(step)(plain)
  for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_logical_axes_of_a_grouped_optimizer(mesh):
  params = make_params()
  opt_def = optcore.grouped(optcore.sgd(0.1, momentum=0.9), max_leaf_size=MAX_LEAF_SIZE)
  axes = opt_def.derive_logical_axes(opt_def.create(params), AXES)
  assert axes.packed_target.buffers == (P(None),)
  assert axes.packed_target.ungrouped == (P("embed", "mlp"),)
  trace = axes.packed_state.param_states[0].trace
  assert trace.buffers == (P(None),) and trace.ungrouped == (P("embed", "mlp"),)


def test_an_orbax_checkpoint_of_a_grouped_optimizer_restores_either_way(tmp_path, mesh):
  ocp = pytest.importorskip(
    "orbax.checkpoint", reason="needs orbax-checkpoint (the nox variant all installs it)"
  )
  params = make_params()
  opt_def = optcore.grouped(optcore.adam(1e-2), max_leaf_size=MAX_LEAF_SIZE)
  grouped = jax.jit(step)(opt_def.create_sharded(params, AXES, mesh, RULES, state_axis="data"))
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "grouped", grouped.state_dict())
  checkpointer.wait_until_finished()
  plain = optcore.adam(1e-2).create(params)
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, plain.state_dict())
  written = ocp.StandardCheckpointer().restore(tmp_path / "grouped", abstract)
  ungrouped = plain.restore_state(written)
  for got, want in zip(
    jax.tree.leaves((ungrouped.target, ungrouped.state)),
    jax.tree.leaves((grouped.target, grouped.state)),
    strict=True,
  ):
    np.testing.assert_array_equal(got, want)
  # ... and back into a grouped optimizer, which steps on as the original does.
  again = opt_def.create(params).restore_state(written)
  for got, want in zip(jax.tree.leaves(again), jax.tree.leaves(grouped), strict=True):
    np.testing.assert_array_equal(got, want)
  for got, want in zip(
    jax.tree.leaves(jax.jit(step)(again)), jax.tree.leaves(jax.jit(step)(grouped)), strict=True
  ):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
