"""benchmarks/training_at_scale.py measures at a tiny size (a smoke run of `nox -s bench`):
every variant is timed beside its A/A control, the offloaded state holds no device bytes
but its step counters, bfloat16 state halves the moments, and the master-weight curves
train."""

from __future__ import annotations

import math

import jax
from benchmark_scripts import benchmark_script

at_scale = benchmark_script("training_at_scale")


def test_every_variant_is_timed_and_its_state_measured():
  rows, meta = at_scale.measure_steps(rounds=2, steps=1, quick=True)
  by_name = {row["variant"]: row for row in rows}
  assert set(by_name) == {"pinned_host", "bf16_state", "master", "accumulate"}
  for row in rows:
    for key in ("ratio", "control"):
      median, q1, q3 = row[key]
      assert all(math.isfinite(x) and x > 0 for x in (median, q1, q3)) and q1 <= median <= q3
  offloaded = by_name["pinned_host"]
  base = offloaded["base_bytes"]["device"]
  # Two int32 scalars stay on the device (the step and adam's count); the rest is on the host.
  assert offloaded["bytes"]["device"] == 8
  assert offloaded["bytes"]["pinned_host"] == base - 8
  halved = by_name["bf16_state"]["bytes"]["device"]
  assert halved == (base - 8) // 2 + 8
  # Master copies: float32 parameters' worth on top of the bfloat16 moments.
  master = by_name["master"]
  assert master["bytes"]["device"] == 2 * (master["base_bytes"]["device"] - 8) + 8
  assert meta["params"] > 0


def test_the_master_weight_curves_train():
  with jax.numpy_rank_promotion("allow"):  # the demo's model adds its bias by broadcasting
    curves = at_scale.loss_curves(steps=60)
  assert set(curves) >= {"float32", "bfloat16", "bfloat16 + float32 master"}
  for losses in curves.values():
    assert len(losses) == 60 and losses[-1] < losses[0]
