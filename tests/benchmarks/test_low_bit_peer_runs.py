"""benchmarks/low_bit_peer.py measures at a tiny size (a smoke run of `nox -s bench`)."""

from __future__ import annotations

import math

from benchmark_scripts import benchmark_script

low_bit_peer = benchmark_script("low_bit_peer")


def test_the_peer_is_adam_at_8_bits_and_both_are_measured():
  params = low_bit_peer.make_params(16384)
  grads = {k: 0.1 * p for k, p in params.items()}
  run, _, holder = low_bit_peer.peer_runner(params, grads, steps=1)
  run()
  opt = low_bit_peer.optcore_def().create(params)
  opt = opt.apply_gradient(grads)
  # the same algorithm on the same maps: one step of each moves the parameters alike
  for k in params:
    assert float(abs(holder[0][k] - opt.target[k]).max()) < 1e-6
  result = low_bit_peer.measure(16384, rounds=2, steps=1)
  assert result["bytes_per_parameter"]["peer"] > 0 and result["bytes_per_parameter"]["optcore"] > 0
  for key in ("optcore", "control"):
    ratio, low, high = result[key]
    assert math.isfinite(ratio) and low <= ratio <= high
  assert "| optcore |" in low_bit_peer.report(result, "test machine")
