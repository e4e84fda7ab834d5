"""optcore.grouped across the faces of `faces.FACES`: the faces that hold their
optimizer's parameters (core, Flax) run a grouped definition with the numbers
of the ungrouped one; the faces that own their parameters (Equinox, Treex, the
adapter API) refuse it and say why; a state saved grouped restores into every
face, and every face's state restores grouped."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from faces import FACES
from tree_testing import assert_trees_within_ulps

import optcore

HOLDS_ITS_PARAMETERS = {"core", "flax"}


def params():
  return {
    "kernel": jnp.arange(6.0).reshape(2, 3) / 6,
    "bias": jnp.array([0.1, -0.2, 0.3]),
    "scale": jnp.ones(4),
  }


def grads(scale=1.0):
  return {
    "kernel": jnp.full((2, 3), 0.5 * scale),
    "bias": jnp.array([1.0, -1.0, 0.5]) * scale,
    "scale": jnp.linspace(-1.0, 1.0, 4) * scale,
  }


def definition():
  # No division: grouped is the plain definition to one rounding a step (where XLA fused p - lr*u).
  return optcore.lion(0.1, weight_decay=0.01)


def grouped():
  return optcore.grouped(definition(), max_leaf_size=5)  # the kernel (6) stays per leaf


@pytest.mark.parametrize("face", FACES, ids=str)
def test_a_face_runs_a_grouped_definition_or_refuses_it(face):
  if face.name not in HOLDS_ITS_PARAMETERS:
    with pytest.raises(TypeError, match="owns its parameters"):
      face.create(grouped(), params())
    return
  handle, plain = face.create(grouped(), params()), face.create(definition(), params())
  for i in range(3):
    handle = face.jit(face.step)(handle, grads(1.0 + i), {"learning_rate": 0.05 * (i + 1)})
    plain = face.jit(face.step)(plain, grads(1.0 + i), {"learning_rate": 0.05 * (i + 1)})
  assert_trees_within_ulps(face.params(handle), face.params(plain), ulps=3)
  assert_trees_within_ulps(face.state_dict(handle), face.state_dict(plain), ulps=3)


@pytest.mark.parametrize("face", FACES, ids=str)
def test_a_grouped_state_restores_into_every_face_and_back(face):
  opt = optcore.grouped(definition(), max_leaf_size=5).create(params())
  for i in range(3):
    opt = opt.apply_gradient(grads(1.0 + i))
  written = opt.state_dict()
  fresh = face.create(definition(), opt.target)
  restored = face.restore(fresh, {**face.state_dict(fresh), "state": written["state"]})
  assert_trees_within_ulps(
    face.params(face.step(restored, grads(2.0), {})), opt.apply_gradient(grads(2.0)).target, 1
  )
  # ... and the face's own state, saved after its steps, restores grouped.
  saved = face.create(definition(), params())
  for i in range(2):
    saved = face.step(saved, grads(1.0 + i), {})
  back = optcore.grouped(definition(), max_leaf_size=5).create(face.params(saved))
  back = back.restore_state(
    {"target": face.params(saved), "state": face.state_dict(saved)["state"]}
  )
  assert isinstance(back.packed_target, optcore.GroupedParams)
  assert_trees_within_ulps(
    back.apply_gradient(grads(3.0)).target["bias"],
    face.params(face.step(saved, grads(3.0), {}))["bias"],
    1,
  )
