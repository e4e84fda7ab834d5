"""optcore.ema in every face of `faces.FACES`: each face's own accessor returns
the moving average a hand-written loop beside raw optax computes, bitwise, and
an average saved by one face restores into every other."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from face_data import grads, params, run_steps
from faces import FACES
from tree_testing import assert_trees_equal

import optcore


def by_hand(steps, decay=0.9):
  tx = optax.adam(0.05)
  p, s = params(), tx.init(params())
  e = jax.tree.map(jnp.copy, p)

  @jax.jit
  def step(p, s, e, g):
    u, s = tx.update(g, s, p)
    p = optax.apply_updates(p, u)
    return p, s, jax.tree.map(lambda e, p: decay * e + (1 - decay) * p, e, p)

  for i in range(steps):
    p, s, e = step(p, s, e, grads(i))
  return p, e


def run(face, steps):
  handle = face.create(optcore.ema(optcore.adam(0.05), decay=0.9), params())
  return run_steps(face, handle, range(steps))


@pytest.mark.parametrize("face", FACES, ids=str)
def test_every_face_reads_the_hand_written_average(face):
  handle = run(face, 5)
  want_params, want_ema = by_hand(5)
  assert_trees_equal(face.params(handle), want_params)
  assert_trees_equal(dict(face.ema_params(handle)), want_ema)


@pytest.mark.parametrize("saver", FACES, ids=str)
def test_an_average_saved_by_one_face_restores_into_every_face(saver):
  saved = saver.state_dict(run(saver, 3))["state"]
  for restorer in FACES:
    fresh = restorer.create(optcore.ema(optcore.adam(0.05), decay=0.9), params())
    restored = restorer.restore(fresh, {**restorer.state_dict(fresh), "state": saved})
    assert_trees_equal(dict(restorer.ema_params(restored)), by_hand(3)[1])
