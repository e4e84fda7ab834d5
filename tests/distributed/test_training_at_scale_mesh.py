"""Training at scale on the 8-device CPU mesh: accumulate over mixed_precision
(bfloat16 parameters and state, float32 master copies), ZeRO-1's state_axis
and the state in pinned host memory, all at once, in every face; the
one-device numbers to the last bits (a sharded step rounds an adam division in
the last place now and then); each device holding 1/8 of every new state
leaf; an orbax checkpoint taken mid-accumulation resumes exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from faces import FACES
from jax.sharding import Mesh, PartitionSpec
from sharding_setup import AXES, grads_at, make_params
from sharding_setup import MODEL_RULES as RULES
from tree_testing import assert_trees_equal, assert_trees_within_ulps

import optcore


def stack():
  return optcore.accumulate(
    optcore.mixed_precision(optcore.adam(0.05), state_dtype=jnp.bfloat16, master_dtype=jnp.float32),
    every=2,
  )


def bf16_params():
  return jax.tree.map(lambda x: x.astype(jnp.bfloat16), make_params())


def one_device_run(steps):
  opt = stack().create(bf16_params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(steps):
    opt = step(opt, grads_at(i, opt.target))
  return opt


def host_state(opt):
  return [x for x in jax.tree.leaves(opt.state) if x.ndim]


def test_everything_at_once_on_the_mesh_gives_the_one_device_numbers(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))
  opt = stack().create_sharded(
    bf16_params(), AXES, mesh, RULES, state_axis="data", state_memory_kind="pinned_host"
  )
  shardings = jax.tree.map(lambda x: x.sharding, opt)
  step = jax.jit(
    lambda o, g: o.apply_gradient(g), in_shardings=(shardings, None), out_shardings=shardings
  )
  for i in range(5):
    opt = step(opt, grads_at(i, opt.target))
    assert {x.sharding.memory_kind for x in host_state(opt)} == {"pinned_host"}
  # Sharded against one device: XLA rounds a shard's adam division in the last bit now and
  # then (measured in CI: 11 of 256 float32 elements, 1 ulp, on one Python of three; after
  # five steps one small element 6 of its own ulps off, 2e-9 in a leaf whose scale is 1.8).
  assert_trees_within_ulps(opt, one_device_run(5))
  state = opt.state.param_states
  assert int(opt.state.step) == 2 and int(state.mini_step) == 1
  # The accumulator and the master copy: 1/8 of the leaf per device (model
  # axis from the logical axes, data from state_axis), in pinned host memory.
  for leaf in (state.accumulated["dense"]["kernel"], state.inner.master["dense"]["kernel"]):
    assert leaf.sharding.spec == PartitionSpec("data", "model")
    assert {s.data.size for s in leaf.addressable_shards} == {leaf.size // 8}
  assert opt.target["dense"]["kernel"].sharding.spec == PartitionSpec(None, "model")
  assert opt.target["dense"]["kernel"].sharding.memory_kind == "device"


@pytest.mark.parametrize("face", FACES, ids=str)
def test_every_face_runs_the_stack_on_the_mesh(face, cpu_devices):
  mesh = Mesh(np.array(cpu_devices), ("data",))
  params = {"kernel": bf16_params()["dense"]["kernel"], "bias": bf16_params()["dense"]["bias"]}
  handle = face.create_sharded(
    stack(), params, mesh, state_axis="data", state_memory_kind="pinned_host"
  )
  step = face.jit(face.step)
  reference = stack().create(params)
  for i in range(3):
    g = grads_at(i, params)
    handle = step(handle, g, {})
    reference = jax.jit(lambda o, g: o.apply_gradient(g))(reference, g)
  assert_trees_within_ulps(face.params(handle), reference.target)
  written = face.state_dict(handle)["state"]["param_states"]
  kernel_master = written["inner"]["master"]["kernel"]
  assert kernel_master.sharding.memory_kind == "pinned_host"
  assert {s.data.size for s in kernel_master.addressable_shards} == {kernel_master.size // 8}


def test_an_orbax_checkpoint_mid_accumulation_resumes_exactly(tmp_path, cpu_devices):
  ocp = pytest.importorskip(
    "orbax.checkpoint", reason="needs orbax-checkpoint (the nox variant all installs it)"
  )
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))

  def create():
    return stack().create_sharded(
      bf16_params(), AXES, mesh, RULES, state_axis="data", state_memory_kind="pinned_host"
    )

  step = jax.jit(lambda o, g: o.apply_gradient(g))
  opt = create()
  for i in range(3):
    opt = step(opt, grads_at(i, opt.target))
  assert int(opt.state.param_states.mini_step) == 1  # a gradient is held in the mean
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "ckpt", opt.state_dict())
  checkpointer.wait_until_finished()

  fresh = create()
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), fresh.state_dict()
  )
  resumed = fresh.restore_state(ocp.StandardCheckpointer().restore(tmp_path / "ckpt", abstract))
  assert {x.sharding.memory_kind for x in host_state(resumed)} == {"pinned_host"}
  for i in range(3, 6):
    opt = step(opt, grads_at(i, opt.target))
    resumed = step(resumed, grads_at(i, resumed.target))
  assert_trees_equal(resumed, opt)
