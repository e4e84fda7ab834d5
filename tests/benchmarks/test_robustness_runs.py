"""benchmarks/robustness.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

from benchmark_scripts import assert_timed, benchmark_script

robustness = benchmark_script("robustness")


def test_statistics_and_skip_are_timed_against_the_bare_step_beside_a_control():
  params = robustness.SHAPES["huge matrices"](20_000)  # 4 leaves: few compiles
  row = robustness.bench(params, rounds=2, steps=2)
  assert row["leaves"] == 4
  timed = ("statistics", "statistics_one_group", "skip", "control")
  assert_timed(row, (*timed, "bare_ms"), within_quartiles=timed)


def test_each_shape_is_made_at_about_its_size():
  for shape, make in robustness.SHAPES.items():
    count = sum(p.size for p in make(400_000).values())
    assert 0.9 * 400_000 <= count <= 1.01 * 400_000, (shape, count)


def test_step_bytes_are_read_for_each_donated_step():
  rows = robustness.step_bytes(robustness.SHAPES["huge matrices"](4_000))
  steps = ["bare", "statistics", "skip", "hand-written skip", "hand-written statistics"]
  assert [r["step"] for r in rows] == steps
  by = {r["step"]: r["bytes"] for r in rows}
  # adamw reads the parameters, gradients and two moments and writes three: at least 28
  assert all(b >= 28 for b in by.values()), by
  assert by["skip"] >= by["bare"]  # the norm reads the gradients once more
  # the sums read the gradients, the parameters and the state once more
  assert by["statistics"] >= by["bare"] + 12
