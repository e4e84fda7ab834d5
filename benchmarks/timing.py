"""Timing helpers shared by the benchmarks.

Every ratio is measured in the same run as its baseline: runners are timed
round by round in a shuffled order after a warm-up, and the reported figure is
the median of per-round ratios with its quartiles.

**Compile order.** On XLA's CPU backend, separately compiled copies of the
*same* program do not run equally fast: in a group of executables built one
after another, the first one built runs fastest and each later one slower
(about x1.05 to x1.15 for a dispatch-bound 300-leaf adam step on a 2-core
Xeon; it fades when the buffers are large). A raw-optax baseline that is
always compiled first therefore looks faster than anything compared with it,
and an A/A control that reuses the baseline's executable cannot see it.
``balanced_ratio`` removes this: it measures every comparison twice, in fresh
executables compiled in both orders, and combines the two per round by their
geometric mean, which cancels a multiplicative order effect exactly.
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

Runner = Callable[[], None]


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


def transformer_params(total: int, seed: int = 0) -> dict[str, jax.Array]:
  """A transformer's shapes at about ``total`` float32 values: 10 matrices of 256 columns and
  300 small leaves of 1 to 1,200 values (biases, norms, heads; sizes spaced geometrically)."""
  small = np.round(np.geomspace(1, 1200, 300)).astype(int)
  if total < 4 * small.sum():
    small = np.maximum(1, small * total // (4 * small.sum()))
  rows = max(1, int(total - small.sum()) // (10 * 256))
  rng = np.random.default_rng(seed)
  params = {
    f"matrix_{i}": jnp.asarray(rng.standard_normal((rows, 256), dtype=np.float32))
    for i in range(10)
  }
  for i, size in enumerate(small):
    params[f"small_{i:03d}"] = jnp.asarray(rng.standard_normal(int(size), dtype=np.float32))
  return params


def huge_params(total: int, leaves: int, seed: int = 0) -> dict[str, jax.Array]:
  """``leaves`` square float32 matrices adding up to about ``total`` values."""
  side = max(1, math.isqrt(total // leaves))
  rng = np.random.default_rng(seed)
  return {
    f"huge_{i}": jnp.asarray(rng.standard_normal((side, side), dtype=np.float32))
    for i in range(leaves)
  }


def version_suffix() -> str:
  """This stack's jax version for a result file's name: ``'0_12_0_1'``."""
  return jax.__version__.replace(".", "_")


def raw_step(tx: optax.GradientTransformation):
  """A fresh jitted, donated raw-optax step: ``tx.update`` + ``optax.apply_updates``."""

  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  return jax.jit(step, donate_argnums=(0, 1))


def core_step():
  """A fresh jitted, donated optcore step: ``Optimizer.apply_gradient``."""
  return jax.jit(lambda opt, grads: opt.apply_gradient(grads), donate_argnums=(0,))


def donated_runner(opt_def, params: dict, steps: int) -> Callable[[], None]:
  """A timed run for `balanced_ratio`: each call takes ``steps`` `core_step`s of an optimizer
  of ``opt_def`` (made once, on its own copy of ``params``: the step donates it) on gradients
  of 1e-3, and continues from where the last call left it."""
  opt = opt_def.create(jax.tree.map(jnp.copy, params))
  grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), params)
  step = core_step()
  holder = [opt]

  def run() -> None:
    (opt,) = holder
    for _ in range(steps):
      opt = step(opt, grads)
    jax.block_until_ready(opt)
    holder[:] = [opt]

  return run


def compiled_costs(jitted, *args) -> tuple[float, float]:
  """XLA's bytes accessed and peak memory for one call of the compiled step."""
  compiled = jitted.lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  peak = compiled.memory_analysis().peak_memory_in_bytes
  return float(cost.get("bytes accessed", float("nan"))), float(peak)


def time_interleaved(
  runners: dict[str, Runner],
  rounds: int,
  steps: int,
  *,
  clock: Callable[[], float] = time.perf_counter,
  seed: int = 0,
) -> dict[str, list[float]]:
  """Seconds per step of each runner (one call runs ``steps`` steps), per round.

  The warm-up calls every runner once in the dict's order (so that is the order
  in which jitted runners compile); each round then runs every runner once, in a
  shuffled order, so no runner always goes first or always follows the same one.
  """
  for fn in runners.values():
    fn()
  times: dict[str, list[float]] = {k: [] for k in runners}
  shuffle = random.Random(seed).shuffle
  for _ in range(rounds):
    order = list(runners)
    shuffle(order)
    for key in order:
      start = clock()
      runners[key]()
      times[key].append((clock() - start) / steps)
  return times


def quantiles(values: list[float]) -> tuple[float, float, float]:
  """Median and quartiles."""
  q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
  return statistics.median(values), q1, q3


def median_ratio(times: dict, key: str, base: str = "raw") -> tuple[float, float, float]:
  """Median and quartiles over rounds of (key / base) in the same round."""
  return quantiles([t / b for t, b in zip(times[key], times[base], strict=True)])


def balanced_ratio(
  build: Callable[[str], Runner],
  base: str,
  face: str,
  rounds: int,
  steps: int,
  *,
  clock: Callable[[], float] = time.perf_counter,
) -> dict:
  """``face`` against ``base``, with the compile-order bias cancelled.

  ``build(key)`` must return a *fresh* runner (new jitted functions, new
  buffers, nothing compiled yet). The comparison runs twice: built and warmed
  up as (base, face), then as (face, base), each time ``rounds`` interleaved
  rounds. Round i's balanced ratio is the geometric mean of the two orders'
  round-i ratios. Returns their median and quartiles (``ratio``), the ratio of
  each order alone (``base_first``, ``face_first``: their spread is the size of
  the order effect) and every per-step time of ``base`` (``base_times``).
  """
  per_order = {}
  base_times: list[float] = []
  for order in ((base, face), (face, base)):
    gc.collect()  # drop the previous group's executables before building this one
    runners = {key: build(key) for key in order}
    times = time_interleaved(runners, rounds, steps, clock=clock)
    per_order[order[0]] = [f / b for f, b in zip(times[face], times[base], strict=True)]
    base_times += times[base]
    del runners
  combined = [math.sqrt(a * b) for a, b in zip(per_order[base], per_order[face], strict=True)]
  return {
    "ratio": quantiles(combined),
    "base_first": statistics.median(per_order[base]),
    "face_first": statistics.median(per_order[face]),
    "base_times": base_times,
  }


def device_name(device: jax.Device) -> str:
  """``'NVIDIA H100 80GB HBM3 (gpu)'``; just ``'cpu'`` where the kind is the platform."""
  kind = device.device_kind
  return kind if kind == device.platform else f"{kind} ({device.platform})"
