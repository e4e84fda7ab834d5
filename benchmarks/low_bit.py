"""Optimizer state at 16, 8 and 4 bits, and bfloat16 parameters with stochastic rounding.

Four measurements, each against float32 adam in the same run:

  bytes       adam's state bytes per parameter (codes and scales counted) on a model of large
              leaves: float32, mixed_precision(state_dtype=bfloat16), low_bit_state 8 and 4 bits
  memory      a jitted, donated step's compiled memory (compiled.memory_analysis(): arguments,
              outputs and temporaries), and the program `create` runs (its output and
              temporaries: a float32 detour would show as temporaries)
  time        the jitted, donated step against float32 adam's, compile-order balanced over
              shuffled rounds beside an A/A control (timing.py)
  loss        a small MLP trained on synthetic regression data for N steps: float32 adam,
              bfloat16 state, 8 bits, 4 bits, and bfloat16 parameters rounded to nearest and
              stochastically (no float32 master copy); the documentation plots the curves
              from low_bit.json

  python benchmarks/low_bit.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from timing import balanced_ratio, device_name, donated_runner

import optcore

RESULTS = Path(__file__).parent / "results"
BF16 = jnp.bfloat16
STATES = {
  "float32": lambda d: d,
  "bfloat16": lambda d: optcore.mixed_precision(d, state_dtype=BF16),
  "8-bit": lambda d: optcore.low_bit_state(d, bits=8),
  "4-bit": lambda d: optcore.low_bit_state(d, bits=4),
}


def large_params(total: int) -> dict[str, jax.Array]:
  """Leaves of 1024 columns (whole blocks at 8 and 4 bits), about ``total`` values."""
  rows = max(4, total // (8 * 1024))
  rng = np.random.default_rng(0)
  return {f"w{i}": jnp.asarray(rng.normal(size=(rows, 1024)).astype(np.float32)) for i in range(8)}


def state_bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def bytes_per_parameter(params) -> dict[str, float]:
  count = sum(x.size for x in jax.tree.leaves(params))
  out = {}
  for name, wrap in STATES.items():
    state = jax.eval_shape(wrap(optcore.adam(1e-3)).init_state, params).param_states
    out[name] = state_bytes(state) / count
  return out


def step_memory(params) -> dict[str, dict[str, int]]:
  """The compiled step's memory analysis: arguments, outputs, temporaries (bytes)."""
  out = {}
  grads = jax.tree.map(jnp.zeros_like, params)
  for name, wrap in STATES.items():
    opt = wrap(optcore.adam(1e-3)).create(params)
    step = jax.jit(lambda o, g: o.apply_gradient(g), donate_argnums=(0,))
    analysis = step.lower(opt, grads).compile().memory_analysis()
    out[name] = {
      "arguments": int(analysis.argument_size_in_bytes),
      "outputs": int(analysis.output_size_in_bytes),
      "temporaries": int(analysis.temp_size_in_bytes),
    }
  return out


def create_memory(params) -> dict[str, dict[str, int]]:
  """What ``create`` holds while it makes the state: the compiled program it runs (one program,
  constant folding off, as `create` runs it eagerly), its output and its temporaries (bytes)."""
  out = {}
  options = {"xla_disable_hlo_passes": "constant_folding"}
  for name, wrap in STATES.items():
    init = jax.jit(wrap(optcore.adam(1e-3)).init_state, compiler_options=options)
    analysis = init.lower(params).compile().memory_analysis()
    out[name] = {
      "outputs": int(analysis.output_size_in_bytes),
      "temporaries": int(analysis.temp_size_in_bytes),
    }
  return out


def runner(name: str, params, steps: int):
  opt_def = STATES["float32" if name == "control" else name](optcore.adam(1e-3))
  return donated_runner(opt_def, params, steps)


def step_time(params, rounds: int, steps: int) -> dict[str, list[float]]:
  build = lambda key: runner(key, params, steps)
  out = {}
  for name in ("bfloat16", "8-bit", "4-bit", "control"):
    result = balanced_ratio(build, "float32", name, rounds, steps)
    out[name] = result["ratio"]
  return out


TRAINED = {
  "float32 adam": (jnp.float32, lambda d: d),
  "bfloat16 state": (jnp.float32, STATES["bfloat16"]),
  "8-bit state": (jnp.float32, STATES["8-bit"]),
  "4-bit state": (jnp.float32, STATES["4-bit"]),
  "bfloat16 params, nearest": (BF16, lambda d: d),
  "bfloat16 params, stochastic": (BF16, lambda d: optcore.stochastic_rounding(d, seed=0)),
}


def mlp_params(key, dtype):
  sizes = [(64, 256), (256, 256), (256, 16)]
  keys = jax.random.split(key, len(sizes))
  return {
    f"layer{i}": {
      "w": (jax.random.normal(k, s) / np.sqrt(s[0])).astype(dtype),
      "b": jnp.zeros(s[1], dtype),
    }
    for i, (k, s) in enumerate(zip(keys, sizes, strict=True))
  }


