"""The composition matrix (`test_composition_matrix.py`, which says what each case checks) in
the faces that file leaves to this one, so that two pytest-xdist workers share the matrix."""

from __future__ import annotations

import pytest
from composition import CASES, FACES_IN_FIRST_FILE, case_id, check_face
from faces import FACES

#: this file's faces; test_composition_matrix.py has the others
HERE = FACES[FACES_IN_FIRST_FILE:]


@pytest.mark.parametrize("face", HERE, ids=str)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_composition_gives_the_core_numbers_and_resumes_in_every_face(case, face, core_runs):
  check_face(case, face, core_runs[case])
