"""The NNX face on 8 CPU devices (see `eight_devices`): nox runs this folder in a process of
its own with them, on the oldest and the newest supported stack. The models of the pains come
from benchmarks/nnx_pains.py, which checks the same pains on Flax's own optimizer."""

import sys
from pathlib import Path

from eight_devices import ask_for_them, eight_cpu_devices

ask_for_them()

import pytest  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
  sys.path.insert(0, str(BENCHMARKS))


@pytest.fixture(scope="session")
def cpu_devices():
  return eight_cpu_devices("tests/flax/mesh")
