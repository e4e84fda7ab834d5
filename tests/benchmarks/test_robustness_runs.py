"""benchmarks/robustness.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

from benchmark_scripts import assert_timed, benchmark_script

robustness = benchmark_script("robustness")


def test_statistics_and_skip_are_timed_against_the_bare_step_beside_a_control():
  row = robustness.bench(total=2_000, leaves=12, rounds=2, steps=2)
  assert row["leaves"] == 12
  timed = ("statistics", "statistics_one_group", "skip", "control")
  assert_timed(row, (*timed, "bare_ms"), within_quartiles=timed)


def test_step_bytes_are_read_for_each_step_donated_and_kept():
  rows = robustness.step_bytes(total=4_000, leaves=6)
  assert {(r["step"], r["donated"]) for r in rows} == {
    (s, d) for s in ("bare", "statistics", "skip", "hand-written skip") for d in (True, False)
  }
  by = {(r["step"], r["donated"]): r["bytes"] for r in rows}
  # adamw reads the parameters, gradients and two moments and writes three: at least 28
  assert all(b >= 28 for b in by.values()), by
  assert by[("skip", True)] >= by[("bare", True)]  # the norm reads the gradients once more
  # the norms read the gradients and the old and new parameters once more
  assert by[("statistics", False)] >= by[("bare", False)] + 12
