"""Portable checkpoints with the real orbax-checkpoint: saved from any face of
the registry (`faces.FACES`), restored into any other, resharded from 8
devices to 4, and never corrupted by a killed save."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from faces import FACES
from jax.sharding import Mesh
from sharding_setup import AXES, RULES, make_params
from tree_testing import assert_trees_equal

import optcore

ocp = pytest.importorskip(
  "orbax.checkpoint", reason="needs orbax-checkpoint (the nox variant all installs it)"
)

HERE = Path(__file__).parent


def save(path: Path, tree) -> None:
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(path, tree)
  checkpointer.wait_until_finished()


def restore(path: Path, like, shardings=None):
  """Restores into the shapes and dtypes of ``like`` (and ``shardings`` when given)."""
  if shardings is None:
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
  else:
    abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), like, shardings
    )
  return ocp.StandardCheckpointer().restore(path, abstract)


def loss(p):
  return jnp.sum(jnp.tanh(p["kernel"]) ** 2) + jnp.sum(p["bias"] ** 3)


@pytest.mark.parametrize(("saver", "restorer"), list(itertools.permutations(FACES, 2)), ids=str)
def test_a_checkpoint_saved_by_one_face_restores_into_another(tmp_path, saver, restorer):
  rng = np.random.default_rng(0)
  params = {
    "kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
    "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
  }
  config = optcore.config.from_config({"name": "adamw", "learning_rate": 1e-2, "weight_decay": 0.1})
  # jit against jit: eager and jitted steps may differ by an ulp.
  saver_step, restorer_step = saver.jit(saver.step), restorer.jit(restorer.step)

  handle = saver.create(config, params)
  for _ in range(3):
    handle = saver_step(handle, jax.grad(loss)(saver.params(handle)), {})
  save(tmp_path / "checkpoint", {"state": saver.state_dict(handle)["state"]})

  other = restorer.create(config, saver.params(handle))
  written = restorer.state_dict(other)
  restored = restore(tmp_path / "checkpoint", {"state": written["state"]})
  other = restorer.restore(other, {**written, **restored})
  # Two more steps in each: the same numbers.
  for _ in range(2):
    handle = saver_step(handle, jax.grad(loss)(saver.params(handle)), {})
    other = restorer_step(other, jax.grad(loss)(restorer.params(other)), {})
  assert_trees_equal(restorer.params(other), saver.params(handle))


def test_sharded_restore_from_8_devices_onto_4(tmp_path, cpu_devices):
  opt_def = optcore.adafactor(0.05, min_dim_size_to_factor=8)
  mesh8 = Mesh(np.array(cpu_devices), ("x",))
  opt = opt_def.create_sharded(make_params(), AXES, mesh8, RULES)
  step = jax.jit(lambda o: o.apply_gradient(jax.tree.map(jnp.ones_like, o.target)))
  opt = step(step(opt))
  save(tmp_path / "ckpt", opt.state_dict())

  mesh4 = Mesh(np.array(cpu_devices[:4]), ("x",))
  abstract = jax.eval_shape(opt_def.create, make_params())
  shardings = opt_def.derive_shardings(abstract, AXES, mesh4, RULES)
  like = opt_def.create(make_params()).state_dict()
  restored_sd = restore(tmp_path / "ckpt", like, shardings.state_dict())
  on4 = opt_def.create_sharded(make_params(), AXES, mesh4, RULES).restore_state(restored_sd)
  assert_trees_equal(on4, opt)
  v_col = on4.state.param_states[0].v_col["dense"]["kernel"]
  assert len(v_col.sharding.device_set) == 4
  assert {s.data.shape for s in v_col.addressable_shards} == {(32 // 4,)}


def test_a_killed_save_never_corrupts_the_last_good_checkpoint(tmp_path):
  directory = tmp_path / "managed"
  env = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(HERE.parent / "support"), os.environ.get("PYTHONPATH", "")]),
  }
  proc = subprocess.Popen(
    [sys.executable, str(HERE / "checkpoint_worker.py"), str(directory)],
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    env=env,
  )
  try:
    lines = []
    while not lines or not (lines[-1].startswith("saving 2") or not lines[-1]):
      lines.append(proc.stdout.readline())
    assert any(line.startswith("saved 1") for line in lines), lines
    # Kill the moment step 2's temporary directory exists: mid-write, before its commit.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      names = os.listdir(directory)
      if any(n.startswith("2.") for n in names) or "2" in names:
        break
      time.sleep(0.002)
    proc.kill()
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait(timeout=30)
    proc.stdout.close()
  assert any(n.startswith("2.") for n in os.listdir(directory)), "the save finished before the kill"
  with ocp.CheckpointManager(directory) as manager:
    assert manager.all_steps() == [1]  # the half-written step 2 is not a checkpoint
    expected = optcore.adam(0.1).create({"w": jnp.arange(8, dtype=jnp.float32)})
    expected = expected.apply_gradient({"w": jnp.ones(8)})
    like = jax.tree.map(ocp.utils.to_shape_dtype_struct, expected.state_dict())
    restored = manager.restore(1, args=ocp.args.StandardRestore(like))
  assert_trees_equal(expected.restore_state(restored), expected)


def test_zero1_state_restores_replicated_and_onto_another_mesh(tmp_path, cpu_devices):
  opt_def = optcore.adam(0.05)
  step = jax.jit(lambda o: o.apply_gradient(jax.tree.map(jnp.ones_like, o.target)))
  mesh8 = Mesh(np.array(cpu_devices), ("data",))
  split = step(step(opt_def.create_sharded(make_params(), mesh=mesh8, state_axis="data")))
  save(tmp_path / "split", split.state_dict())
  like = opt_def.create(make_params()).state_dict()

  # Saved split over 8 devices, restored replicated on one.
  replicated = opt_def.create(make_params()).restore_state(restore(tmp_path / "split", like))
  assert_trees_equal(replicated, split)

  # Saved replicated, restored split over 4 devices.
  save(tmp_path / "replicated", replicated.state_dict())
  mesh4 = Mesh(np.array(cpu_devices[:4]), ("data",))
  abstract = jax.eval_shape(opt_def.create, make_params())
  shardings = opt_def.derive_shardings(abstract, mesh=mesh4, state_axis="data")
  restored_sd = restore(tmp_path / "replicated", like, shardings.state_dict())
  on4 = opt_def.create_sharded(make_params(), mesh=mesh4, state_axis="data")
  on4 = on4.restore_state(restored_sd)
  assert_trees_equal(on4, split)
  mu = on4.state.param_states[0].mu["dense"]["kernel"]  # (16, 32): split on the 32
  assert {s.data.shape for s in mu.addressable_shards} == {(16, 32 // 4)}
  assert on4.target["dense"]["kernel"].sharding.is_fully_replicated


def test_a_restore_into_a_zero1_host_memory_optimizer_keeps_its_layout(cpu_devices):
  """A state dict read back as NumPy arrays (orbax without shardings, msgpack) restored into an
  optimizer that create_sharded placed: every leaf keeps that optimizer's sharding and memory
  kind, as a transplant does (the restored state was left on one device, in device memory)."""
  mesh = Mesh(np.array(cpu_devices), ("data",))
  params = make_params()
  opt_def = optcore.ema(optcore.adam(1e-2), 0.9)
  placed = opt_def.create_sharded(
    params, mesh=mesh, state_axis="data", state_memory_kind="pinned_host"
  )
  saved = jax.tree.map(np.asarray, placed.apply_gradient(make_params(1)).state_dict())
  restored = placed.restore_state(saved)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(placed), strict=True):
    assert got.sharding == want.sharding, (got.sharding, want.sharding)
  assert {x.sharding.memory_kind for x in jax.tree.leaves(restored.state) if x.ndim} == {
    "pinned_host"
  }
  assert_trees_equal(restored.state_dict(), saved)
