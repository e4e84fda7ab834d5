"""Step time of optcore against raw optax, measured in the same run.

For each optimizer and model size the jitted update is timed for raw optax
(``tx.update`` + ``optax.apply_updates``) and for ``Optimizer.apply_gradient``
(with and without a traced learning-rate override, as a trainer calls it),
all with buffer donation, interleaved round by round in a shuffled order; the
reported ratio is the median over rounds of (optcore / raw optax), beside an
A/A control (a second raw optax run) that shows the noise floor and a control
that carries one extra int32 leaf, as optcore's step counter does. The compiled programs' bytes
accessed (XLA's cost analysis) are compared too: a noise-free check that
optcore adds no work to the step.

  python benchmarks/run.py                # adam at 1M and 32M parameters, 300 leaves
  python benchmarks/run.py --quick        # small sizes, for a smoke run
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optcore

RESULTS = Path(__file__).parent / "results"


def make_params(total: int, leaves: int, seed: int = 0) -> dict[str, jax.Array]:
  """``leaves`` float32 arrays of mixed sizes adding up to about ``total``."""
  weights = np.array([(i % 10) + 1 for i in range(leaves)], dtype=np.float64)
  sizes = np.maximum(1, np.round(weights / weights.sum() * total)).astype(int)
  rng = np.random.default_rng(seed)
  params = {}
  for i, size in enumerate(sizes):
    cols = 128 if size >= 1024 else 1
    rows = max(1, int(size) // cols)
    params[f"leaf_{i:03d}"] = jnp.asarray(rng.standard_normal((rows, cols), dtype=np.float32))
  return params


def raw_step(tx):
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return jax.jit(step, donate_argnums=(0, 1))


def raw_step_with_counter(tx):
  """Raw optax plus one int32 step counter: the one leaf optcore's state adds."""

  def step(params, state, count, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, count + 1

  return jax.jit(step, donate_argnums=(0, 1, 2))


def optcore_step(override: bool):
  if override:
    return jax.jit(
      lambda opt, grads, lr: opt.apply_gradient(grads, learning_rate=lr), donate_argnums=(0,)
    )
  return jax.jit(lambda opt, grads: opt.apply_gradient(grads), donate_argnums=(0,))


def compiled_costs(jitted, *args) -> tuple[float, float]:
  """XLA's bytes accessed and peak memory for one call of the compiled step."""
  compiled = jitted.lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  peak = compiled.memory_analysis().peak_memory_in_bytes
  return float(cost.get("bytes accessed", float("nan"))), float(peak)


def time_interleaved(runners: dict, rounds: int, steps: int) -> dict[str, list[float]]:
  """Seconds per step of each runner (one call runs ``steps`` steps), per round;
  rounds run every runner once, in a shuffled order, after one warm-up call."""
  for fn in runners.values():  # warm-up: compile and touch every buffer
    fn()
  times: dict[str, list[float]] = {k: [] for k in runners}
  shuffle = random.Random(0).shuffle
  for _ in range(rounds):
    order = list(runners)
    shuffle(order)  # no runner always goes first or always follows the same one
    for key in order:
      start = time.perf_counter()
      runners[key]()
      times[key].append((time.perf_counter() - start) / steps)
  return times


def median_ratio(times: dict, key: str, base: str = "raw") -> tuple[float, float, float]:
  """Median and quartiles over rounds of (key / base) in the same round."""
  ratios = [t / b for t, b in zip(times[key], times[base], strict=True)]
  q1, _, q3 = statistics.quantiles(ratios, n=4)
  return statistics.median(ratios), q1, q3


def bench_one(name: str, total: int, leaves: int, rounds: int, steps: int) -> dict:
  factory = getattr(optax, name)
  lr = 1e-3
  params = make_params(total, leaves)
  grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), params)
  n_params = sum(p.size for p in jax.tree.leaves(params))

  tx = factory(lr)
  raw = raw_step(tx)
  ours = optcore_step(override=False)
  ours_lr = optcore_step(override=True)
  lr_value = jnp.float32(lr)

  raw_state = [jax.tree.map(jnp.copy, params), tx.init(params)]
  # An A/A control: a second raw optax run, timed like the others. Its ratio
  # to the first is the noise floor of this machine in this run.
  control_state = [jax.tree.map(jnp.copy, params), tx.init(params)]
  # A second control: raw optax carrying one extra int32 counter leaf.
  raw_counter = raw_step_with_counter(tx)
  counter_state = [jax.tree.map(jnp.copy, params), tx.init(params), jnp.asarray(0, jnp.int32)]
  opt = getattr(optcore, name)(lr).create(jax.tree.map(jnp.copy, params))
  opt_lr = getattr(optcore, name)(lr).create(jax.tree.map(jnp.copy, params))
  costs = {
    "raw": compiled_costs(raw, *raw_state, grads),
    "optcore": compiled_costs(ours, opt, grads),
    "optcore_override": compiled_costs(ours_lr, opt_lr, grads, lr_value),
  }

  def raw_runner(holder: list):
    def run_raw():
      p, s = holder
      for _ in range(steps):
        p, s = raw(p, s, grads)
      jax.block_until_ready((p, s))  # wait on every output, as for optcore
      holder[:] = [p, s]

    return run_raw

  def run_counter():
    p, s, c = counter_state
    for _ in range(steps):
      p, s, c = raw_counter(p, s, c, grads)
    jax.block_until_ready((p, s, c))
    counter_state[:] = [p, s, c]

  holder = {"opt": opt, "opt_lr": opt_lr}

  def run_ours():
    o = holder["opt"]
    for _ in range(steps):
      o = ours(o, grads)
    jax.block_until_ready(o)
    holder["opt"] = o

  def run_ours_lr():
    o = holder["opt_lr"]
    for _ in range(steps):
      o = ours_lr(o, grads, lr_value)
    jax.block_until_ready(o)
    holder["opt_lr"] = o

  runners = {
    "raw": raw_runner(raw_state),
    "raw_control": raw_runner(control_state),
    "raw_plus_counter": run_counter,
    "optcore": run_ours,
    "optcore_override": run_ours_lr,
  }
  times = time_interleaved(runners, rounds, steps)
  ratio = lambda key: median_ratio(times, key)

  return {
    "optimizer": name,
    "params": int(n_params),
    "leaves": leaves,
    "rounds": rounds,
    "steps_per_round": steps,
    "raw_ms": 1e3 * statistics.median(times["raw"]),
    "optcore_ms": 1e3 * statistics.median(times["optcore"]),
    "optcore_override_ms": 1e3 * statistics.median(times["optcore_override"]),
    "ratio": ratio("optcore")[0],
    "ratio_quartiles": ratio("optcore")[1:],
    "ratio_override": ratio("optcore_override")[0],
    "control_ratio": ratio("raw_control")[0],
    "control_quartiles": ratio("raw_control")[1:],
    "counter_ratio": ratio("raw_plus_counter")[0],
    "ratio_override_quartiles": ratio("optcore_override")[1:],
    "bytes_ratio": costs["optcore"][0] / costs["raw"][0],
    "bytes_ratio_override": costs["optcore_override"][0] / costs["raw"][0],
    "peak_memory_bytes": {k: v[1] for k, v in costs.items()},
    "peak_memory_ratio": costs["optcore"][1] / costs["raw"][1],
  }


