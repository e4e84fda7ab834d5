"""benchmarks/zero1.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from benchmark_scripts import benchmark_script
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import optcore

zero1 = benchmark_script("zero1")


def test_zero1_holds_an_eighth_of_the_state_and_times_both_variants():
  devices = jax.devices("cpu")
  assert len(devices) >= 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
  mesh = Mesh(np.array(devices[:8]), ("data",))
  params = {"w": jnp.zeros((64, 32)), "b": jnp.zeros(32)}
  params = jax.device_put(params, NamedSharding(mesh, P()))
  row = zero1.measure("adam", optcore.adam(1e-3), params, mesh, rounds=2, steps=1)
  assert row["state_ratio"] == pytest.approx(1 / 8, abs=1e-3)  # the count is 4 bytes of 16 KiB
  assert row["zero1_per_device"] < row["replicated_per_device"]
  median, q1, q3 = row["step_ratio"]
  assert all(math.isfinite(x) and x > 0 for x in (median, q1, q3)) and q1 <= median <= q3
  assert row["bytes_accessed_ratio"] > 0 and row["peak_ratio"] > 0
