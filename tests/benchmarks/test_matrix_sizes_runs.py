"""benchmarks/matrix_sizes.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

import math

import pytest
from benchmark_scripts import benchmark_script

matrix_sizes = benchmark_script("matrix_sizes")


def test_rest_and_refresh_are_timed_for_soap_and_shampoo_beside_a_control():
  row = matrix_sizes.measure(matrix_sizes.QUICK["tiny"], rounds=2, steps=2)
  for key in ("soap/rest", "soap/always", "shampoo/rest", "shampoo/always", "gradient", "control"):
    ratio, low, high = row[key]
    assert math.isfinite(ratio) and low <= ratio <= high, key
  for name in ("soap", "shampoo"):
    rest, refresh = row[f"{name}/rest"][0], row[f"{name}/refresh"]
    assert row[f"{name}/at_frequency"] == pytest.approx(rest + refresh / matrix_sizes.FREQUENCY)
  text = matrix_sizes.report({"tiny": row}, "test machine")
  assert "| tiny |" in text and "| shampoo |" in text
