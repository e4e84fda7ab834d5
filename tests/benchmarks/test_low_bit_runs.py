"""benchmarks/low_bit.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

import math

import pytest
from benchmark_scripts import benchmark_script

low_bit = benchmark_script("low_bit")


def test_bytes_memory_time_and_loss_are_measured_for_every_state():
  result = low_bit.run(total=65_536, rounds=2, steps=2, train_steps=12)
  bpp = result["bytes_per_parameter"]
  assert bpp["float32"] == pytest.approx(8.0, abs=1e-3)  # and the 4-byte step count
  assert bpp["bfloat16"] == pytest.approx(4.0, abs=1e-3)
  assert bpp["8-bit"] <= 2.1 and bpp["4-bit"] <= 1.1
  for name in low_bit.STATES:
    assert result["step_memory"][name]["arguments"] > 0
    assert result["create_memory"][name]["outputs"] > 0
  for name in ("bfloat16", "8-bit", "4-bit", "control"):
    ratio, low, high = result["step_time"][name]
    assert math.isfinite(ratio) and low <= ratio <= high
  assert set(result["losses"]) == set(low_bit.TRAINED)
  assert all(len(c) == 13 and all(map(math.isfinite, c)) for c in result["losses"].values())
  text = low_bit.report(result, "test machine")
  assert "| 8-bit | 2.031 |" in text and "bfloat16 params, stochastic" in text
