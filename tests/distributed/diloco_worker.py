"""One process of the two-process DiLoCo run (see test_diloco_processes.py).

    python diloco_worker.py PROCESS_ID NUM_PROCESSES PORT OUT.npz

Each process is one replica: one CPU device, joined by `jax.distributed` over gloo on
127.0.0.1 into a ``('replica',)`` mesh of both. The parameters start equal on both; each
process feeds only its own replica's gradients (`jax.make_array_from_process_local_data`);
five steps of ``diloco(adamw, every=2)``; process 0 writes the gathered replicas, the global
parameters and the step counts."""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_platforms", "cpu")

REPLICAS, STEPS = 2, 5


def start():
  import numpy as np

  rng = np.random.default_rng(0)
  one = {
    "w": rng.normal(size=(8, 6)).astype(np.float32),
    "b": rng.normal(size=6).astype(np.float32),
  }
  return {k: np.stack([v] * REPLICAS) for k, v in one.items()}


def replica_grads(step: int, replica: int):
  import numpy as np

  rng = np.random.default_rng(1000 * step + replica)
  return {
    "w": rng.normal(size=(8, 6)).astype(np.float32),
    "b": rng.normal(size=6).astype(np.float32),
  }


def definition():
  import optcore

  return optcore.diloco(optcore.adamw(0.05, weight_decay=0.01), every=2)


def main(process_id: int, num_processes: int, port: int, out: str) -> None:
  jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}",
    num_processes=num_processes,
    process_id=process_id,
    initialization_timeout=120,
  )
  import numpy as np
  from jax.experimental import multihost_utils
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  assert jax.process_count() == REPLICAS and len(jax.local_devices()) == 1
  mesh = Mesh(np.array(jax.devices()), ("replica",))
  axes = {"w": P("replica", "embed", "mlp"), "b": P("replica", "mlp")}
  opt = definition().create_sharded(start(), axes, mesh, [("replica", "replica")])
  sharding = NamedSharding(mesh, P("replica"))
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(STEPS):
    mine = {k: v[None] for k, v in replica_grads(i, process_id).items()}  # this process's replica
    grads = {k: jax.make_array_from_process_local_data(sharding, v) for k, v in mine.items()}
    opt = step(opt, grads)
  local_bytes = sum(s.data.nbytes for s in opt.target["w"].addressable_shards)
  results = {
    f"target/{k}": multihost_utils.process_allgather(v, tiled=True) for k, v in opt.target.items()
  }
  anchor = opt.state.param_states.anchor
  # replicated over both processes: each holds it whole
  results |= {f"anchor/{k}": np.asarray(v.addressable_data(0)) for k, v in anchor.items()}
  results["outer_step"] = np.asarray(opt.state.param_states.outer_step.addressable_data(0))
  results["local_bytes"] = np.asarray(local_bytes)
  if process_id == 0:
    np.savez(out, **results)


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
