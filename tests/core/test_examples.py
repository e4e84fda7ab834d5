"""The examples run as a user runs them and end well."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_core_quickstart_runs_and_resumes_bitwise():
  result = subprocess.run(
    [sys.executable, str(ROOT / "examples" / "quickstart_core.py")],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, result.stderr
  assert "matched the uninterrupted run bitwise: True" in result.stdout
  losses = [
    float(line.split("loss")[1].split()[0])
    for line in result.stdout.splitlines()
    if line.startswith("step")
  ]
  assert losses[-1] < losses[0] / 10, losses
