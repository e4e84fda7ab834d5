"""What watching and guarding a run costs: `with_statistics` and `skip_bad_steps` against the
same adamw step without them.

Each row times a jitted adamw step (with donation) three ways, every one against the bare step,
compile-order balanced over shuffled rounds (timing.py):

  statistics  optcore.with_statistics(adamw): per-group grad, update and parameter norms, a
              group a top-level key (here a group a leaf)
  one group   the same with every leaf in one group ({'all': '.'}) beside 'global'
  skip        optcore.skip_bad_steps(adamw): the global norm, the window rule and a select
  A/A         the bare step against a separately built bare step (the noise band)

for a model of 300 small leaves and one of 10 large ones. skip_bad_steps runs the wrapped step
under lax.cond: a select (jnp.where over the parameters and the state, kept or dropped after the
update) measured x1.33 at 300 leaves and x2.74 at 10 large ones here, three more passes over
every parameter-shaped array; the cond adds the norm's one pass over the gradients.

A second table gives XLA's bytes accessed and temporaries a parameter (cost_analysis) of each
step donated and not, beside a hand-written skip (optax's adamw under lax.cond on the global
norm): what the cond's copies of the parameters and the state would cost, if it made them.

  python benchmarks/robustness.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from timing import balanced_ratio, device_name, donated_runner, make_params

import optcore

RESULTS = Path(__file__).parent / "results"
DEFS = {
  "bare": lambda: optcore.adamw(1e-3),
  "control": lambda: optcore.adamw(1e-3),
  "statistics": lambda: optcore.with_statistics(optcore.adamw(1e-3)),
  "statistics_one_group": lambda: optcore.with_statistics(optcore.adamw(1e-3), {"all": "."}),
  "skip": lambda: optcore.skip_bad_steps(optcore.adamw(1e-3)),
}


def runner(key: str, params: dict, steps: int):
  return donated_runner(DEFS[key](), params, steps)


def bench(total: int, leaves: int, rounds: int, steps: int) -> dict:
  params = make_params(total, leaves)
  build = lambda key: runner(key, params, steps)
  row = {"params": int(sum(p.size for p in params.values())), "leaves": len(params)}
  for key in ("statistics", "statistics_one_group", "skip", "control"):
    result = balanced_ratio(build, "bare", key, rounds, steps)
    row[key] = result["ratio"][0]
    row[f"{key}_quartiles"] = result["ratio"][1:]
    if key == "control":
      times = sorted(result["base_times"])
      row["bare_ms"] = 1e3 * times[len(times) // 2]
  return row


def hand_written_skip(params: dict):
  """A skip written by hand: optax's adamw under ``lax.cond`` on the global norm."""
  tx = optax.adamw(1e-3)

  def step(carry, grads):
    def good(carry):
      params, state = carry
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    norm = optax.global_norm(grads)
    return jax.lax.cond(jnp.isfinite(norm) & (norm < 1e3), good, lambda c: c, carry)

  return step, (params, tx.init(params))


def step_bytes(total: int, leaves: int) -> list[dict]:
  """Bytes accessed and temporaries a parameter of each step, donated and kept."""
  params = make_params(total, leaves)
  count = sum(p.size for p in params.values())
  grads = jax.tree.map(jnp.ones_like, params)
  steps = {
    name: (lambda opt, g: opt.apply_gradient(g), DEFS[name]().create(params))
    for name in ("bare", "statistics", "skip")
  }
  steps["hand-written skip"] = hand_written_skip(params)
  rows = []
  for name, (fn, first) in steps.items():
    for donated in (True, False):
      compiled = jax.jit(fn, donate_argnums=(0,) if donated else ()).lower(first, grads).compile()
      cost = compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, list) else cost
      temp = compiled.memory_analysis().temp_size_in_bytes
      rows.append({
        "step": name, "donated": donated, "bytes": cost["bytes accessed"] / count,
        "temporaries": temp / count,
      })  # fmt: skip
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=11)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  shapes = [(1_000_000, 310), (4_000_000, 10)]  # 310 leaves: issue 52's measure
  if args.quick:
    shapes, args.rounds, args.steps = [(10_000, 20)], 3, 3
  device = jax.devices()[0]
  machine = f"{device_name(device)}, {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; optax {optax.__version__}")
  rows = []
  for total, leaves in shapes:
    row = bench(total, leaves, args.rounds, args.steps)
    rows.append(row)
    print(
      f"{row['params'] / 1e6:.2f}M params in {row['leaves']} leaves: bare {row['bare_ms']:.3f} ms"
      f" | with_statistics x{row['statistics']:.3f} (one group "
      f"x{row['statistics_one_group']:.3f}) | skip_bad_steps x{row['skip']:.3f} | "
      f"A/A x{row['control']:.3f}"
    )
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "robustness.json").write_text(json.dumps({"device": machine, "rows": rows}, indent=2))
  q = lambda r, k: f"{r[k]:.3f} [{r[k + '_quartiles'][0]:.3f}-{r[k + '_quartiles'][1]:.3f}]"
  lines = [
    f"adamw step, jitted ({machine}); each ratio over the bare step, median [quartiles].",
    "",
    "| params | leaves | bare step (ms) | with_statistics | with_statistics, one group "
    "| skip_bad_steps | A/A control |",
    "|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['params'] / 1e6:.2f}M | {r['leaves']} | {r['bare_ms']:.3f} | {q(r, 'statistics')} "
      f"| {q(r, 'statistics_one_group')} | {q(r, 'skip')} | {q(r, 'control')} |"
    )
  total, leaves = shapes[0]
  lines += [
    "",
    f"Bytes a parameter of each step at {total / 1e6:g}M parameters in {leaves} leaves (XLA's "
    "cost_analysis: bytes accessed; temporaries from its memory analysis):",
    "",
    "| step | donated | bytes accessed | temporaries |",
    "|---|---|---|---|",
  ]
  for r in step_bytes(total, leaves):
    name = {
      "bare": "adamw",
      "statistics": "with_statistics(adamw)",
      "skip": "skip_bad_steps(adamw)",
    }.get(r["step"], r["step"])
    lines.append(
      f"| {name} | {'yes' if r['donated'] else 'no'} | {r['bytes']:.1f} | {r['temporaries']:.2f} |"
    )
  (RESULTS / "robustness.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {RESULTS / 'robustness.md'}")


if __name__ == "__main__":
  main()