def mlp(params, x):
  for i in range(3):
    layer = params[f"layer{i}"]
    x = x @ layer["w"].astype(jnp.float32) + layer["b"].astype(jnp.float32)[None]
    if i < 2:
      x = jax.nn.gelu(x)
  return x


def train(steps: int, lr: float = 1e-3) -> dict[str, list[float]]:
  """Each variant on the same synthetic regression (a fixed random MLP as the teacher)."""
  teacher = mlp_params(jax.random.key(99), jnp.float32)
  losses = {}
  for name, (dtype, wrap) in TRAINED.items():
    opt = wrap(optcore.adam(lr)).create(mlp_params(jax.random.key(0), dtype))

    @jax.jit
    def step(opt, key):
      x = jax.random.normal(key, (256, 64))
      loss_fn = lambda p: jnp.mean((mlp(p, x) - mlp(teacher, x)) ** 2)
      loss, grads = jax.value_and_grad(loss_fn)(opt.target)
      return opt.apply_gradient(grads), loss

    curve = []
    for i in range(steps):
      opt, loss = step(opt, jax.random.key(i))
      curve.append(float(loss))
    losses[name] = curve
    held_out = jax.random.normal(jax.random.key(10**6), (8192, 64))
    error = mlp(opt.target, held_out) - mlp(teacher, held_out)
    losses[name].append(float(jnp.mean(error**2)))  # the last entry: on held-out data
  return losses


def final(curve: list[float]) -> float:
  """The loss on 8192 held-out samples after training (the curve's last entry)."""
  return curve[-1]


def run(total: int, rounds: int, steps: int, train_steps: int) -> dict:
  params = large_params(total)
  losses = train(train_steps)
  return {
    "params": int(sum(x.size for x in jax.tree.leaves(params))),
    "bytes_per_parameter": bytes_per_parameter(params),
    "step_memory": step_memory(params),
    "create_memory": create_memory(params),
    "step_time": step_time(params, rounds, steps),
    "losses": losses,
  }


def report(result: dict, machine: str) -> str:
  mb = lambda b: f"{b / 2**20:.1f}"
  bpp, memory, create, times = (
    result["bytes_per_parameter"],
    result["step_memory"],
    result["create_memory"],
    result["step_time"],
  )
  lines = [
    f"adam's state at 32, 16, 8 and 4 bits ({machine}).",
    "",
    f"State bytes per parameter, a jitted donated step's compiled memory, and its time over "
    f"float32 adam's (median [quartiles], beside an A/A control of x{times['control'][0]:.3f} "
    f"[{times['control'][1]:.3f}-{times['control'][2]:.3f}]), at "
    f"{result['params'] / 1e6:.1f}M parameters in 8 leaves of 1024 columns:",
    "",
    "| state | bytes / parameter | step arguments (MB) | step temporaries (MB) | step time |",
    "|---|---|---|---|---|",
  ]
  for name in STATES:
    ratio = (
      "x1 (the baseline)"
      if name == "float32"
      else (f"x{times[name][0]:.3f} [{times[name][1]:.3f}-{times[name][2]:.3f}]")
    )
    lines.append(
      f"| {name} | {bpp[name]:.3f} | {mb(memory[name]['arguments'])} | "
      f"{mb(memory[name]['temporaries'])} | {ratio} |"
    )
  lines += [
    "",
    "`create`'s compiled program (what it runs eagerly): the state it returns and the "
    "temporaries it holds while making it. Before, it made the float32 state (the first "
    "row's output) and then rounded it down.",
    "",
    "| state | state made (MB) | temporaries (MB) |",
    "|---|---|---|",
  ]
  for name in STATES:
    lines.append(f"| {name} | {mb(create[name]['outputs'])} | {mb(create[name]['temporaries'])} |")
  losses = result["losses"]
  base, steps = final(losses["float32 adam"]), len(losses["float32 adam"]) - 1
  lines += [
    "",
    f"A 3-layer MLP (86k parameters) on synthetic regression, adam lr 1e-3, {steps} steps of "
    "256 samples: the loss on 8192 held-out samples after them (the curves: the page that "
    "includes this table).",
    "",
    "| run | final loss | over float32 adam |",
    "|---|---|---|",
  ]
  for name, curve in losses.items():
    lines.append(f"| {name} | {final(curve):.5f} | {final(curve) / base - 1:+.2%} |")
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=9)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--total", type=int, default=4_000_000, help="parameters timed")
  parser.add_argument("--out", default=str(RESULTS), help="where the reports go")
  args = parser.parse_args()
  total, train_steps = args.total, 600
  if args.quick:
    total, train_steps, args.rounds, args.steps = 65_536, 20, 2, 2
  device = jax.devices()[0]
  machine = f"{device_name(device)}, {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; optax {optax.__version__}")
  result = run(total, args.rounds, args.steps, train_steps)
  out = Path(args.out)
  out.mkdir(exist_ok=True)
  text = report(result, machine)
  print(text)
  (out / "low_bit.json").write_text(json.dumps({"device": machine, **result}, indent=2))
  (out / "low_bit.md").write_text(text)
  print(f"wrote {out / 'low_bit.md'}")


if __name__ == "__main__":
  main()
