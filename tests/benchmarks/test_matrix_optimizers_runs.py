"""benchmarks/matrix_optimizers.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

import math

import pytest
from benchmark_scripts import benchmark_script

matrix_optimizers = benchmark_script("matrix_optimizers")


def test_bytes_time_and_loss_are_measured_for_adamw_muon_soap_and_shampoo():
  size = matrix_optimizers.SIZES["quick"]
  bpp = matrix_optimizers.state_bytes_per_parameter(size)
  assert bpp["adamw"] == pytest.approx(8.0, abs=0.01)  # mu, nu and a count
  assert bpp["soap"] > bpp["adamw"]  # plus a factor and a basis per preconditioned dimension
  assert bpp["shampoo"] > bpp["adamw"]  # plus a statistic and a root per block and dimension
  times = matrix_optimizers.step_time(size, rounds=2, steps=2)
  for name in ("soap", "shampoo", "control"):
    ratio, low, high = times[name]
    assert math.isfinite(ratio) and low <= ratio <= high
  assert times["adamw_ms"] > 0
  loss = matrix_optimizers.train(12, size)
  assert set(loss["runs"]) == set(matrix_optimizers.OPTIMIZERS)
  for run in loss["runs"].values():
    assert len(run["curve"]) == 12 and all(map(math.isfinite, run["curve"]))
    assert run["curve"][-1] < run["curve"][0]  # every optimizer trains
  assert 0 < loss["entropy"] < math.log(size["model"]["vocab"])
  result = {"size": size, "params": 1000, "bytes_per_parameter": bpp, "step_time": times,
            "timed_steps": 2, "loss": loss}  # fmt: skip
  text = matrix_optimizers.report(result, "test machine")
  assert "| SOAP |" in text and "| Shampoo |" in text and "not timed in this run" in text
