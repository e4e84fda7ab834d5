"""The demo (`nox -s demo`) runs and shows what it promises."""

from __future__ import annotations

from example_runner import run_example


def test_swap_frameworks_demo(tmp_path):
  plot = tmp_path / "curves.png"
  stdout = run_example("swap_frameworks.py", "--steps", "100", "--plot", str(plot))
  assert "identical in every framework, bitwise: True" in stdout
  assert "matches the uninterrupted run bitwise: True" in stdout
  assert "P(None, 'model')" in stdout and "16 of  128 bytes per device" in stdout
  assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"
