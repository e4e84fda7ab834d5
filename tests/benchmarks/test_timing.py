"""The compile-order balancing in benchmarks/timing.py, on a simulated clock.

The simulation reproduces what XLA's CPU backend does to separately compiled
copies of one program: within a group of fresh runners, the one warmed up
(compiled) first runs at its true cost, each later one ``ORDER_PENALTY`` times
slower per position.
"""

from __future__ import annotations

import math

import pytest
from timing import balanced_ratio, median_ratio, time_interleaved

ORDER_PENALTY = 1.08
TRUE_COST = {"raw": 2.0e-3, "face": 2.06e-3}  # seconds per step: the face is x1.03


class SimulatedMachine:
  def __init__(self) -> None:
    self.now = 0.0
    self.compiled_in_group = 0
    self.builds_since_run = 0

  def clock(self) -> float:
    return self.now

  def build(self, key: str):
    if self.builds_since_run == 0:
      self.compiled_in_group = 0  # a new group of fresh executables starts
    self.builds_since_run += 1
    position: list[int] = []

    def run(steps: int = 10) -> None:
      self.builds_since_run = 0
      if not position:  # the first call compiles
        position.append(self.compiled_in_group)
        self.compiled_in_group += 1
      self.now += steps * TRUE_COST[key] * ORDER_PENALTY ** position[0]

    return run


def test_one_order_is_biased_by_compile_order():
  machine = SimulatedMachine()
  runners = {"raw": machine.build("raw"), "face": machine.build("face")}
  times = time_interleaved(runners, rounds=7, steps=10, clock=machine.clock)
  ratio, _, _ = median_ratio(times, "face")
  assert ratio == pytest.approx(1.03 * ORDER_PENALTY)


def test_balanced_ratio_recovers_the_true_ratio():
  machine = SimulatedMachine()
  result = balanced_ratio(machine.build, "raw", "face", rounds=7, steps=10, clock=machine.clock)
  median, q1, q3 = result["ratio"]
  assert median == pytest.approx(1.03) and q1 == pytest.approx(1.03) and q3 == pytest.approx(1.03)
  assert result["base_first"] == pytest.approx(1.03 * ORDER_PENALTY)
  assert result["face_first"] == pytest.approx(1.03 / ORDER_PENALTY)
  assert len(result["base_times"]) == 14
  # the base's times are pooled over both orders: half at the true cost, half slowed
  assert sorted(result["base_times"])[0] == pytest.approx(TRUE_COST["raw"])
  assert sorted(result["base_times"])[-1] == pytest.approx(TRUE_COST["raw"] * ORDER_PENALTY)


def test_an_a_a_comparison_is_one():
  machine = SimulatedMachine()
  TRUE_COST["raw_copy"] = TRUE_COST["raw"]
  try:
    result = balanced_ratio(machine.build, "raw", "raw_copy", 5, 10, clock=machine.clock)
  finally:
    del TRUE_COST["raw_copy"]
  assert math.isclose(result["ratio"][0], 1.0)
