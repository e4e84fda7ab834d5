"""optcore.eval_params in every face of `faces.FACES`: each face's own accessor gives what
optax.contrib.schedule_free_eval_params gives beside a raw optax loop, bitwise, also under a
wrapper and in one MultiOptimizer group, and after a restore in another face (issue 40)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from face_data import grads, params, run_steps
from faces import FACES
from tree_testing import assert_trees_equal

import optcore


def by_hand(steps, tx=None):
  """Raw optax, jitted: ``(params, optax's evaluation params)`` after ``steps``."""
  tx = tx or optax.contrib.schedule_free_adamw(0.05, warmup_steps=2)
  p, s = params(), tx.init(params())

  @jax.jit
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  for i in range(steps):
    p, s = step(p, s, grads(i))
  return p, optax.contrib.schedule_free_eval_params(s, p)


def run(face, opt_def, steps):
  return run_steps(face, face.create(opt_def, params()), range(steps))


@pytest.mark.parametrize("face", FACES, ids=str)
def test_every_face_reads_optaxs_evaluation_point(face):
  handle = run(face, optcore.contrib.schedule_free_adamw(0.05, warmup_steps=2), 4)
  want_params, want_eval = by_hand(4)
  assert_trees_equal(face.params(handle), want_params)
  got = dict(face.eval_params(handle))
  assert_trees_equal(got, want_eval)
  assert not jax.tree.all(jax.tree.map(jnp.array_equal, got, want_params))  # not y itself


@pytest.mark.parametrize("face", FACES, ids=str)
def test_under_ema_and_in_one_group_the_others_come_back_as_they_are(face):
  wrapped = run(face, optcore.ema(optcore.contrib.schedule_free_adamw(0.05, warmup_steps=2)), 3)
  assert_trees_equal(dict(face.eval_params(wrapped)), by_hand(3)[1])
  multi = optcore.MultiOptimizer(
    (r"kernel", optcore.contrib.schedule_free_sgd(0.1, b1=0.5)), (r"bias", optcore.sgd(0.1))
  )
  handle = run(face, multi, 3)
  got, trained = dict(face.eval_params(handle)), face.params(handle)
  assert_trees_equal(got["bias"], trained["bias"])
  kernel_only = {"kernel": params()["kernel"]}
  tx = optax.contrib.schedule_free_sgd(0.1, b1=0.5)
  s = tx.init(kernel_only)
  p = kernel_only
  for i in range(3):
    u, s = jax.jit(tx.update)({"kernel": grads(i)["kernel"]}, s, p)
    p = optax.apply_updates(p, u)
  want = optax.contrib.schedule_free_eval_params(s, p)["kernel"]
  assert_trees_equal(got["kernel"], want)


@pytest.mark.parametrize("saver", FACES, ids=str)
def test_a_schedule_free_state_saved_by_one_face_reads_alike_in_every_face(saver):
  opt_def = optcore.contrib.schedule_free_adamw(0.05, warmup_steps=2)
  saved = saver.state_dict(run(saver, opt_def, 3))["state"]
  want_params, want_eval = by_hand(3)
  for restorer in FACES:
    fresh = restorer.create(opt_def, want_params)
    restored = restorer.restore(fresh, {**restorer.state_dict(fresh), "state": saved})
    assert_trees_equal(dict(restorer.eval_params(restored)), want_eval)


def test_a_definition_without_schedule_free_state_is_refused_with_what_to_use():
  opt = optcore.adam(0.1).create(params())
  with pytest.raises(TypeError, match=r"keeps no schedule-free state.*optcore\.ema_params"):
    optcore.eval_params(opt)
  with pytest.raises(TypeError, match="keeps no schedule-free state"):
    _ = opt.eval_params


def test_a_bare_state_needs_its_parameters_and_host_memory_is_read_on_the_device():
  opt_def = optcore.contrib.schedule_free_adamw(0.05, warmup_steps=2)
  tx = opt_def.as_optax()
  state = tx.init(params())
  with pytest.raises(TypeError, match=r"pass them: optcore\.eval_params\(opt, params\)"):
    optcore.eval_params(state, optimizer_def=opt_def)
  got = optcore.eval_params(state, params(), optimizer_def=opt_def)
  assert_trees_equal(got, optax.contrib.schedule_free_eval_params(state, params()))
  mesh = jax.sharding.Mesh(jax.devices()[:1], ("data",))
  opt = opt_def.create_sharded(params(), mesh=mesh, state_memory_kind="pinned_host")
  for i in range(2):
    opt = jax.jit(lambda o, g: o.apply_gradient(g))(opt, grads(i))
  evaluation = optcore.eval_params(opt)
  assert {x.sharding.memory_kind for x in jax.tree.leaves(evaluation)} == {"device"}
  assert_trees_equal(evaluation, by_hand(2)[1])
