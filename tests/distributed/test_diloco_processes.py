"""optcore.diloco with the replicas as processes: two processes on 127.0.0.1
(`jax.distributed`, gloo), one replica and one CPU device each, each feeding only its own
replica's gradients, end where one process with both replicas ends (the outer step's mean is
the one cross-process all-reduce; within the ulps gloo's sum may round otherwise)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import diloco_worker  # noqa: E402

TIMEOUT_S = 240


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_are_two_replicas(tmp_path):
  out = tmp_path / "diloco.npz"
  env = {
    **os.environ,
    "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
    "JAX_PLATFORMS": "cpu",
    "PYTHONPATH": os.pathsep.join([str(HERE.parent / "support"), os.environ.get("PYTHONPATH", "")]),
  }
  port = _free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, str(HERE / "diloco_worker.py"), str(i), "2", str(port), str(out)],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
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

  opt_def = diloco_worker.definition()
  opt = opt_def.create(jax.tree.map(jnp.asarray, diloco_worker.start()))
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(diloco_worker.STEPS):
    both = [diloco_worker.replica_grads(i, r) for r in range(diloco_worker.REPLICAS)]
    opt = step(opt, {k: jnp.stack([g[k] for g in both]) for k in both[0]})
  with np.load(out) as got:
    assert int(got["outer_step"]) == diloco_worker.STEPS // 2
    assert int(got["local_bytes"]) == 8 * 6 * 4  # one replica per process
    for k, want in opt.target.items():
      ulp = np.spacing(np.float32(np.max(np.abs(want))))
      # measured: bitwise (one all-reduce of two numbers: its sum rounds once either way)
      assert np.max(np.abs(got[f"target/{k}"] - np.asarray(want))) <= 2 * ulp, k
      anchor = np.asarray(opt.state.param_states.anchor[k])
      assert np.max(np.abs(got[f"anchor/{k}"] - anchor)) <= 2 * ulp, k
