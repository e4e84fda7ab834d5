"""The wrappers composed, in every face: each wrapper alone and the ordered pairs of
`composition.CASES` (with ``OPTCORE_FULL_MATRIX=1``, on the newest Python: every pair around one
algorithm, the pairs that change the state's numbers around a `MultiOptimizer` too), generated
from the tables below, so a new wrapper or face joins by one line.

Each case trains bfloat16 parameters for five calls (the last in the middle of an
accumulation window) in each face of `faces.FACES` and holds it bitwise to the core face (the
core face is held to a loop written by hand in `tests/core/test_wrapper_orders.py`); then the
face's state dict restores into a fresh handle of the same face, which continues bitwise as
the uninterrupted run does; and in the core face the state dict goes through a real orbax
checkpoint and back.

The faces are split over this file and `test_composition_matrix_faces.py`: pytest-xdist runs a
file on one worker (``--dist loadfile``), and the whole matrix in one file (98 cases in six
faces and orbax, about 690 tests) kept one worker busy for most of the cross-face variant while
the other ran everything else.
"""

from __future__ import annotations

import pytest
from composition import CASES, FACES_IN_FIRST_FILE, build, case_id, check_face, params_for
from faces import FACES
from tree_testing import assert_trees_equal

#: this file's faces; the others are test_composition_matrix_faces.py's
HERE = FACES[:FACES_IN_FIRST_FILE]


@pytest.mark.parametrize("face", HERE, ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_composition_gives_the_core_numbers_and_resumes_in_every_face(case, face, core_runs):
  check_face(case, face, core_runs[case])


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_composition_round_trips_through_orbax(case, core_runs, tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint", reason="the all variant installs orbax")
  core = core_runs[case]
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "ckpt", core.state_dict())
  checkpointer.wait_until_finished()
  fresh = build(*case).create(params_for(build(*case)))
  restored = fresh.restore_state(checkpointer.restore(tmp_path / "ckpt", fresh.state_dict()))
  assert_trees_equal(restored.state_dict(), core.state_dict())
