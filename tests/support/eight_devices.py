"""8 CPU devices for the multi-device tests (tests/distributed, tests/flax/mesh).

nox sets XLA_FLAGS for those folders; run alone, their conftest calls `ask_for_them` before
JAX creates its backend. A test that finds fewer devices fails and says how to run it, rather
than passing on one device.
"""

from __future__ import annotations

import os

FLAG = "--xla_force_host_platform_device_count=8"


def ask_for_them() -> None:
  """Adds the flag to XLA_FLAGS unless a device count is set there already."""
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FLAG}".strip()


def eight_cpu_devices(folder: str) -> list:
  """The first 8 CPU devices; fails naming the command when JAX started with fewer."""
  import jax
  import pytest

  devices = jax.devices("cpu")
  if len(devices) < 8:
    pytest.fail(
      f"these tests need 8 CPU devices and found {len(devices)}: JAX started before "
      f"XLA_FLAGS={FLAG} was set. Run them in their own process: XLA_FLAGS={FLAG} pytest {folder}"
    )
  return devices[:8]
