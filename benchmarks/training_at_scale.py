"""Training at scale: optimizer state in host memory, low-precision state with
float32 master weights, and gradient accumulation, against their baselines.

1. **Memory and step time** (a ~9M-parameter MLP-and-embedding model, one
   device): per-device *device*-memory and host-memory bytes of the
   optimizer state, and the step-time ratio of each variant against its
   baseline in the same run (compile-order balanced, `timing.balanced_ratio`),
   beside an A/A control (the baseline against a fresh copy of itself):
   ``state_memory_kind="pinned_host"`` against the on-device step;
   ``mixed_precision(state_dtype=bfloat16)`` against float32 state;
   ``accumulate(every=4)`` against ``optax.MultiSteps``.
2. **Master weights** (the demo's model and optimizer config,
   examples/swap_frameworks.py, with bfloat16 parameters): the loss curves of
   float32 training, plain bfloat16 updates, bfloat16 parameters with float32
   master copies, and the same with bfloat16 state.

  python benchmarks/training_at_scale.py [--quick]

On a CPU the "host" and the "device" are the same DRAM: the offload ratio
there measures the copies' overhead, not a transfer over PCIe. On a GPU
(`nox -s bench` with one present) it is a real host-to-device transfer.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from timing import balanced_ratio, device_name, quantiles

import optcore

RESULTS = Path(__file__).parent / "results"
EXAMPLES = Path(__file__).parents[1] / "examples"


def model_params(width: int = 1024, vocab: int = 4096, dtype=jnp.float32) -> dict:
  """A ~9M-parameter MLP-and-embedding model (the shapes of benchmarks/zero1.py, smaller)."""
  key = jax.random.key(0)
  shapes = {
    "embedding": (vocab, width),
    "wi": (width, 2 * width),
    "wo": (2 * width, width),
    "bias": (2 * width,),
    "scale": (width,),
  }
  return {
    name: (0.02 * jax.random.normal(jax.random.fold_in(key, i), shape)).astype(dtype)
    for i, (name, shape) in enumerate(shapes.items())
  }


def state_bytes(opt: optcore.Optimizer) -> dict[str, int]:
  """The optimizer state's bytes on the most loaded device, by memory kind."""
  per: dict = {}
  for leaf in jax.tree.leaves(opt.state):
    kind = leaf.sharding.memory_kind or "device"
    for shard in leaf.addressable_shards:
      per.setdefault(kind, {}).setdefault(shard.device, 0)
      per[kind][shard.device] += shard.data.nbytes
  return {kind: max(devices.values()) for kind, devices in per.items()}


def optcore_runner(opt: optcore.Optimizer, grads: dict, steps: int):
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  box = {"opt": jax.tree.map(jnp.copy, opt)}

  def run():
    for _ in range(steps):
      box["opt"] = step(box["opt"], grads)
    jax.block_until_ready(box["opt"])

  return run


def optax_runner(tx: optax.GradientTransformation, params: dict, grads: dict, steps: int):
  @jax.jit
  def step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  box = {"p": jax.tree.map(jnp.copy, params)}
  box["s"] = tx.init(box["p"])

  def run():
    for _ in range(steps):
      box["p"], box["s"] = step(box["p"], box["s"], grads)
    jax.block_until_ready(box["p"])

  return run


def comparisons(params: dict, mesh: Mesh, steps: int) -> dict[str, tuple]:
  """name -> (build(key), baseline label, variant label, the variant's optimizer)."""
  grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)
  adam = optcore.adam(1e-3)
  on_device = adam.create_sharded(params, mesh=mesh)
  on_host = adam.create_sharded(params, mesh=mesh, state_memory_kind="pinned_host")
  bf16_state = optcore.mixed_precision(adam, state_dtype=jnp.bfloat16).create(params)
  low = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
  bf16_params = adam.create(low)
  master = optcore.mixed_precision(adam, state_dtype=jnp.bfloat16, master_dtype=jnp.float32).create(
    low
  )
  accumulated = optcore.accumulate(adam, every=4).create(params)
  low_grads = jax.tree.map(lambda g: g.astype(jnp.bfloat16), grads)

  def pair(base, variant, grads=grads):
    return lambda key: optcore_runner(base if key == "base" else variant, grads, steps)

  def against_multisteps(key):
    if key == "base":
      return optax_runner(optax.MultiSteps(optax.adam(1e-3), 4), params, grads, steps)
    return optcore_runner(accumulated, grads, steps)

  return {
    "pinned_host": (pair(on_device, on_host), "adam, state on device", on_host),
    "bf16_state": (pair(on_device, bf16_state), "adam, float32 state", bf16_state),
    "master": (
      pair(bf16_params, master, low_grads),
      "adam on bfloat16 parameters",
      master,
    ),
    "accumulate": (against_multisteps, "optax.MultiSteps(adam, 4)", accumulated),
    "_base_opts": (on_device, bf16_params),
  }


LABELS = {
  "pinned_host": 'state_memory_kind="pinned_host"',
  "bf16_state": "mixed_precision(state_dtype=bfloat16)",
  "master": "mixed_precision(bfloat16 state, float32 master)",
  "accumulate": "accumulate(adam, every=4)",
}


