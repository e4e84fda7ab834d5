"""ZeRO-1 on 8 devices: replicated parameters, the optimizer state split over the
data-parallel axis (``create_sharded(params, mesh=mesh, state_axis='data')``),
against the same step with the state replicated.

Per-device state bytes (from the arrays' addressable shards), the step time
ratio measured in one run (compile-order balanced, see `timing.balanced_ratio`),
and the bytes XLA's compiled step accesses and its peak memory (so the
all-gather of the updated parameters is visible). Runs on 8 CPU devices:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/zero1.py

(`nox -s bench` sets the flag.) On CPU devices the all-gather is a memory copy
within one host; on GPUs it crosses NVLink or the network, and the memory it
saves is device memory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from state_memory import state_bytes_per_device
from timing import balanced_ratio, compiled_costs, device_name, quantiles

import optcore

RESULTS = Path(__file__).parent / "results"


def model_params(scale: int = 1) -> dict:
  """A ~20M-parameter MLP-and-embedding model (every dimension divisible by 8)."""
  return {
    "embedding": jnp.zeros((12288 * scale, 1024), jnp.float32),
    "mlp": {
      "wi": jnp.zeros((1024, 4096), jnp.float32),
      "wo": jnp.zeros((4096, 1024), jnp.float32),
      "bias": jnp.zeros((4096,), jnp.float32),
    },
    "scale": jnp.zeros((1024,), jnp.float32),
  }


def optimizers() -> dict[str, optcore.OptimizerDef]:
  return {
    "adam": optcore.adam(1e-3),
    "adamw": optcore.adamw(1e-3, weight_decay=0.1),
    "lion": optcore.lion(1e-4),
    "adafactor": optcore.adafactor(1e-3),
    "multi": optcore.MultiOptimizer(
      (r"embedding", optcore.adafactor(1e-3)), (r"mlp|scale", optcore.adamw(1e-3))
    ),
  }


def _builder(variants: dict, grads: dict, steps: int):
  """``build(key)``: a fresh jitted step and runner for one variant (`balanced_ratio`)."""

  def build(key: str):
    opt, shardings = variants[key]
    step = jax.jit(
      lambda o, g: o.apply_gradient(g), in_shardings=(shardings, None), out_shardings=shardings
    )
    state = {"opt": jax.tree.map(jnp.copy, opt)}

    def run():
      for _ in range(steps):
        state["opt"] = step(state["opt"], grads)
      jax.block_until_ready(state["opt"])

    run.step = step
    return run

  return build


def measure(
  name: str, opt_def: optcore.OptimizerDef, params: dict, mesh: Mesh, rounds: int, steps: int
) -> dict:
  """One optimizer, ZeRO-1 against a replicated state: bytes, step time, XLA's costs."""
  replicated = NamedSharding(mesh, P())
  grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)
  zero1 = opt_def.create_sharded(params, mesh=mesh, state_axis=mesh.axis_names[0])
  full = jax.jit(opt_def.create, out_shardings=replicated)(params)
  variants = {
    "zero1": (zero1, jax.tree.map(lambda x: x.sharding, zero1)),
    "replicated": (full, jax.tree.map(lambda _: replicated, full)),
  }
  build = _builder(variants, grads, steps)
  timed = balanced_ratio(build, "replicated", "zero1", rounds, steps)
  costs = {k: compiled_costs(build(k).step, variants[k][0], grads) for k in variants}
  row = {
    "optimizer": name,
    "replicated_per_device": state_bytes_per_device(full),
    "zero1_per_device": state_bytes_per_device(zero1),
    "step_ratio": timed["ratio"],
    "replicated_step_ms": quantiles(timed["base_times"])[0] * 1e3,
    "bytes_accessed_ratio": costs["zero1"][0] / costs["replicated"][0],
    "peak_ratio": costs["zero1"][1] / costs["replicated"][1],
  }
  row["state_ratio"] = row["zero1_per_device"] / row["replicated_per_device"]
  return row


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--quick", action="store_true", help="a smoke run: small model, 2 rounds")
  args = parser.parse_args()
  devices = jax.devices()
  if len(devices) < 8:
    devices = jax.devices("cpu")
  if len(devices) < 8:
    raise SystemExit(
      f"needs 8 devices, found {len(devices)}: run with "
      "XLA_FLAGS=--xla_force_host_platform_device_count=8 (nox -s bench sets it)"
    )
  mesh = Mesh(np.array(devices[:8]), ("data",))
  replicated = NamedSharding(mesh, P())
  params = jax.device_put(model_params(), replicated)
  if args.quick:
    small = jax.tree.map(lambda x: x[..., :64], params)
    params = jax.device_put(small, replicated)
    args.rounds = 2
  total_params = sum(x.size for x in jax.tree.leaves(params))
  machine = f"{device_name(devices[0])} x8, jax {jax.__version__}"
  print(f"device: {machine}; {total_params / 1e6:.1f}M parameters, replicated")
  rows = []
  for name, opt_def in optimizers().items():
    row = measure(name, opt_def, params, mesh, args.rounds, args.steps)
    rows.append(row)
    print(
      f"{name:9s} state per device: replicated {row['replicated_per_device'] / 2**20:7.2f} MiB, "
      f"ZeRO-1 {row['zero1_per_device'] / 2**20:7.2f} MiB (x{row['state_ratio']:.4f}) | step "
      f"x{row['step_ratio'][0]:.3f} [{row['step_ratio'][1]:.3f}-{row['step_ratio'][2]:.3f}] "
      f"of {row['replicated_step_ms']:.2f} ms | bytes accessed x{row['bytes_accessed_ratio']:.3f}"
      f" | peak x{row['peak_ratio']:.3f}"
    )

  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "zero1.json").write_text(json.dumps({"device": machine, "rows": rows}, indent=2))
  lines = [
    f"ZeRO-1 against a replicated state, {total_params / 1e6:.1f}M replicated parameters, "
    f"8-way data axis ({machine}); step ratios are medians over {args.rounds} rounds "
    "[quartiles], compile-order balanced.",
    "",
    "| optimizer | state per device, replicated (MiB) | ZeRO-1 (MiB) | ZeRO-1 / replicated "
    "| step time ratio | bytes accessed ratio | peak memory ratio |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lo, hi = r["step_ratio"][1], r["step_ratio"][2]
    lines.append(
      f"| {r['optimizer']} | {r['replicated_per_device'] / 2**20:.2f} | "
      f"{r['zero1_per_device'] / 2**20:.2f} | {r['state_ratio']:.4f} | "
      f"{r['step_ratio'][0]:.3f} [{lo:.3f}-{hi:.3f}] | {r['bytes_accessed_ratio']:.3f} | "
      f"{r['peak_ratio']:.3f} |"
    )
  (RESULTS / "zero1.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {RESULTS / 'zero1.md'}")


if __name__ == "__main__":
  main()
