"""examples/equinox_quickstart.py runs as a user runs it and ends well."""

from __future__ import annotations

from example_runner import run_example


def test_equinox_quickstart_trains_and_resumes_bitwise():
  stdout = run_example("equinox_quickstart.py")
  assert "matched the uninterrupted run bitwise: True" in stdout
  # Each run's steps under its own label: the resumed ones are not mistaken for the first.
  assert "second half, resumed from the checkpoint: steps" in stdout
  losses = [float(line.split("loss")[1]) for line in stdout.splitlines() if "loss" in line]
  assert losses[-1] < losses[0] / 100, losses
