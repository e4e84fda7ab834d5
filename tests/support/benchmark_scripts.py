"""A benchmark script as its smoke test imports it: from benchmarks/ (tests/benchmarks/conftest.py
puts it on the path), in the 'all' venv where its frameworks are; elsewhere the test skips."""

from __future__ import annotations

import math
from types import ModuleType

import pytest


def benchmark_script(name: str) -> ModuleType:
  return pytest.importorskip(name, reason="runs in the 'all' venv, beside the other benchmarks")


def assert_timed(row: dict, measured: tuple[str, ...], within_quartiles: tuple[str, ...]) -> None:
  """Each ``measured`` entry of a benchmark's row is a finite positive number (a ratio, a time),
  and each of ``within_quartiles`` lies between its own ``<key>_quartiles``."""
  for key in measured:
    assert math.isfinite(row[key]) and row[key] > 0, key
  for key in within_quartiles:
    low, high = row[f"{key}_quartiles"]
    assert low <= row[key] <= high, key
