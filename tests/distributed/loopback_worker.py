"""One process of the loopback multi-process run (see test_multiprocess.py).

    python loopback_worker.py PROCESS_ID NUM_PROCESSES PORT OUT.npz

Each process sees its own CPU devices (XLA_FLAGS from the parent); with more
than one process, `jax.distributed` joins them over gloo on 127.0.0.1 into one
4-device mesh. Adam and Adafactor are created sharded, Adam once more
with replicated parameters and its state split (ZeRO-1), and the training-at-
scale stack (accumulate over mixed_precision: bfloat16 parameters, bfloat16
state, float32 master copies; ZeRO-1; the state in pinned host memory); each
takes 3 sharded steps; process 0 writes the gathered results.
"""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_platforms", "cpu")


def main(process_id: int, num_processes: int, port: int, out: str) -> None:
  if num_processes > 1:
    jax.distributed.initialize(
      coordinator_address=f"127.0.0.1:{port}",
      num_processes=num_processes,
      process_id=process_id,
      initialization_timeout=120,
    )
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental import multihost_utils
  from jax.sharding import Mesh
  from optimizer_catalogue import loss_fn
  from sharding_setup import AXES, RULES, make_params

  import optcore

  devices = jax.devices()
  assert len(devices) == 4, devices
  mesh = Mesh(np.array(devices), ("x",))
  params = jax.tree.map(np.asarray, make_params())
  results = {}
  at_scale = optcore.accumulate(
    optcore.mixed_precision(optcore.adam(0.05), state_dtype=jnp.bfloat16, master_dtype=jnp.float32),
    every=2,
  )
  bf16 = jax.tree.map(lambda x: np.asarray(x).astype(jnp.bfloat16), params)
  for name, opt_def, state_axis, start, memory_kind in [
    ("adam", optcore.adam(0.05), None, params, None),
    ("adafactor", optcore.adafactor(0.05, min_dim_size_to_factor=8), None, params, None),
    # ZeRO-1: replicated parameters, the state split over the same 4 devices.
    ("zero1_adam", optcore.adam(0.05), "x", params, None),
    ("at_scale", at_scale, "x", bf16, "pinned_host"),
  ]:
    if state_axis is None:
      opt = opt_def.create_sharded(start, AXES, mesh, RULES)
    else:
      opt = opt_def.create_sharded(
        start, mesh=mesh, state_axis=state_axis, state_memory_kind=memory_kind
      )
    shardings = jax.tree.map(lambda x: x.sharding, opt)
    step = jax.jit(
      lambda opt: opt.apply_gradient(jax.grad(loss_fn)(opt.target)),
      in_shardings=(shardings,),
      out_shardings=shardings,
    )
    for _ in range(3):
      opt = step(opt)
    for keys, leaf in jax.tree_util.tree_flatten_with_path(opt)[0]:
      path = f"{name}{jax.tree_util.keystr(keys)}"
      results[path] = multihost_utils.process_allgather(leaf, tiled=True)
      results[f"local_bytes:{path}"] = np.asarray(
        sum(shard.data.nbytes for shard in leaf.addressable_shards)
      )
      results[f"memory_kind:{path}"] = np.asarray(str(leaf.sharding.memory_kind))
  if process_id == 0:
    np.savez(out, **results)
  if num_processes > 1:
    jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
