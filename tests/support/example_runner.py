"""Running an example program as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str, timeout: int = 300) -> str:
  """Runs ``examples/<name> *args`` in a fresh interpreter; returns stdout, fails on errors."""
  result = subprocess.run(
    [sys.executable, str(EXAMPLES / name), *args],
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )
  assert result.returncode == 0, result.stderr
  return result.stdout
