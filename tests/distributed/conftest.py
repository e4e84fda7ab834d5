"""Multi-device tests run on 8 CPU devices (see `eight_devices`)."""

from eight_devices import ask_for_them, eight_cpu_devices

ask_for_them()

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def cpu_devices():
  return eight_cpu_devices("tests/distributed")
