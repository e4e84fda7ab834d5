"""optcore.grouped against raw optax: full jitted train steps (forward, backward, update).

Four rows: a deep MLP of 300 small leaves (~1M parameters; batch 1, where per-leaf
dispatch dominates, and batch 64), a 12-layer d=512 transformer tree (large matrices, small
norms and biases) and 10 leaves of 3.2M (nothing grouped). Each step is
adam, jitted with donation, fed a fresh batch per step. Reported per model:
the median over shuffled rounds of the per-round step-time ratio against raw
optax per leaf, compile-order balanced (see timing.py), with quartiles; an
A/A control (raw against a separately compiled raw); the trace+compile time
ratio; and the number of fusions in each compiled step.

On the MLP at batch 1, four more variants: ``the update alone`` (grouped's
update against raw optax's, given the gradients: what the prototype of issue
31 measured), ``one buffer`` (``max_buffer_size`` unbounded: the update then
waits for the whole backward pass), ``grad of packed`` (the gradient taken through
``packed_target.unpack()``, which is the per-leaf gradients concatenated),
and ``split back`` (the parameters per leaf and only the state grouped: what
a face that owns its parameters, Equinox's or Treex's, could do).

  python benchmarks/grouped.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import re
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from timing import balanced_ratio, quantiles

import optcore

RESULTS = Path(__file__).parent / "results"
LEARNING_RATE = 1e-3


def mlp(depth: int = 150, width: int = 80, batch_size: int = 1):
  rng = np.random.default_rng(0)
  params = {
    f"layer_{i:03d}": {
      "w": jnp.asarray(rng.standard_normal((width, width), np.float32) / math.sqrt(width)),
      "b": jnp.zeros(width, jnp.float32),
    }
    for i in range(depth)
  }

  def loss(params, x):
    for layer in params.values():
      x = jnp.tanh(x @ layer["w"] + layer["b"][None, :])
    return jnp.mean(x**2)

  batch = lambda i: jax.random.normal(jax.random.key(i), (batch_size, width))
  return params, loss, batch


def transformer(layers: int = 12, d: int = 512, vocab: int = 1024, seq: int = 32):
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32) / math.sqrt(shape[0]))
  block = lambda: {
    "ln1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
    "attn": {"q": normal(d, d), "k": normal(d, d), "v": normal(d, d), "o": normal(d, d)},
    "ln2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
    "mlp": {
      "w1": normal(d, 4 * d),
      "b1": jnp.zeros(4 * d),
      "w2": normal(4 * d, d),
      "b2": jnp.zeros(d),
    },
  }
  params = {"embed": normal(vocab, d), "blocks": [block() for _ in range(layers)]}

  def norm(x, p):
    x = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-6)
    return x * p["scale"] + p["bias"]

  def loss(params, tokens):
    x = params["embed"][tokens]
    for p in params["blocks"]:
      h = norm(x, p["ln1"])
      a = p["attn"]
      q, k, v = h @ a["q"], h @ a["k"], h @ a["v"]
      weights = jax.nn.softmax(q @ jnp.swapaxes(k, -1, -2) / math.sqrt(d), axis=-1)
      x = x + (weights @ v) @ a["o"]
      h = norm(x, p["ln2"])
      m = p["mlp"]
      x = x + jax.nn.gelu(h @ m["w1"] + m["b1"]) @ m["w2"] + m["b2"]
    logits = x @ params["embed"].T
    return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  batch = lambda i: jax.random.randint(jax.random.key(i), (4, seq), 0, vocab)
  return params, loss, batch


def large_leaves(count: int = 10, size: int = 3_200_000):
  rng = np.random.default_rng(0)
  params = {
    f"leaf_{i}": jnp.asarray(rng.standard_normal((size // 1600, 1600), np.float32))
    for i in range(count)
  }

  def loss(params, x):
    return sum(jnp.mean((w * x) ** 2) for w in params.values())

  batch = lambda i: jnp.asarray(1.0 + 0.01 * i, jnp.float32)
  return params, loss, batch


MODELS = {
  "mlp": mlp,
  "mlp, batch 64": lambda **sizes: mlp(**{"batch_size": 64, **sizes}),
  "transformer": transformer,
  "large": large_leaves,
}


def step_functions(loss, max_leaf_size: int) -> dict:
  """Per variant: (make_state(params), step(state, x) -> state), un-jitted."""
  tx = optax.adam(LEARNING_RATE)
  opt_def = optcore.grouped(optcore.adam(LEARNING_RATE), max_leaf_size=max_leaf_size)

  def raw_step(carry, x):
    params, state = carry
    updates, state = tx.update(jax.grad(loss)(params, x), state, params)
    return optax.apply_updates(params, updates), state

  def grouped_step(opt, x):
    return opt.apply_gradient(jax.grad(loss)(opt.target, x))

  def packed_step(opt, x):
    grads = jax.grad(lambda packed: loss(packed.unpack(), x))(opt.packed_target)
    return opt.apply_gradient(grads)

  one_buffer = optcore.grouped(
    optcore.adam(LEARNING_RATE), max_leaf_size=max_leaf_size, max_buffer_size=2**62
  )

  def split_back_step(carry, x):
    params, state = carry
    grads = jax.grad(loss)(params, x)
    return optcore.adapter.step(opt_def, params, state, grads)

  def raw_update(carry, grads):
    params, state = carry
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  def grouped_update(opt, grads):
    return opt.apply_gradient(grads)

  return {
    "raw_update": (lambda p: (p, tx.init(p)), raw_update),
    "grouped_update": (opt_def.create, grouped_update),
    "raw": (lambda p: (p, tx.init(p)), raw_step),
    "raw_control": (lambda p: (p, tx.init(p)), raw_step),
    "grouped": (opt_def.create, grouped_step),
    "grouped_packed_grad": (opt_def.create, packed_step),
    "grouped_one_buffer": (one_buffer.create, grouped_step),
    "split_back": (lambda p: (p, opt_def.init_state(p)), split_back_step),
  }


def fusions(jitted, *args) -> int:
  """The number of fusion instructions in the compiled step."""
  text = jitted.lower(*args).compile().as_text()
  return len(re.findall(r"= [^=]*\bfusion\(", text))


def compile_seconds(make, step, params, x, repeats: int) -> list[float]:
  out = []
  for _ in range(repeats):
    state = make(params)
    fn = jax.jit(lambda s, x: step(s, x))  # a new function: nothing cached
    start = time.perf_counter()
    fn.lower(state, x).compile()
    out.append(time.perf_counter() - start)
  return out


def bench(
  model: str, variants: list[str], rounds: int, steps: int, max_leaf_size: int, **sizes: int
) -> dict:
  params, loss, batch = MODELS[model](**sizes)
  leaves = jax.tree.leaves(params)
  functions = step_functions(loss, max_leaf_size)
  xs = [batch(i) for i in range(steps)]
  # The update-only variants take gradients in place of batches.
  grads = [
    jax.tree.map(lambda p, i=i: jnp.full_like(p, 1e-3 * (i + 1)), params) for i in range(steps)
  ]

  def build(key: str):
    make, step = functions[key]
    jitted = jax.jit(step, donate_argnums=(0,))
    holder = [make(jax.tree.map(jnp.copy, params))]

    inputs = grads if key.endswith("_update") else xs

    def run():
      state = holder[0]
      for x in inputs:
        state = jitted(state, x)
      jax.block_until_ready(state)
      holder[0] = state

    return run

  row = {
    "model": model,
    "params": sum(x.size for x in leaves),
    "leaves": len(leaves),
    "grouped_leaves": sum(x.size < max_leaf_size for x in leaves),
  }
  control = balanced_ratio(build, "raw", "raw_control", rounds, steps)
  row["control"] = control["ratio"]
  row["raw_ms"] = statistics.median(control["base_times"]) * 1e3
  base_of = lambda key: "raw_update" if key.endswith("_update") else "raw"
  for key in variants:
    row[key] = balanced_ratio(build, base_of(key), key, rounds, steps)["ratio"]
  row["fusions"] = {}
  for key in {"raw", *map(base_of, variants), *variants}:
    make, step = functions[key]
    arg = grads[0] if key.endswith("_update") else xs[0]
    row["fusions"][key] = fusions(jax.jit(step), make(params), arg)
  # Trace+compile, alternating which goes first.
  raw_s, grouped_s = [], []
  for i in range(3):
    order = ("raw", "grouped") if i % 2 == 0 else ("grouped", "raw")
    for key in order:
      make, step = functions[key]
      (raw_s if key == "raw" else grouped_s).extend(compile_seconds(make, step, params, xs[0], 1))
  row["raw_compile_s"] = statistics.median(raw_s)
  row["compile"] = quantiles([g / r for g, r in zip(grouped_s, raw_s, strict=True)])
  return row


def fmt(q) -> str:
  return f"{q[0]:.3f} [{q[1]:.3f}, {q[2]:.3f}]"


LABELS = {
  "grouped_update": "grouped, the update alone",
  "grouped": "grouped",
  "grouped_one_buffer": "grouped, one buffer",
  "grouped_packed_grad": "grouped, grad of packed",
  "split_back": "split back (params per leaf)",
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--max-leaf-size", type=int, default=65536)
  args, _ = parser.parse_known_args()  # nox -s bench passes the same arguments to every script
  rounds = 3 if args.quick else args.rounds
  device = jax.devices()[0]
  machine = f"{device.device_kind}, {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; optax {optax.__version__}; optcore {optcore.__version__}", flush=True)
  plan = [
    (
      "mlp",
      ["grouped", "grouped_update", "grouped_one_buffer", "grouped_packed_grad", "split_back"],
      20,
    ),
    ("mlp, batch 64", ["grouped"], 10),
    ("transformer", ["grouped"], 2),
    ("large", ["grouped"], 4),
  ]
  rows = []
  for model, variants, steps in plan:
    row = bench(model, variants, rounds, steps, args.max_leaf_size)
    rows.append(row)
    ratios = " | ".join(f"{LABELS[v]} x{fmt(row[v])}" for v in variants)
    print(
      f"{model}: {row['params'] / 1e6:.1f}M in {row['leaves']} leaves "
      f"({row['grouped_leaves']} grouped), raw {row['raw_ms']:.2f} ms | {ratios} "
      f"| A/A x{fmt(row['control'])} | compile x{fmt(row['compile'])} "
      f"| fusions {row['fusions']}",
      flush=True,
    )
  RESULTS.mkdir(exist_ok=True)
  report = {"device": machine, "rounds": rounds, "max_leaf_size": args.max_leaf_size, "rows": rows}
  (RESULTS / "grouped.json").write_text(json.dumps(report, indent=2))
  lines = [
    f"`optcore.grouped(optcore.adam(1e-3), max_leaf_size={args.max_leaf_size})` (buffers of at "
    f"most 262144 elements) against raw "
    f"optax adam per leaf: full jitted train steps (forward, backward, update), measured in one "
    f"run on {device.device_kind} (jax {jax.__version__}); medians of per-round ratios over "
    f"{rounds} shuffled rounds [quartiles], compile-order balanced. Below 1 is faster.",
    "",
    "| model | params (leaves, grouped) | raw step (ms) | variant | step time ratio "
    "| A/A control | trace+compile ratio | fusions raw / variant |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in rows:
    for i, key in enumerate(k for k in LABELS if k in r):
      head = (
        f"| {r['model']} | {r['params'] / 1e6:.2f}M ({r['leaves']}, {r['grouped_leaves']}) "
        f"| {r['raw_ms']:.2f} "
        if i == 0
        else "| | | "
      )
      compile_ratio = fmt(r["compile"]) if key == "grouped" else ""
      control = fmt(r["control"]) if i == 0 else ""
      base = "raw_update" if key.endswith("_update") else "raw"
      lines.append(
        f"{head}| {LABELS[key]} | {fmt(r[key])} | {control} | {compile_ratio} "
        f"| {r['fusions'][base]} / {r['fusions'][key]} |"
      )
  (RESULTS / "grouped.md").write_text("\n".join(lines) + "\n")
  print(f"wrote {RESULTS / 'grouped.md'} and {RESULTS / 'grouped.json'}")


if __name__ == "__main__":
  main()
