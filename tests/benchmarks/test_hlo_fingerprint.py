"""benchmarks/hlo_fingerprint.py, the check that a refactor leaves a plain optimizer's compiled
step as it was: what it strips is only where the code sits, never what it computes."""

from __future__ import annotations

import hlo_fingerprint

import optcore


def test_the_fingerprint_holds_no_source_location_and_sees_a_change_of_maths():
  text = hlo_fingerprint.stripped_hlo(optcore.adam(1e-3))
  for table in ("FileNames", "StackFrames", "metadata="):
    assert table not in text, table
  assert text.startswith("HloModule step")
  assert hlo_fingerprint.stripped_hlo(optcore.adam(1e-3)) == text  # deterministic
  assert hlo_fingerprint.stripped_hlo(optcore.adam(1e-3, b1=0.5)) != text  # another constant
  assert hlo_fingerprint.stripped_hlo(optcore.adamw(1e-3)) != text  # another computation


def test_every_case_compiles():
  assert set(hlo_fingerprint.cases()) >= {"adam", "legacy.Adam", "t5x.Adafactor", "ema(adam)"}
  for opt_def in hlo_fingerprint.cases().values():
    assert "ENTRY" in hlo_fingerprint.stripped_hlo(opt_def)
