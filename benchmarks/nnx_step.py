"""NNX: optcore_flax.nnx.Optimizer against Flax's own nnx.Optimizer, and both against raw optax.

Three steps of an MLP of many small layers, each jitted with donation:

  flax     nnx.Optimizer(model, optax.adamw(...)) updated under nnx.jit
  optcore  optcore_flax.nnx.Optimizer(model, optcore.adamw(...)) under nnx.jit
  raw      the same model's parameters and optax state in a jax.jit loop (no nnx in the step)
  functional  optcore_flax.nnx.Optimizer split once, stepped by jax.jit (merge inside the trace)

Reported: optcore / flax (the face's own cost: it should be 1), flax / raw (what nnx.jit's
graph handling costs, which the face inherits), functional / raw (the face without nnx.jit's
per-call graph walk), each the median over shuffled rounds of the
per-round ratio, compile-order balanced (timing.py), beside an A/A control (flax against a
separately built flax).

  python benchmarks/nnx_step.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from timing import balanced_ratio, device_name

import optcore
from optcore_flax import nnx as ocnnx

RESULTS = Path(__file__).parent / "results"
LR = 1e-3


class MLP(nnx.Module):
  def __init__(self, width: int, depth: int):
    rngs = nnx.Rngs(0)
    self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])

  def __call__(self, x):
    for layer in self.layers:
      x = nnx.relu(layer(x))
    return x


def loss(model, x):
  return jnp.mean(model(x) ** 2)


def nnx_runner(optimizer_cls, tx, width, depth, steps):
  model = MLP(width, depth)
  optimizer = optimizer_cls(model, tx, wrt=nnx.Param)
  x = jnp.ones((8, width))

  @nnx.jit(donate_argnums=(0, 1))
  def step(model, optimizer, x):
    optimizer.update(model, nnx.grad(loss)(model, x))

  def run():
    for _ in range(steps):
      step(model, optimizer, x)
    jax.block_until_ready(nnx.state((model, optimizer)))

  return run


def functional_runner(width, depth, steps):
  """The NNX face stepped the functional way: split once, a jax.jit step merges inside (at
  trace time only) and returns the new state, so no graph is walked per call."""
  model = MLP(width, depth)
  optimizer = ocnnx.Optimizer(model, optcore.adamw(LR), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  holder = [state]
  x = jnp.ones((8, width))

  @jax.jit
  def step(state, x):
    model, optimizer = nnx.merge(graphdef, state)
    optimizer.update(model, nnx.grad(loss)(model, x))
    return nnx.state((model, optimizer))

  def run():
    (state,) = holder
    for _ in range(steps):
      state = step(state, x)
    jax.block_until_ready(state)
    holder[:] = [state]

  return run


def raw_runner(width, depth, steps):
  graphdef, params, rest = nnx.split(MLP(width, depth), nnx.Param, ...)
  tx = optax.adamw(LR)
  holder = [params, tx.init(params)]
  x = jnp.ones((8, width))

  @jax.jit
  def step(params, state, x):
    grads = jax.grad(lambda p: loss(nnx.merge(graphdef, p, rest), x))(params)
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  def run():
    params, state = holder
    for _ in range(steps):
      params, state = step(params, state, x)
    jax.block_until_ready((params, state))
    holder[:] = [params, state]

  return run


def bench(width: int, depth: int, rounds: int, steps: int) -> dict:
  builders = {
    "flax": lambda: nnx_runner(nnx.Optimizer, optax.adamw(LR), width, depth, steps),
    "flax_control": lambda: nnx_runner(nnx.Optimizer, optax.adamw(LR), width, depth, steps),
    "optcore": lambda: nnx_runner(ocnnx.Optimizer, optcore.adamw(LR), width, depth, steps),
    "raw": lambda: raw_runner(width, depth, steps),
    "functional": lambda: functional_runner(width, depth, steps),
  }
  build = lambda key: builders[key]()
  face = balanced_ratio(build, "flax", "optcore", rounds, steps)
  control = balanced_ratio(build, "flax", "flax_control", rounds, steps)
  nnx_cost = balanced_ratio(build, "raw", "flax", rounds, steps)
  functional = balanced_ratio(build, "raw", "functional", rounds, steps)
  params = nnx.state(MLP(width, depth), nnx.Param)
  leaves = jax.tree.leaves(params)
  flax_times = sorted(face["base_times"] + control["base_times"])
  return {
    "width": width,
    "depth": depth,
    "params": int(sum(a.size for a in leaves)),
    "leaves": len(leaves),
    "flax_ms": 1e3 * flax_times[len(flax_times) // 2],
    "ratio": face["ratio"][0],
    "ratio_quartiles": face["ratio"][1:],
    "control_ratio": control["ratio"][0],
    "control_quartiles": control["ratio"][1:],
    "flax_over_raw": nnx_cost["ratio"][0],
    "functional_over_raw": functional["ratio"][0],
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=11)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  shapes = [(80, 150), (64, 50), (256, 16)]  # 0.97M params in 300 leaves, the size
  if args.quick:
    shapes, args.rounds, args.steps = [(16, 4)], 3, 5
  device = jax.devices()[0]
  machine = f"{device_name(device)}, {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; flax {flax.__version__}; optax {optax.__version__}")
  rows = []
  for width, depth in shapes:
    row = bench(width, depth, args.rounds, args.steps)
    rows.append(row)
    print(
      f"MLP {width}x{depth}: {row['params'] / 1e6:.2f}M params, {row['leaves']} leaves: "
      f"nnx.Optimizer {row['flax_ms']:.3f} ms | optcore_flax.nnx x{row['ratio']:.3f} "
      f"[{row['ratio_quartiles'][0]:.3f}-{row['ratio_quartiles'][1]:.3f}] | A/A control "
      f"x{row['control_ratio']:.3f} | nnx.Optimizer / raw optax loop x{row['flax_over_raw']:.2f}"
      f" | optcore_flax.nnx split once, jax.jit / raw x{row['functional_over_raw']:.3f}"
    )
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "nnx_step.json").write_text(json.dumps({"device": machine, "rows": rows}, indent=2))
  lines = [
    f"nnx.jit step, adamw ({machine}).",
    "",
    "| MLP | params | leaves | nnx.Optimizer (ms) | optcore_flax.nnx / nnx.Optimizer "
    "[quartiles] | A/A control | nnx.Optimizer / raw optax loop | optcore_flax.nnx split once, "
    "jax.jit / raw |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['width']}x{r['depth']} | {r['params'] / 1e6:.2f}M | {r['leaves']} | "
      f"{r['flax_ms']:.3f} | {r['ratio']:.3f} [{r['ratio_quartiles'][0]:.3f}-"
      f"{r['ratio_quartiles'][1]:.3f}] | {r['control_ratio']:.3f} | {r['flax_over_raw']:.2f} "
      f"| {r['functional_over_raw']:.3f} |"
    )
  (RESULTS / "nnx_step.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {RESULTS / 'nnx_step.md'}")


if __name__ == "__main__":
  main()
