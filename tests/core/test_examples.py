"""The examples run as a user runs them and end well."""

from __future__ import annotations

from example_runner import run_example


def test_core_quickstart_runs_and_resumes_bitwise():
  stdout = run_example("quickstart_core.py")
  assert "matched the uninterrupted run bitwise: True" in stdout
  losses = [
    float(line.split("loss")[1].split()[0])
    for line in stdout.splitlines()
    if line.startswith("step")
  ]
  assert losses[-1] < losses[0] / 10, losses
