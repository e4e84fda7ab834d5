"""Saves two checkpoints with orbax's CheckpointManager; the test kills it during the second.

python checkpoint_worker.py DIRECTORY
"""

from __future__ import annotations

import sys

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import optcore


def main(directory: str) -> None:
  params = {"w": jnp.arange(8, dtype=jnp.float32)}
  opt = optcore.adam(0.1).create(params).apply_gradient({"w": jnp.ones(8)})
  with ocp.CheckpointManager(directory) as manager:
    manager.save(1, args=ocp.args.StandardSave(opt.state_dict()))
    manager.wait_until_finished()
    print("saved 1", flush=True)
    big = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(64, 1024, 1024)), jnp.float32)}
    big_opt = optcore.adam(0.1).create(big)
    print("saving 2", flush=True)
    manager.save(2, args=ocp.args.StandardSave(big_opt.state_dict()))
    manager.wait_until_finished()
    print("saved 2", flush=True)


if __name__ == "__main__":
  main(sys.argv[1])
