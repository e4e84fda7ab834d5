"""benchmarks/nnx_step.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

import math

import pytest

nnx_step = pytest.importorskip(
  "nnx_step", reason="runs in the 'all' venv, beside the other benchmarks"
)


def test_the_face_is_timed_against_flaxs_optimizer_and_raw_optax_beside_a_control():
  row = nnx_step.bench(width=8, depth=3, rounds=2, steps=2)
  assert row["leaves"] == 6
  for key in ("ratio", "control_ratio", "flax_over_raw", "functional_over_raw", "flax_ms"):
    assert math.isfinite(row[key]) and row[key] > 0, key
  low, high = row["ratio_quartiles"]
  assert low <= row["ratio"] <= high