def measure_steps(rounds: int, steps: int, quick: bool) -> tuple[list[dict], dict]:
  device = jax.devices()[0]
  mesh = Mesh(np.array([device]), ("data",))
  params = model_params(256, 512) if quick else model_params()
  cases = comparisons(params, mesh, steps)
  on_device, bf16_params = cases.pop("_base_opts")
  baseline_bytes = {"adam, state on device": state_bytes(on_device)}
  baseline_bytes["adam on bfloat16 parameters"] = state_bytes(bf16_params)
  baseline_bytes["adam, float32 state"] = baseline_bytes["adam, state on device"]
  multisteps = optax.MultiSteps(optax.adam(1e-3), 4).init(params)
  baseline_bytes["optax.MultiSteps(adam, 4)"] = {
    "device": sum(x.nbytes for x in jax.tree.leaves(multisteps))
  }
  rows = []
  for name, (build, base_label, variant) in cases.items():
    timed = balanced_ratio(build, "base", "variant", rounds, steps)
    control = balanced_ratio(lambda key, build=build: build("base"), "a", "b", rounds, steps)
    row = {
      "variant": name,
      "label": LABELS[name],
      "baseline": base_label,
      "ratio": timed["ratio"],
      "control": control["ratio"],
      "base_ms": quantiles(timed["base_times"])[0] * 1e3,
      "bytes": state_bytes(variant),
      "base_bytes": baseline_bytes.get(base_label),
    }
    rows.append(row)
    print(
      f"{name:12s} step x{row['ratio'][0]:.3f} [{row['ratio'][1]:.3f}, {row['ratio'][2]:.3f}] "
      f"(A/A {row['control'][0]:.3f} [{row['control'][1]:.3f}, {row['control'][2]:.3f}]) of "
      f"{row['base_ms']:.2f} ms; state bytes {row['bytes']} vs {row['base_bytes']}"
    )
  total = sum(x.size for x in jax.tree.leaves(params))
  return rows, {"params": total, "device": device_name(device)}


def loss_curves(steps: int) -> dict[str, list[float]]:
  """The demo's model and config, bfloat16 parameters with and without master copies."""
  sys.path.insert(0, str(EXAMPLES))
  from swap_frameworks import CONFIG, data, initial_params, learning_rate, loss_of

  x, y = data()
  inner = optcore.config.from_config(CONFIG)
  variants = {
    "float32": (inner, jnp.float32),
    "bfloat16": (inner, jnp.bfloat16),
    "bfloat16 + float32 master": (
      optcore.mixed_precision(inner, master_dtype=jnp.float32),
      jnp.bfloat16,
    ),
    "bfloat16 + float32 master + bfloat16 state": (
      optcore.mixed_precision(inner, state_dtype=jnp.bfloat16, master_dtype=jnp.float32),
      jnp.bfloat16,
    ),
  }
  curves = {}
  for name, (opt_def, dtype) in variants.items():
    opt = opt_def.create(
      jax.tree.map(lambda p, dtype=dtype: jnp.asarray(p, dtype), initial_params())
    )

    @jax.jit
    def step(opt, lr):
      # The loss in float32 from the parameters as they are: only the optimizer differs.
      as_f32 = lambda p: loss_of(jax.tree.map(lambda a: a.astype(jnp.float32), p), x, y)
      loss, grads = jax.value_and_grad(as_f32)(opt.target)
      return opt.apply_gradient(grads, learning_rate=lr), loss

    losses = []
    for i in range(steps):
      opt, loss = step(opt, learning_rate(i, steps))
      losses.append(float(loss))
    curves[name] = losses
    print(f"{name:45s} final loss {losses[-1]:.5f}")
  return curves


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=9)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--train-steps", type=int, default=1500)
  parser.add_argument("--quick", action="store_true", help="a smoke run: small model, 2 rounds")
  args = parser.parse_args()
  if args.quick:
    args.rounds, args.train_steps = 2, 100
  rows, meta = measure_steps(args.rounds, args.steps, args.quick)
  curves = loss_curves(args.train_steps)
  final = {name: c[-1] for name, c in curves.items()}
  report = {
    **meta,
    "jax": jax.__version__,
    "rounds": args.rounds,
    "rows": rows,
    "curves": curves,
    "final_loss": final,
  }
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "training_at_scale.json").write_text(json.dumps(report, indent=1))
  mib = lambda b: f"{(b or 0) / 2**20:.2f}"
  lines = [
    f"Each variant against its baseline, {meta['params'] / 1e6:.1f}M parameters on "
    f"{meta['device']} (jax {jax.__version__}); step-time ratios are medians over "
    f"{args.rounds} rounds [quartiles], compile-order balanced, beside an A/A control (the "
    "baseline against a fresh copy of itself). Below 1 is faster. State bytes are the most "
    "any one device holds, in device memory and in pinned host memory.",
    "",
    "| variant | baseline | baseline step (ms) | step time ratio | A/A control "
    "| state in device memory (MiB) | in host memory (MiB) | baseline state (MiB) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    base = r["base_bytes"]
    lines.append(
      f"| {r['label']} | {r['baseline']} | {r['base_ms']:.2f} | {r['ratio'][0]:.3f} "
      f"[{r['ratio'][1]:.3f}, {r['ratio'][2]:.3f}] | {r['control'][0]:.3f} "
      f"[{r['control'][1]:.3f}, {r['control'][2]:.3f}] | {mib(r['bytes'].get('device'))} | "
      f"{mib(r['bytes'].get('pinned_host'))} | {mib(base.get('device')) if base else 'n/a'} |"
    )
  lines += [
    "",
    f"Master weights: the demo's model and config (examples/swap_frameworks.py), "
    f"{args.train_steps} steps of its cosine schedule, bfloat16 parameters; the final loss "
    "(float32 loss of the parameters as they are) and its ratio to float32 training.",
    "",
    "| parameters | final loss | / float32 |",
    "|---|---|---|",
  ]
  for name, value in final.items():
    lines.append(f"| {name} | {value:.5f} | {value / final['float32']:.3f} |")
  (RESULTS / "training_at_scale.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {RESULTS / 'training_at_scale.md'}")


if __name__ == "__main__":
  main()
