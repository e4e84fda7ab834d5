"""Two processes x two CPU devices on 127.0.0.1, one 4-device mesh: sharded
Adam and Adafactor, and Adam with replicated parameters and its state split
(ZeRO-1), and accumulate over mixed_precision with ZeRO-1 and the state in
pinned host memory, give the same results as one process with four devices
(Adam and the at-scale stack bitwise; Adafactor, whose factored means reduce
across processes, to allclose 1e-6)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
SUPPORT = HERE.parent / "support"
TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run(num_processes: int, devices_per_process: int, out: Path) -> None:
  """Runs the worker in ``num_processes`` processes; always stops every one."""
  env = {
    **os.environ,
    "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}",
    "JAX_PLATFORMS": "cpu",
    "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
  }
  port = _free_port()
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        str(HERE / "loopback_worker.py"),
        str(i),
        str(num_processes),
        str(port),
        str(out),
      ],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(num_processes)
  ]
  try:
    outputs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  failed = [(i, p.returncode, outputs[i][-3000:]) for i, p in enumerate(procs) if p.returncode]
  assert not failed, failed


def test_two_processes_equal_one_process(tmp_path):
  multi, single = tmp_path / "multi.npz", tmp_path / "single.npz"
  _run(num_processes=2, devices_per_process=2, out=multi)
  _run(num_processes=1, devices_per_process=4, out=single)
  with np.load(multi) as got, np.load(single) as want:
    assert sorted(got.files) == sorted(want.files)
    assert any(k.startswith("adafactor") and "v_col" in k for k in got.files)
    for key in want.files:
      if key.startswith(("local_bytes:", "memory_kind:")):
        continue
      if key.startswith(("adam.", "zero1_adam.", "at_scale.")):  # elementwise: bitwise identical
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
      elif got[key].dtype.kind == "f":
        # Adafactor's row/column means and RMS reduce across the processes; gloo
        # sums the partials in another order than one process does (measured:
        # at most 8 ulp after 3 steps).
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)
      else:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    # Each process holds half of the 4-way sharded kernel moments (2 of 4 shards).
    kernel_mu = "local_bytes:adam.state.param_states[0].mu['dense']['kernel']"
    assert int(got[kernel_mu]) * 2 == int(want[kernel_mu]) == 16 * 32 * 4
    # ZeRO-1: the same halving for the state, while each process holds whole parameters.
    zero1_mu = "local_bytes:zero1_adam.state.param_states[0].mu['dense']['kernel']"
    assert int(got[zero1_mu]) * 2 == int(want[zero1_mu]) == 16 * 32 * 4
    zero1_kernel = "local_bytes:zero1_adam.target['dense']['kernel']"
    assert int(got[zero1_kernel]) * 2 == int(want[zero1_kernel]) == 4 * 16 * 32 * 4
    # The at-scale stack: its state in pinned host memory in both runs, split
    # over the processes; the float32 master copy halved per process too.
    master = "at_scale.state.param_states.inner.master['dense']['kernel']"
    assert got[master].dtype == np.float32 and int(got["at_scale.state.step"]) == 1
    assert int(got[f"local_bytes:{master}"]) * 2 == int(want[f"local_bytes:{master}"])
    for run in (got, want):
      kinds = {
        str(run[k])
        for k in run.files
        if k.startswith("memory_kind:at_scale.state.param_states") and run[k[12:]].ndim
      }
      assert kinds == {"pinned_host"}, kinds
      assert str(run["memory_kind:at_scale.target['dense']['kernel']"]) == "device"
