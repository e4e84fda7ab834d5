"""What watching and guarding a run costs: `with_statistics` and `skip_bad_steps` against the
same adamw step without them, on three model shapes.

Each row times a jitted adamw step (with donation) three ways, every one against the bare step,
compile-order balanced over shuffled rounds (timing.py):

  statistics  optcore.with_statistics(adamw): per-group grad, update and parameter norms, a
              group a top-level key (here a group a leaf)
  one group   the same with every leaf in one group ({'all': '.'}) beside 'global'
  skip        optcore.skip_bad_steps(adamw): the global norm, the window rule and a select
  A/A         the bare step against a separately built bare step (the noise band)

The shapes (issue 65): uniform, 310 leaves of mixed sizes (128 columns where large, issue
52's); transformer-shaped, 10 matrices of 256 columns and 300 small leaves of 1 to 1,200
values (biases, norms, heads); and a few huge matrices, 4 of 1024 x 1024.

A second table gives XLA's bytes accessed, temporaries and `copy` instructions a parameter
(cost_analysis, memory_analysis, the compiled HLO) of each donated step, beside a hand-written
skip (optax's adamw under lax.cond on the global norm) and hand-written statistics (optax's
adamw, then three sums a leaf of its gradients, updates and new parameters: what a user
writes; the update read from optax's updates, not new minus old).

Results go to results/robustness_jax<version>.md: `nox -s bench` runs it on the oldest and the
newest stack uv.lock resolves.

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
from timing import (
  balanced_ratio,
  device_name,
  donated_runner,
  huge_params,
  make_params,
  transformer_params,
  version_suffix,
)

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


#: Each shape's parameters at a total size (about; a few huge matrices: 4 square ones).
SHAPES = {
  "uniform": lambda total: make_params(total, 310),
  "transformer-shaped": transformer_params,
  "huge matrices": lambda total: huge_params(total, 4),
}


def bench(params: dict, rounds: int, steps: int) -> dict:
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


def hand_written_statistics(params: dict):
  """Statistics written by hand: optax's adamw, then each leaf's gradient, update and
  parameter norms from its updates and new parameters (three sums a leaf)."""
  tx = optax.adamw(1e-3)

  def step(carry, grads):
    params, state = carry
    updates, state = tx.update(grads, state, params)
    new = optax.apply_updates(params, updates)
    trees = (grads, updates, new)
    leaves = zip(*(jax.tree.leaves(t) for t in trees), strict=True)
    norms = jnp.stack([jnp.stack([jnp.sum(x * x) for x in leaf]) for leaf in leaves])
    return (new, state), jnp.sqrt(norms)

  return step, (params, tx.init(params))


def step_bytes(params: dict) -> list[dict]:
  """Bytes accessed, temporaries and copies a parameter of each donated step."""
  count = sum(p.size for p in params.values())
  grads = jax.tree.map(jnp.ones_like, params)
  steps = {
    name: (lambda opt, g: opt.apply_gradient(g), DEFS[name]().create(params))
    for name in ("bare", "statistics", "skip")
  }
  steps["hand-written skip"] = hand_written_skip(params)
  steps["hand-written statistics"] = hand_written_statistics(params)
  rows = []
  for name, (fn, first) in steps.items():
    compiled = jax.jit(fn, donate_argnums=(0,)).lower(first, grads).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    temp = compiled.memory_analysis().temp_size_in_bytes
    copies = sum(" copy(" in line for line in compiled.as_text().splitlines())
    rows.append({
      "step": name, "bytes": cost["bytes accessed"] / count, "temporaries": temp / count,
      "copies": copies,
    })  # fmt: skip
  return rows


NAMES = {
  "bare": "adamw",
  "statistics": "with_statistics(adamw)",
  "skip": "skip_bad_steps(adamw)",
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=11)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--total", type=int, default=1_000_000)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--out", default=str(RESULTS))
  args = parser.parse_args()
  totals = {"uniform": args.total, "transformer-shaped": args.total, "huge matrices": 4 * 2**20}
  if args.quick:
    args.rounds, args.steps = 3, 3
    totals = {name: 20_000 for name in totals}
  device = jax.devices()[0]
  machine = f"{device_name(device)}, {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; optax {optax.__version__}")
  rows = []
  for shape, make in SHAPES.items():
    params = make(totals[shape])
    row = {"shape": shape, **bench(params, args.rounds, args.steps), "bytes": step_bytes(params)}
    rows.append(row)
    print(
      f"{shape}: {row['params'] / 1e6:.2f}M params in {row['leaves']} leaves: bare "
      f"{row['bare_ms']:.3f} ms | with_statistics x{row['statistics']:.3f} (one group "
      f"x{row['statistics_one_group']:.3f}) | skip_bad_steps x{row['skip']:.3f} | "
      f"A/A x{row['control']:.3f}"
    )
  out = Path(args.out)
  out.mkdir(exist_ok=True)
  name = f"robustness_jax{version_suffix()}"
  (out / f"{name}.json").write_text(json.dumps({"device": machine, "rows": rows}, indent=2))
  q = lambda r, k: f"{r[k]:.3f} [{r[k + '_quartiles'][0]:.3f}-{r[k + '_quartiles'][1]:.3f}]"
  lines = [
    f"adamw step, jitted and donated ({machine}); each ratio over the bare step, median "
    "[quartiles].",
    "",
    "| shape | params | leaves | bare step (ms) | with_statistics | with_statistics, one group "
    "| skip_bad_steps | A/A control |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    lines.append(
      f"| {r['shape']} | {r['params'] / 1e6:.2f}M | {r['leaves']} | {r['bare_ms']:.3f} "
      f"| {q(r, 'statistics')} | {q(r, 'statistics_one_group')} | {q(r, 'skip')} "
      f"| {q(r, 'control')} |"
    )
  lines += [
    "",
    "Bytes a parameter of each donated step (XLA's cost_analysis: bytes accessed; temporaries "
    "from its memory analysis; `copy` instructions in the compiled step):",
    "",
    "| shape | step | bytes accessed | temporaries | copies |",
    "|---|---|---|---|---|",
  ]
  for r in rows:
    for b in r["bytes"]:
      lines.append(
        f"| {r['shape']} | {NAMES.get(b['step'], b['step'])} | {b['bytes']:.1f} "
        f"| {b['temporaries']:.2f} | {b['copies']} |"
      )
  (out / f"{name}.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {out / name}.md")


if __name__ == "__main__":
  main()
