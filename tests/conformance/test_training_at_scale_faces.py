"""Training at scale in every face of `faces.FACES`: `optcore.accumulate`,
`optcore.mixed_precision` and ``state_memory_kind="pinned_host"``, each
alone and combined, with the numbers of the plain optax equivalents
(optax.MultiSteps; an optax loop on float32 master copies) and of the
on-device step; a state saved mid-accumulation in one face resumes in every
other."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from faces import FACES
from jax.sharding import Mesh
from tree_testing import assert_trees_equal

import optcore


def params(dtype=jnp.float32):
  return {
    "kernel": (jnp.arange(6.0).reshape(2, 3) / 6).astype(dtype),
    "bias": jnp.array([0.1, -0.2, 0.3], dtype),
  }


def grads(i, dtype=jnp.float32):
  key = jax.random.key(i)
  return {
    "kernel": jax.random.normal(key, (2, 3), dtype),
    "bias": jax.random.normal(jax.random.fold_in(key, 1), (3,), dtype),
  }


def optax_loop(tx, start, steps, to_master=None):
  """Raw optax, jitted: the parameters after ``steps`` gradients."""
  master = start if to_master is None else jax.tree.map(to_master, start)
  state = tx.init(master)

  @jax.jit
  def step(p, s, g):
    if to_master is not None:
      g = jax.tree.map(to_master, g)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  for i in range(steps):
    master, state = step(master, state, grads(i, jax.tree.leaves(start)[0].dtype))
  return master


def run(face, opt_def, start, steps, dtype=jnp.float32):
  handle = face.create(opt_def, start)
  jitted = face.jit(face.step)
  for i in range(steps):
    handle = jitted(handle, grads(i, dtype), {})
  return handle


@pytest.mark.parametrize("face", FACES, ids=str)
def test_accumulate_gives_multisteps_numbers_in_every_face(face):
  handle = run(face, optcore.accumulate(optcore.adam(0.1), every=3), params(), 7)
  want = optax_loop(optax.MultiSteps(optax.adam(0.1), every_k_schedule=3), params(), 7)
  assert_trees_equal(face.params(handle), want)
  written = face.state_dict(handle)["state"]
  assert int(written["step"]) == 2 and int(written["param_states"]["mini_step"]) == 1


@pytest.mark.parametrize("face", FACES, ids=str)
def test_master_weights_give_the_float32_optax_loop_in_every_face(face):
  opt_def = optcore.mixed_precision(
    optcore.adam(0.01), state_dtype=jnp.bfloat16, master_dtype=jnp.float32
  )
  handle = run(face, opt_def, params(jnp.bfloat16), 4, jnp.bfloat16)
  core = run(FACES[0], opt_def, params(jnp.bfloat16), 4, jnp.bfloat16)
  assert_trees_equal(face.params(handle), core.target)  # FACES[0] is the core's
  assert {x.dtype for x in jax.tree.leaves(face.params(handle))} == {jnp.dtype(jnp.bfloat16)}
  master = face.state_dict(handle)["state"]["param_states"]["master"]
  # Without bfloat16 state the master copies are an optax loop on float32 copies.
  plain = optcore.mixed_precision(optcore.adam(0.01), master_dtype=jnp.float32)
  plain_master = face.state_dict(run(face, plain, params(jnp.bfloat16), 4, jnp.bfloat16))
  want = optax_loop(optax.adam(0.01), params(jnp.bfloat16), 4, lambda x: x.astype(jnp.float32))
  assert_trees_equal(dict(plain_master["state"]["param_states"]["master"]), want)
  assert {np.asarray(x).dtype for x in jax.tree.leaves(master)} == {np.dtype(np.float32)}


@pytest.mark.parametrize("saver", FACES, ids=str)
def test_a_state_saved_mid_accumulation_resumes_in_every_face(saver):
  opt_def = optcore.accumulate(
    optcore.mixed_precision(optcore.adam(0.05), state_dtype=jnp.bfloat16), every=2
  )
  saved = saver.state_dict(run(saver, opt_def, params(), 3))  # one update, one gradient held
  for restorer in FACES:
    # The parameters after the three steps, in the restorer's own handle (the
    # Equinox and Treex faces do not read a 'target'), and the saver's state.
    straight = run(restorer, opt_def, params(), 3)
    base = restorer.create(opt_def, restorer.params(straight))
    resumed = restorer.restore(base, {**restorer.state_dict(base), "state": saved["state"]})
    for i in (3, 4):
      straight = restorer.jit(restorer.step)(straight, grads(i), {})
      resumed = restorer.jit(restorer.step)(resumed, grads(i), {})
    assert_trees_equal(restorer.params(resumed), restorer.params(straight))


def one_device_mesh():
  return Mesh(np.array(jax.devices()[:1]), ("data",))


def state_leaves(face, handle):
  return [x for x in jax.tree.leaves(face.state_dict(handle)["state"]) if np.ndim(x)]


@pytest.mark.parametrize("face", FACES, ids=str)
def test_pinned_host_state_in_every_face_with_every_wrapper(face):
  opt_def = optcore.accumulate(
    optcore.mixed_precision(optcore.adam(0.05), state_dtype=jnp.bfloat16, master_dtype=jnp.float32),
    every=2,
  )
  start = params(jnp.bfloat16)
  host = face.create_sharded(
    opt_def, start, one_device_mesh(), state_axis="data", state_memory_kind="pinned_host"
  )
  device = face.create_sharded(opt_def, start, one_device_mesh(), state_axis="data")
  assert {x.sharding.memory_kind for x in state_leaves(face, host)} == {"pinned_host"}
  step = face.jit(face.step)
  for i in range(3):
    host = step(host, grads(i, jnp.bfloat16), {"learning_rate": 0.02})
    device = step(device, grads(i, jnp.bfloat16), {"learning_rate": 0.02})
    assert {x.sharding.memory_kind for x in state_leaves(face, host)} == {"pinned_host"}
    assert {x.sharding.memory_kind for x in jax.tree.leaves(face.params(host))} == {"device"}
  assert_trees_equal(face.params(host), face.params(device))
  assert_trees_equal(face.state_dict(host)["state"], face.state_dict(device)["state"])
