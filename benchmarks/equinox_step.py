"""Equinox: optcore_equinox.Optimizer against the hand-written eqx + optax loop.

Both steps are ``eqx.filter_jit``-ed with donation and take a learning rate
that changes every step (as an array: the hand-written loop through
``optax.inject_hyperparams``, optcore through an override). Reported: the
median over shuffled rounds of the per-round step-time ratio (compile-order
balanced, see timing.py), an A/A control, and the number of compilations.

  python benchmarks/equinox_step.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from timing import balanced_ratio, device_name

import optcore
import optcore_equinox

RESULTS = Path(__file__).parent / "results"


def make_model(width: int, depth: int) -> eqx.nn.MLP:
  return eqx.nn.MLP(width, width, width_size=width, depth=depth, key=jax.random.key(0))


def hand_written(model, x, compiles: list):
  tx = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3)
  state = tx.init(eqx.filter(model, eqx.is_inexact_array))

  @eqx.filter_jit(donate="all-except-first")
  def step(x_lr, model, state):  # the first argument is not donated: it is reused
    x, lr = x_lr
    compiles.append(1)
    grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    state.hyperparams["learning_rate"] = lr
    updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), state

  return step, state


def ours(model, x, compiles: list):
  opt = optcore_equinox.Optimizer(optcore.adamw(1e-3), model)

  @eqx.filter_jit(donate="all-except-first")
  def step(x_lr, model, opt):
    x, lr = x_lr
    compiles.append(1)
    grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(model)
    return opt.update(grads, model, learning_rate=lr)

  return step, opt


def bench(width: int, depth: int, rounds: int, steps: int) -> dict:
  x = jnp.ones(width)
  lrs = [jnp.asarray(1e-3 / (1 + i), jnp.float32) for i in range(steps)]
  compiles: dict[str, list] = {"raw": [], "raw_control": [], "optcore": []}
  builders = {"raw": hand_written, "raw_control": hand_written, "optcore": ours}
  builds = dict.fromkeys(builders, 0)

  def build(key: str):  # a fresh step (its own filter_jit) and fresh buffers
    builds[key] += 1
    model = jax.tree.map(lambda a: jnp.copy(a) if eqx.is_array(a) else a, make_model(width, depth))
    step, opt_state = builders[key](model, x, compiles[key])
    holder = [model, opt_state]

    def run():
      model, opt_state = holder
      for lr in lrs:
        model, opt_state = step((x, lr), model, opt_state)
      jax.block_until_ready((model, opt_state))
      holder[:] = [model, opt_state]

    return run

  ours_result = balanced_ratio(build, "raw", "optcore", rounds, steps)
  control_result = balanced_ratio(build, "raw", "raw_control", rounds, steps)
  model = make_model(width, depth)
  leaves = jax.tree.leaves(eqx.filter(model, eqx.is_array))
  raw_times = sorted(ours_result["base_times"] + control_result["base_times"])
  return {
    "width": width,
    "depth": depth,
    "params": int(sum(a.size for a in leaves)),
    "leaves": len(leaves),
    "raw_ms": 1e3 * raw_times[len(raw_times) // 2],
    "ratio": ours_result["ratio"][0],
    "ratio_quartiles": ours_result["ratio"][1:],
    "control_ratio": control_result["ratio"][0],
    "control_quartiles": control_result["ratio"][1:],
    "steps_per_build": steps * (rounds + 1),
    # each build is a fresh filter_jit over (rounds + 1) * steps learning rates: one
    # compile per build means none in the timed loop
    "compiles_per_build": {k: len(v) / builds[k] for k, v in compiles.items()},
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  shapes = [(256, 4), (1024, 4)]
  if args.quick:
    shapes, args.rounds, args.steps = [(128, 2)], 5, 20
  device = jax.devices()[0]
  machine = f"{device_name(device)}, {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; equinox {eqx.__version__}; optax {optax.__version__}")
  rows = []
  for width, depth in shapes:
    row = bench(width, depth, args.rounds, args.steps)
    rows.append(row)
    compiles = row["compiles_per_build"]
    print(
      f"MLP {width}x{depth}: {row['params'] / 1e6:.2f}M params, {row['leaves']} leaves: "
      f"hand-written {row['raw_ms']:.3f} ms | optcore_equinox x{row['ratio']:.3f} "
      f"[{row['ratio_quartiles'][0]:.3f}-{row['ratio_quartiles'][1]:.3f}] | A/A control "
      f"x{row['control_ratio']:.3f} | compiles per {row['steps_per_build']} steps with a new "
      f"lr each step: {compiles['optcore']:g} (hand-written {compiles['raw']:g})"
    )
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "equinox_step.json").write_text(
    json.dumps({"device": machine, "rows": rows}, indent=2)
  )
  lines = [
    f"eqx.filter_jit step, adamw, learning rate changed every step ({machine}).",
    "",
    "| MLP | params | leaves | hand-written eqx + optax (ms) | optcore_equinox / hand-written "
    "[quartiles] | A/A control | compiles (optcore / hand-written) |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['width']}x{r['depth']} | {r['params'] / 1e6:.2f}M | {r['leaves']} | {r['raw_ms']:.3f} "
      f"| {r['ratio']:.3f} [{r['ratio_quartiles'][0]:.3f}-{r['ratio_quartiles'][1]:.3f}] "
      f"| {r['control_ratio']:.3f} | {r['compiles_per_build']['optcore']:g} "
      f"/ {r['compiles_per_build']['raw']:g} |"
    )
  (RESULTS / "equinox_step.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {RESULTS / 'equinox_step.md'}")


if __name__ == "__main__":
  main()
