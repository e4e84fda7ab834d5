"""optcore.statistics in every face of `faces.FACES`: the same names and the same values as the
core face's, bitwise, after the same steps; and after a restore in another face (issue 40)."""

from __future__ import annotations

import pytest
from face_data import params, run_steps
from faces import FACES
from tree_testing import assert_trees_equal

import optcore

OPT_DEF = optcore.with_statistics(optcore.adam(0.05), {"weights": "kernel", "biases": "bias"})


@pytest.fixture(scope="module")
def core():
  return run_steps(FACES[0], FACES[0].create(OPT_DEF, params()), range(3))


@pytest.mark.parametrize("face", FACES, ids=str)
def test_every_face_gives_the_core_faces_statistics(face, core):
  handle = run_steps(face, face.create(OPT_DEF, params()), range(3))
  got, want = face.statistics(handle), optcore.statistics(core)
  assert sorted(got) == sorted(want) and "weights/update_ratio" in got
  assert_trees_equal(got, want)


@pytest.mark.parametrize("face", FACES, ids=str)
def test_statistics_restored_from_the_core_face_read_alike(face, core):
  fresh = face.create(OPT_DEF, core.target)
  restored = face.restore(fresh, {**face.state_dict(fresh), "state": core.state_dict()["state"]})
  assert_trees_equal(face.statistics(restored), optcore.statistics(core))
