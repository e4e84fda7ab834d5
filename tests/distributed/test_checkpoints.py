"""Portable checkpoints with the real orbax-checkpoint: saved from one face,
restored into another, resharded from 8 devices to 4, and never corrupted by a
killed save."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from sharding_setup import AXES, RULES, make_params
from tree_testing import assert_trees_equal

import optcore

ocp = pytest.importorskip(
  "orbax.checkpoint", reason="needs orbax-checkpoint (the nox variant all installs it)"
)
eqx = pytest.importorskip(
  "equinox", reason="needs optcore-equinox (the nox variant all installs it)"
)
to = pytest.importorskip("treeo", reason="needs optcore-treex (the nox variant all installs it)")
import optcore_equinox  # noqa: E402
import optcore_treex  # noqa: E402

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


class EqxLinear(eqx.Module):
  kernel: jax.Array
  bias: jax.Array


class TreeoLinear(to.Tree):
  kernel: jax.Array = to.field(node=True)
  bias: jax.Array = to.field(node=True)

  def __init__(self, kernel, bias):
    self.kernel, self.bias = kernel, bias


def loss(p):
  return jnp.sum(jnp.tanh(p.kernel) ** 2) + jnp.sum(p.bias**3)


def test_saved_from_equinox_restored_into_treex_and_the_core(tmp_path):
  rng = np.random.default_rng(0)
  kernel = jnp.asarray(rng.normal(size=(4, 3)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(3,)), jnp.float32)
  config = optcore.config.from_config({"name": "adamw", "learning_rate": 1e-2, "weight_decay": 0.1})

  model = EqxLinear(kernel, bias)
  opt = optcore_equinox.Optimizer(config, model)
  step = eqx.filter_jit(lambda m, o: o.update(eqx.filter_grad(loss)(m), m))
  for _ in range(3):
    model, opt = step(model, opt)
  save(tmp_path / "from_equinox", opt.state_dict())

  # Into treex, then two more steps there and in equinox: the same numbers.
  params = TreeoLinear(model.kernel, model.bias)
  treex_opt = optcore_treex.Optimizer(config).init(params)
  treex_opt = treex_opt.restore_state(restore(tmp_path / "from_equinox", treex_opt.state_dict()))

  @jax.jit  # jit against jit: eager and jitted steps may differ by an ulp
  def treex_step(params, treex_opt):
    return treex_opt.update(jax.grad(loss)(params), params), treex_opt

  for _ in range(2):
    params, treex_opt = treex_step(params, treex_opt)
    model, opt = step(model, opt)
  assert_trees_equal((params.kernel, params.bias), (model.kernel, model.bias))

  # Into the core, over a plain dict of the same names.
  core = config.create({"kernel": kernel, "bias": bias})
  core_sd = core.state_dict()
  restored = restore(tmp_path / "from_equinox", {"state": core_sd["state"]})
  core = core.restore_state({"target": core_sd["target"], **restored})
  assert int(core.state.step) == 3


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
