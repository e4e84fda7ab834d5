"""Per-device optimizer-state bytes on an 8-device mesh, sharded against replicated.

The state is created with `OptimizerDef.create_sharded` from the parameters'
logical axes, and once replicated on every device; the bytes each device holds
are read from the arrays' addressable shards. Runs on 8 CPU devices:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/state_memory.py

(`nox -s bench` sets the flag.) On a machine with 8 or more accelerators the
same script uses them.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from timing import device_name

import optcore

RESULTS = Path(__file__).parent / "results"
RULES = [("vocab", "x"), ("mlp", "x"), ("heads", "x"), ("embed", None), ("kv", None)]


def transformer_block_params() -> tuple[dict, dict]:
  """A one-block transformer's parameters and their logical axes."""
  shapes = {
    "embedding": ((32000, 512), P("vocab", "embed")),
    "attention": {
      "query": ((512, 8, 64), P("embed", "heads", "kv")),
      "key": ((512, 8, 64), P("embed", "heads", "kv")),
      "value": ((512, 8, 64), P("embed", "heads", "kv")),
      "out": ((8, 64, 512), P("heads", "kv", "embed")),
    },
    "mlp": {
      "wi": ((512, 2048), P("embed", "mlp")),
      "wo": ((2048, 512), P("mlp", "embed")),
    },
    "layer_norm": ((512,), P("embed")),
  }
  is_entry = lambda x: isinstance(x, tuple) and isinstance(x[1], P)
  params = jax.tree.map(lambda e: jnp.zeros(e[0], jnp.float32), shapes, is_leaf=is_entry)
  axes = jax.tree.map(lambda e: e[1], shapes, is_leaf=is_entry)
  return params, axes


def state_bytes_per_device(opt: optcore.Optimizer) -> int:
  """The most optimizer-state bytes any one device holds."""
  per_device: dict = {}
  for leaf in jax.tree.leaves(opt.state):
    for shard in leaf.addressable_shards:
      per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
  return max(per_device.values())


def main() -> None:
  devices = jax.devices()
  if len(devices) < 8:  # one accelerator: measure on the 8 forced host devices instead
    devices = jax.devices("cpu")
  if len(devices) < 8:
    raise SystemExit(
      f"needs 8 devices, found {len(devices)}: run with "
      "XLA_FLAGS=--xla_force_host_platform_device_count=8 (nox -s bench sets it)"
    )
  mesh = Mesh(np.array(devices[:8]), ("x",))
  params, axes = transformer_block_params()
  total_params = sum(x.size for x in jax.tree.leaves(params))
  machine = f"{device_name(devices[0])} x8, jax {jax.__version__}"
  print(f"device: {machine}; {total_params / 1e6:.1f}M parameters")
  rows = []
  for name, opt_def in [
    ("adam", optcore.adam(1e-3)),
    ("adafactor", optcore.adafactor(1e-3)),
  ]:
    sharded = opt_def.create_sharded(params, axes, mesh, RULES)
    replicated = jax.jit(
      opt_def.create, out_shardings=NamedSharding(mesh, P())
    )(params)  # fmt: skip
    total = sum(x.nbytes for x in jax.tree.leaves(replicated.state))
    row = {
      "optimizer": name,
      "state_bytes": total,
      "replicated_per_device": state_bytes_per_device(replicated),
      "sharded_per_device": state_bytes_per_device(sharded),
    }
    row["ratio"] = row["sharded_per_device"] / row["replicated_per_device"]
    rows.append(row)
    print(
      f"{name:9s} state {total / 2**20:7.2f} MiB | per device: replicated "
      f"{row['replicated_per_device'] / 2**20:7.2f} MiB, sharded "
      f"{row['sharded_per_device'] / 2**20:7.2f} MiB | ratio {row['ratio']:.4f} (1/8 = 0.1250)"
    )
    del sharded, replicated

  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "state_memory.json").write_text(
    json.dumps({"device": machine, "rows": rows}, indent=2)
  )
  lines = [
    f"Optimizer-state bytes per device on an 8-way mesh ({machine}), "
    f"{total_params / 1e6:.1f}M-parameter transformer block.",
    "",
    "| optimizer | state (MiB) | replicated, per device (MiB) | sharded, per device (MiB) "
    "| sharded / replicated |",
    "|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['optimizer']} | {r['state_bytes'] / 2**20:.2f} | "
      f"{r['replicated_per_device'] / 2**20:.2f} | {r['sharded_per_device'] / 2**20:.2f} | "
      f"{r['ratio']:.4f} |"
    )
  (RESULTS / "state_memory.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {RESULTS / 'state_memory.md'}")


if __name__ == "__main__":
  main()