def bench_compile(leaves: int, rounds: int) -> dict:
  """Trace+compile time of a two-group step: MultiOptimizer against optax.partition."""
  params = make_params(leaves * 64, leaves)
  grads = jax.tree.map(jnp.ones_like, params)
  odd = lambda path: int(path.rsplit("_", 1)[-1]) % 2 == 1
  labels = {k: "odd" if odd(k) else "even" for k in params}
  tx = optax.partition({"odd": optax.adam(1e-3), "even": optax.sgd(1e-2)}, labels)
  multi = optcore.MultiOptimizer(
    (lambda path, _: odd(path), optcore.adam(1e-3)),
    (lambda path, _: not odd(path), optcore.sgd(1e-2)),
  )
  opt = multi.create(params)

  def raw_step(p, s, g):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  def ours_step(o, g):
    return o.apply_gradient(g)

  cases = (
    ("raw", raw_step, (params, tx.init(params), grads)),
    ("optcore", ours_step, (opt, grads)),
  )
  times: dict[str, list[float]] = {"raw": [], "optcore": []}
  for _ in range(rounds):
    for key, fn, args in cases:
      jax.clear_caches()  # so each round traces, lowers and compiles from scratch
      start = time.perf_counter()
      jax.jit(fn).lower(*args).compile()
      times[key].append(time.perf_counter() - start)
  ratios = [o / r for o, r in zip(times["optcore"], times["raw"], strict=True)]
  return {
    "leaves": leaves,
    "rounds": rounds,
    "raw_s": statistics.median(times["raw"]),
    "optcore_s": statistics.median(times["optcore"]),
    "ratio": statistics.median(ratios),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--optimizers", nargs="+", default=["adam"])
  parser.add_argument("--sizes", nargs="+", type=float, default=[1e6, 32e6])
  parser.add_argument("--leaves", type=int, default=300)
  parser.add_argument("--rounds", type=int, default=15)
  # Enough steps per round that the wait at its end (on ~900 buffers) and the
  # start of async dispatch are small against the steps themselves.
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--compile-leaves", type=int, default=1000)
  parser.add_argument("--quick", action="store_true", help="small sizes, few rounds")
  args = parser.parse_args()
  if args.quick:
    args.sizes, args.rounds, args.steps = [1e5, 1e6], 7, 20

  device = jax.devices()[0]
  machine = f"{device.device_kind} ({device.platform}), {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; optax {optax.__version__}; optcore {optcore.__version__}")
  results = []
  for name in args.optimizers:
    for size in args.sizes:
      row = bench_one(name, int(size), args.leaves, args.rounds, args.steps)
      results.append(row)
      print(
        f"{name:8s} {row['params'] / 1e6:6.1f}M params in {row['leaves']} leaves: "
        f"raw {row['raw_ms']:8.2f} ms | optcore x{row['ratio']:.3f} "
        f"[{row['ratio_quartiles'][0]:.3f}-{row['ratio_quartiles'][1]:.3f}] "
        f"(override x{row['ratio_override']:.3f}) | A/A control x{row['control_ratio']:.3f} "
        f"[{row['control_quartiles'][0]:.3f}-{row['control_quartiles'][1]:.3f}] | "
        f"optax+counter x{row['counter_ratio']:.3f} | "
        f"bytes accessed x{row['bytes_ratio']:.3f} | peak memory x{row['peak_memory_ratio']:.4f}"
      )

  compile_row = bench_compile(args.compile_leaves, rounds=5)
  print(
    f"trace+compile, {compile_row['leaves']} leaves, two groups: optax.partition "
    f"{compile_row['raw_s']:.2f} s | MultiOptimizer x{compile_row['ratio']:.3f}"
  )

  RESULTS.mkdir(exist_ok=True)
  report = {
    "device": machine,
    "optax": optax.__version__,
    "optcore": optcore.__version__,
    "results": results,
    "compile": compile_row,
  }
  (RESULTS / "step_time.json").write_text(json.dumps(report, indent=2))
  lines = [
    f"Jitted step time, optcore against raw optax in the same run ({machine}).",
    "",
    "| optimizer | params | leaves | raw optax (ms) | optcore / optax [quartiles] "
    "| with lr override | optax / optax (A/A noise floor) | optax + one int32 leaf / optax "
    "| bytes accessed ratio | peak memory ratio |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in results:
    lines.append(
      f"| {r['optimizer']} | {r['params'] / 1e6:.1f}M | {r['leaves']} | {r['raw_ms']:.2f} | "
      f"{r['ratio']:.3f} [{r['ratio_quartiles'][0]:.3f}-{r['ratio_quartiles'][1]:.3f}] | "
      f"{r['ratio_override']:.3f} | {r['control_ratio']:.3f} "
      f"[{r['control_quartiles'][0]:.3f}-{r['control_quartiles'][1]:.3f}] | "
      f"{r['counter_ratio']:.3f} | {r['bytes_ratio']:.3f} | {r['peak_memory_ratio']:.4f} |"
    )
  lines += [
    "",
    f"Trace+compile of a {compile_row['leaves']}-leaf two-group step (adam + sgd), median of "
    f"{compile_row['rounds']}: optax.partition {compile_row['raw_s']:.2f} s, MultiOptimizer "
    f"{compile_row['optcore_s']:.2f} s, ratio {compile_row['ratio']:.3f}.",
  ]
  (RESULTS / "step_time.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {RESULTS / 'step_time.md'} and {RESULTS / 'step_time.json'}")


if __name__ == "__main__":
  main()
