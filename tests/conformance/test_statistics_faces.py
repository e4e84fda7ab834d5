"""optcore.statistics in every face of `faces.FACES`: the same names and the same values as the
core face's, bitwise, after the same steps; and after a restore in another face (issue 40)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from faces import FACES
from tree_testing import assert_trees_equal

import optcore


def params():
  return {"kernel": jnp.arange(6.0).reshape(2, 3) / 6, "bias": jnp.array([0.1, -0.2, 0.3])}


def grads(i):
  key = jax.random.key(i)
  return {
    "kernel": jax.random.normal(key, (2, 3)),
    "bias": jax.random.normal(jax.random.fold_in(key, 1), (3,)),
  }


OPT_DEF = optcore.with_statistics(optcore.adam(0.05), {"weights": "kernel", "biases": "bias"})


def run(face, handle, steps):
  jitted = face.jit(face.step)
  for i in steps:
    handle = jitted(handle, grads(i), {})
  return handle


@pytest.fixture(scope="module")
def core():
  return run(FACES[0], FACES[0].create(OPT_DEF, params()), range(3))


@pytest.mark.parametrize("face", FACES, ids=str)
def test_every_face_gives_the_core_faces_statistics(face, core):
  handle = run(face, face.create(OPT_DEF, params()), range(3))
  got, want = face.statistics(handle), optcore.statistics(core)
  assert sorted(got) == sorted(want) and "weights/update_ratio" in got
  assert_trees_equal(got, want)


@pytest.mark.parametrize("face", FACES, ids=str)
def test_statistics_restored_from_the_core_face_read_alike(face, core):
  fresh = face.create(OPT_DEF, core.target)
  restored = face.restore(fresh, {**face.state_dict(fresh), "state": core.state_dict()["state"]})
  assert_trees_equal(face.statistics(restored), optcore.statistics(core))
