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
"""

from __future__ import annotations

import pytest
from composition import CALLS, CASES, build, grads, order_id, params
from faces import FACES
from tree_testing import assert_trees_equal


def case_id(case) -> str:
  return order_id(*case)


def train(face, opt_def, calls=CALLS, handle=None):
  handle = face.create(opt_def, params()) if handle is None else handle
  step = face.jit(face.step)
  for i in range(calls):
    handle = step(handle, grads(i), {})
  return handle


@pytest.fixture(scope="module")
def core_runs():
  """The core face's run of each case, computed once for every face's comparison."""
  return {case: train(FACES[0], build(*case)) for case in CASES}


@pytest.mark.parametrize("face", FACES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_composition_gives_the_core_numbers_and_resumes_in_every_face(case, face, core_runs):
  opt_def = build(*case)
  handle = train(face, opt_def)
  core = core_runs[case]
  assert_trees_equal(face.params(handle), core.target)
  assert_trees_equal(face.state_dict(handle)["state"], core.state_dict()["state"])
  if face.ema_params is not None and "ema" in case[0]:
    assert_trees_equal(face.ema_params(handle), core.ema_params)
  # A fresh handle restored from the state dict continues as the uninterrupted run.
  fresh = face.restore(face.create(opt_def, face.params(handle)), face.state_dict(handle))
  step = face.jit(face.step)
  assert_trees_equal(
    face.params(step(fresh, grads(CALLS), {})), face.params(step(handle, grads(CALLS), {}))
  )


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_composition_round_trips_through_orbax(case, core_runs, tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint", reason="the all variant installs orbax")
  core = core_runs[case]
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "ckpt", core.state_dict())
  checkpointer.wait_until_finished()
  fresh = build(*case).create(params())
  restored = fresh.restore_state(checkpointer.restore(tmp_path / "ckpt", fresh.state_dict()))
  assert_trees_equal(restored.state_dict(), core.state_dict())
