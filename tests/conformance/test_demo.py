"""The demo (`nox -s demo`) runs and shows what it promises."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from example_runner import EXAMPLES, run_example


def test_swap_frameworks_demo(tmp_path):
  plot = tmp_path / "curves.png"
  stdout = run_example("swap_frameworks.py", "--steps", "100", "--plot", str(plot))
  header = next(line for line in stdout.splitlines() if line.strip().startswith("step "))
  assert header.split() == ["step", "core", "flax", "nnx", "equinox", "treex"]
  assert "identical in every framework, bitwise: True" in stdout
  assert "matches the uninterrupted run bitwise: True" in stdout
  assert "P(None, 'model')" in stdout and "16 of  128 bytes per device" in stdout
  assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_swap_frameworks_asks_for_matplotlib_before_it_trains():
  """Without matplotlib (sys.modules[name] = None is how Python spells "not importable"),
  the demo says how to get it, and how to run without it, before any training."""
  demo = EXAMPLES / "swap_frameworks.py"
  code = (
    "import runpy, sys; sys.modules['matplotlib'] = None; "
    f"sys.argv = [{str(demo)!r}]; runpy.run_path({str(demo)!r}, run_name='__main__')"
  )
  result = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
  )
  assert result.returncode == 2
  assert (
    "the plot needs matplotlib, which is not installed: pip install matplotlib" in result.stderr
  )
  assert "--plot ''" in result.stderr
  assert "Training" not in result.stdout


def test_the_spike_example_skips_the_bad_batch_and_plots_it(tmp_path):
  plot = tmp_path / "spike.png"
  stdout = run_example("spike_statistics.py", "--steps", "100", "--plot", str(plot))
  assert "skipped steps: 1; the bad step's update norm: 0.0" in stdout
  assert "the logged norms of step 79 match a hand computation: True" in stdout
  assert "mid-window: the same parameters bitwise: True" in stdout
  assert plot.read_bytes()[:4] == b"\x89PNG"
  import matplotlib.image

  pixels = matplotlib.image.imread(plot)[..., :3]
  near = lambda rgb: (abs(pixels - (np.array(rgb) / 255)).sum(axis=-1) < 0.1).sum()
  assert near((31, 119, 180)) > 200 and near((255, 127, 14)) > 200  # layer0's and layer1's lines
  assert near((255, 0, 0)) > 20  # the skipped step's marker
