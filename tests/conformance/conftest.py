"""Fixtures the conformance files share."""

from __future__ import annotations

import pytest
from composition import CASES, build, train
from faces import FACES


@pytest.fixture(scope="module")
def core_runs():
  """The core face's run of each composition case (`composition.CASES`), computed once per file
  for every face's comparison (test_composition_matrix.py and its _faces.py)."""
  return {case: train(FACES[0], build(*case)) for case in CASES}
