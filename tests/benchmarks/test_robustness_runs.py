"""benchmarks/robustness.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

import math

import pytest

robustness = pytest.importorskip(
  "robustness", reason="runs in the 'all' venv, beside the other benchmarks"
)


def test_statistics_and_skip_are_timed_against_the_bare_step_beside_a_control():
  row = robustness.bench(total=2_000, leaves=12, rounds=2, steps=2)
  assert row["leaves"] == 12
  for key in ("statistics", "skip", "control", "bare_ms"):
    assert math.isfinite(row[key]) and row[key] > 0, key
  for key in ("statistics", "skip", "control"):
    low, high = row[f"{key}_quartiles"]
    assert low <= row[key] <= high
