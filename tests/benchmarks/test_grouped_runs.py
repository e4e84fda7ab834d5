"""benchmarks/grouped.py measures at a tiny size (a smoke run of `nox -s bench`), and its
grouped and raw steps compute the same parameters."""

from __future__ import annotations

import math

import jax
import numpy as np
from benchmark_scripts import benchmark_script

grouped = benchmark_script("grouped")


def test_every_variant_is_timed_against_raw_optax():
  variants = ["grouped", "grouped_update", "grouped_packed_grad", "split_back"]
  row = grouped.bench("mlp", variants, rounds=2, steps=1, max_leaf_size=65536, depth=3, width=8)
  assert row["leaves"] == row["grouped_leaves"] == 6
  for key in [*variants, "control", "compile"]:
    median, q1, q3 = row[key]
    assert all(math.isfinite(x) and x > 0 for x in (median, q1, q3)) and q1 <= median <= q3
  # One update kernel or a few for the whole buffer, against some per leaf.
  assert row["fusions"]["grouped_update"] < row["fusions"]["raw_update"]


def test_the_grouped_steps_compute_what_raw_optax_computes():
  params, loss, batch = grouped.mlp(depth=4, width=8, batch_size=2)
  functions = grouped.step_functions(loss, max_leaf_size=65536)
  results = {}
  for key in ["raw", "grouped", "grouped_packed_grad", "split_back"]:
    make, step = functions[key]
    state = make(params)
    for i in range(3):
      state = jax.jit(step)(state, batch(i))
    results[key] = state.target if hasattr(state, "target") else state[0]
  for key in ["grouped", "grouped_packed_grad", "split_back"]:
    for got, want in zip(
      jax.tree.leaves(results[key]), jax.tree.leaves(results["raw"]), strict=True
    ):
      np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
