"""The NNX face on 8 CPU devices (see `eight_devices`): nox runs this folder in a process of
its own with them, on the oldest and the newest supported stack."""

from eight_devices import ask_for_them, eight_cpu_devices

ask_for_them()

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def cpu_devices():
  return eight_cpu_devices("tests/flax/mesh")
