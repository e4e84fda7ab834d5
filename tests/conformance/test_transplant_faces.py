"""optcore.transplant in every face of `faces.FACES`: a state dict written by any
face (or an old flax.optim checkpoint) moves into any face's optimizer for a
model with a new head, with the same report everywhere, and the steps after it
are raw optax's from the transplanted state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from faces import FACES
from tree_testing import assert_trees_equal

import optcore
from optcore import legacy


def params():
  return {"kernel": jnp.arange(6.0).reshape(2, 3) / 6, "bias": jnp.array([0.1, -0.2, 0.3])}


def with_head():
  return {**params(), "head": jnp.array([0.5, -0.5])}


def grads(i, tree):
  key = jax.random.key(i)
  return {
    name: jax.random.normal(jax.random.fold_in(key, n), x.shape)
    for n, (name, x) in enumerate(sorted(tree.items()))
  }


def trained(face, opt_def, steps=3):
  handle = face.create(opt_def, params())
  for i in range(steps):
    handle = face.step(handle, grads(i, params()), {})
  return handle


def by_hand(old_adam_state, steps):
  """Raw optax: adamw on the model with a head, from the old adam moments (zeros
  for the head) and a count from zero (it counts for the head's moments too)."""
  tx = optax.adamw(0.05, weight_decay=0.1)
  p = with_head()
  fresh = tx.init(p)[0]
  mu = {**old_adam_state.mu, "head": fresh.mu["head"]}
  nu = {**old_adam_state.nu, "head": fresh.nu["head"]}
  state = (optax.ScaleByAdamState(fresh.count, mu, nu), *tx.init(p)[1:])

  @jax.jit
  def step(p, state, g):
    updates, state = tx.update(g, state, p)
    return optax.apply_updates(p, updates), state

  for i in range(steps):
    p, state = step(p, state, grads(10 + i, p))
  return p


@pytest.mark.parametrize("saver", FACES, ids=str)
def test_a_state_dict_of_any_face_transplants_into_every_face(saver):
  saved = saver.state_dict(trained(saver, optcore.adam(0.05)))
  old = trained(FACES[0], optcore.adam(0.05)).state.param_states[0]
  want = by_hand(old, 2)
  reports = {}
  for face in FACES:
    handle = face.create(optcore.adamw(0.05, weight_decay=0.1), with_head())
    handle, report = face.transplant(handle, saved)
    reports[face.name] = str(report)
    for i in range(2):
      handle = face.jit(face.step)(handle, grads(10 + i, with_head()), {})
    assert_trees_equal(dict(face.params(handle)), want)
  # One report everywhere but for the step line: a face without a step of its own
  # (Treex over optax counts) has none to keep.
  tables = {
    name: [line for line in table.splitlines()[1:] if line.split()[1] != "step"]
    for name, table in reports.items()
  }
  assert len({tuple(lines) for lines in tables.values()}) == 1, reports
  assert "initialised  param_states/0/mu/head" in reports["core"]


def test_an_old_flax_optim_checkpoint_transplants_into_every_face():
  """What flax.optim's Adam wrote (its layout and msgpack round trip): its moments
  become optax's mu and nu, its step adam's count, in every face."""
  flax_serialization = pytest.importorskip("flax.serialization")
  old = legacy.Adam(0.05).create(params())
  for i in range(3):
    old = old.apply_gradient(grads(i, params()))
  written = flax_serialization.msgpack_restore(
    flax_serialization.msgpack_serialize(jax.tree.map(np.asarray, old.state_dict()))
  )
  as_optax = optax.ScaleByAdamState(
    jnp.asarray(3, jnp.int32),
    {k: s.grad_ema for k, s in old.state.param_states.items()},
    {k: s.grad_sq_ema for k, s in old.state.param_states.items()},
  )
  want = by_hand(as_optax, 2)
  for face in FACES:
    handle = face.create(optcore.adamw(0.05, weight_decay=0.1), with_head())
    handle, report = face.transplant(handle, written)
    kept = {e.path: e.source for e in report.kept}
    assert kept["param_states/0/nu/kernel"] == "param_states/kernel/grad_sq_ema"
    # The step is read by the faces that keep one (Treex over optax counts keeps none,
    # and adam's count starts anew with the head's moments).
    assert [e.path for e in report.dropped] == ([] if "step" in kept else ["step"])
    for i in range(2):
      handle = face.jit(face.step)(handle, grads(10 + i, with_head()), {})
    assert_trees_equal(dict(face.params(handle)), want)
