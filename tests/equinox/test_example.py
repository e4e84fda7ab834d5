"""examples/equinox_quickstart.py runs as a user runs it and ends well."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_equinox_quickstart_trains_and_resumes_bitwise():
  result = subprocess.run(
    [sys.executable, str(ROOT / "examples" / "equinox_quickstart.py")],
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, result.stderr
  assert "matched the uninterrupted run bitwise: True" in result.stdout
  losses = [float(line.split("loss")[1]) for line in result.stdout.splitlines() if "loss" in line]
  assert losses[-1] < losses[0] / 100, losses
