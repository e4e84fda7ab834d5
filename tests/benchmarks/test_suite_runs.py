"""benchmarks/suite.py runs every face at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

import math

import pytest

suite = pytest.importorskip("suite", reason="the suite needs every adapter (the 'all' venv)")


def finite_ratio(r) -> bool:
  median, q1, q3 = r
  return all(math.isfinite(x) and x > 0 for x in r) and q1 <= median <= q3


def test_every_face_is_timed_against_its_raw_equivalent():
  row = suite.bench_jitted("multi", 3000, 10, rounds=3, steps=2)
  for face in ("control", "core", "flax", "equinox", "treex"):
    assert finite_ratio(row[face]), (face, row[face])
    # both compile orders ran; their spread is reported as the order effect
    assert all(math.isfinite(x) and x > 0 for x in row["order_effect"][face])
  # the same compiled work: XLA's bytes accessed differ by the step counter only
  assert row["bytes_accessed_ratio"] == pytest.approx(1.0, abs=1e-3)
  assert row["peak_memory_ratio"] == pytest.approx(1.0, abs=1e-3)


def test_eager_compile_and_flattened_measurements_run():
  assert finite_ratio(suite.bench_eager("adam", 3000, 10, rounds=3)["core"])
  assert finite_ratio(suite.bench_compile("adam", 20, rounds=2)["core"])
  flat = suite.bench_flattened(3000, 10, rounds=3, steps=2)
  assert finite_ratio(flat["flattened"]) and flat["core_ms"] > 0
