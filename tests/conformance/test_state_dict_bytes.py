"""Every face writes byte-identical state dicts to those written before the
adapter API was introduced (fingerprints recorded then, with the code of
commit aa0ec01, by `tests/support/state_dict_bytes.py`)."""

import json
from pathlib import Path

import pytest
import state_dict_bytes
from faces import FACES, FACES_BY_NAME

RECORDED = json.loads((Path(__file__).parent / "data" / "state_dict_fingerprints.json").read_text())


@pytest.mark.parametrize("face", FACES, ids=str)
def test_state_dicts_are_byte_identical_to_the_recorded_ones(face):
  if face.name in RECORDED:
    assert state_dict_bytes.face_fingerprints(face) == RECORDED[face.name]
  else:
    # A face added since the recording writes the portable layout: its 'state' entry is
    # byte for byte the core's (whose own bytes are checked against the record above).
    assert state_dict_bytes.face_fingerprints(face, "state") == (
      state_dict_bytes.face_fingerprints(FACES_BY_NAME["core"], "state")
    )


def test_the_fingerprint_sees_a_one_bit_change_and_a_renamed_key():
  opt = state_dict_bytes.definitions()["adam"]().create(state_dict_bytes.params())
  state_dict = opt.replace(state=state_dict_bytes.fill(opt.state)).state_dict()
  base = state_dict_bytes.fingerprint(state_dict)
  mu = state_dict["state"]["param_states"]["0"]["mu"]["scale"]
  flipped = mu.view("int32") ^ 1
  state_dict["state"]["param_states"]["0"]["mu"]["scale"] = flipped.view("float32")
  assert state_dict_bytes.fingerprint(state_dict) != base
  state_dict["state"]["param_states"]["0"]["mu"]["scale"] = mu
  assert state_dict_bytes.fingerprint(state_dict) == base
  state_dict["state"]["param_states"]["0"]["mu"]["gain"] = state_dict["state"]["param_states"]["0"][
    "mu"
  ].pop("scale")
  assert state_dict_bytes.fingerprint(state_dict) != base
