"""Multi-device tests run on 8 CPU devices.

nox sets XLA_FLAGS for this folder; run alone, this conftest sets it before
JAX creates its backend. A test that finds fewer devices fails and says how
to run it, rather than passing on one device.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def cpu_devices():
  devices = jax.devices("cpu")
  if len(devices) < 8:
    pytest.fail(
      f"these tests need 8 CPU devices and found {len(devices)}: JAX started before "
      f"XLA_FLAGS={_FLAG} was set. Run them in their own process: "
      f"XLA_FLAGS={_FLAG} pytest tests/distributed"
    )
  return devices[:8]
