"""benchmarks/nnx_step.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

from benchmark_scripts import assert_timed, benchmark_script

nnx_step = benchmark_script("nnx_step")


def test_the_face_is_timed_against_flaxs_optimizer_and_raw_optax_beside_a_control():
  row = nnx_step.bench(width=8, depth=3, rounds=2, steps=2)
  assert row["leaves"] == 6
  measured = ("ratio", "control_ratio", "flax_over_raw", "functional_over_raw", "flax_ms")
  assert_timed(row, measured, within_quartiles=("ratio",))
