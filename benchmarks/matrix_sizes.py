"""SOAP's and Shampoo's step time over AdamW's at three model sizes, split into the
preconditioner refresh and the rest (issue 52: the overhead should fall with size, as their
papers report).

For each size of matrix_optimizers.py's transformer, each optimizer runs twice, each against
optcore's AdamW in the same run, compile-order balanced beside an A/A control (timing.py):

  rest      the refresh never comes (its frequency beyond the timed steps): the step's own work
  always    a refresh every step (frequency 1): the rest plus one refresh

One refresh costs ``always - rest`` AdamW steps, and the step at the authors' frequency (every
10 steps) costs ``rest + (always - rest) / 10``. The gradient of the benchmark's batch (32
sequences of 64 tokens, forward and backward, jitted) is timed against the same AdamW step,
so the overhead over a whole training step, ``(every 10 - 1) / (gradient + 1)``, can be read:
the papers' "overhead falls with size" is of that, since an optimizer step grows with the
parameters (and SOAP's and Shampoo's products with the matrices' widths) while the gradient
also grows with the tokens of a batch.

  python benchmarks/matrix_sizes.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from matrix_optimizers import (
  SHAMPOO,
  band,
  forward,
  init_params,
  markov_chain,
  model_shapes,
  parameter_count,
  sample,
)
from timing import balanced_ratio, device_name, donated_runner

import optcore

RESULTS = Path(__file__).parent / "results"
NEVER = 10**9  # a refresh frequency no timed run reaches
FREQUENCY = 10  # the authors' default for both

#: The transformer's sizes: matrix_optimizers.py's (embed 128) and two around it.
SIZES = {
  "small": {"vocab": 256, "embed": 64, "mlp": 256, "layers": 2},
  "base": {"vocab": 256, "embed": 128, "mlp": 512, "layers": 2},
  "large": {"vocab": 256, "embed": 256, "mlp": 1024, "layers": 2},
}
QUICK = {"tiny": {"vocab": 32, "embed": 16, "mlp": 32, "layers": 2}}
#: The batch a gradient is timed on: matrix_optimizers.py's (sequences, tokens, heads).
BATCH, LENGTH, HEADS = 32, 64, 4


def gradient_runner(model: dict, params: dict, steps: int):
  """A timed run of ``steps`` jitted gradients of the language-model loss on one batch."""
  chain = jnp.asarray(markov_chain(model["vocab"]))
  tokens = sample(chain, jax.random.key(0), BATCH, LENGTH)
  heads = HEADS if model["embed"] % HEADS == 0 else 1

  def loss(params):
    logits = forward(params, tokens[:, :-1], heads)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  grad = jax.jit(jax.grad(loss))

  def run() -> None:
    for _ in range(steps):
      out = grad(params)
    jax.block_until_ready(out)

  return run


def definitions(axes) -> dict:
  """AdamW and each optimizer at each refresh frequency."""
  soap = lambda every: optcore.contrib.soap(
    3e-3, precondition_frequency=every, param_logical_axes=axes
  )
  shampoo_settings = {k: v for k, v in SHAMPOO.items() if k != "preconditioning_compute_steps"}
  shampoo = lambda every: optcore.contrib.shampoo(
    **shampoo_settings, preconditioning_compute_steps=every, param_logical_axes=axes
  )
  return {
    "adamw": optcore.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.01),
    "control": optcore.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.01),
    "soap/rest": soap(NEVER),
    "soap/always": soap(1),
    "shampoo/rest": shampoo(NEVER),
    "shampoo/always": shampoo(1),
  }


def measure(model: dict, rounds: int, steps: int) -> dict:
  """Each run's ratio over AdamW (median, quartiles), and the derived split."""
  shapes, axes = model_shapes(**model)
  params = init_params(shapes, jax.random.key(0))
  defs = definitions(axes)

  def build(key):
    if key == "gradient":
      return gradient_runner(model, params, steps)
    return donated_runner(defs[key], params, steps)

  row = {"params": parameter_count({"model": model})}
  keys = ("soap/rest", "soap/always", "shampoo/rest", "shampoo/always", "gradient", "control")
  for key in keys:
    row[key] = balanced_ratio(build, "adamw", key, rounds, steps)["ratio"]
  gradient = row["gradient"][0]
  for name in ("soap", "shampoo"):
    rest, always = row[f"{name}/rest"][0], row[f"{name}/always"][0]
    row[f"{name}/refresh"] = always - rest
    row[f"{name}/at_frequency"] = rest + (always - rest) / FREQUENCY
    row[f"{name}/over_training_step"] = (row[f"{name}/at_frequency"] - 1) / (gradient + 1)
  return row


def report(rows: dict, machine: str) -> str:
  lines = [
    f"SOAP and Shampoo over AdamW at three sizes of matrix_optimizers.py's transformer "
    f"({machine}); median [quartiles] of compile-order balanced rounds. 'rest': no refresh; "
    f"'refresh': one refresh, in AdamW steps; 'every {FREQUENCY}': the step at the authors' "
    f"frequency; 'gradient': the batch's forward and backward ({BATCH} x {LENGTH} tokens); "
    "'+ training step': what the optimizer adds to a training step with AdamW (gradient and "
    "step).",
    "",
    "| size | params | optimizer | rest | refresh | every 10 | gradient | + training step "
    "| A/A control |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for size, row in rows.items():
    for name in ("soap", "shampoo"):
      lines.append(
        f"| {size} | {row['params']:,} | {name} | {band(row[f'{name}/rest'])} | "
        f"x{row[f'{name}/refresh']:.1f} | x{row[f'{name}/at_frequency']:.2f} | "
        f"x{row['gradient'][0]:.1f} | {100 * row[f'{name}/over_training_step']:+.0f}% | "
        f"{band(row['control'])} |"
      )
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--out", default=str(RESULTS), help="where the reports go")
  args = parser.parse_args()
  sizes = QUICK if args.quick else SIZES
  if args.quick:
    args.rounds, args.steps = 2, 2
  device = jax.devices()[0]
  machine = f"{device_name(device)}, {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; optax {optax.__version__}")
  rows = {}
  for size, model in sizes.items():
    rows[size] = measure(model, args.rounds, args.steps)
    print(size, {k: v for k, v in rows[size].items() if "/" in k and "control" not in k})
  text = report(rows, machine)
  print(text)
  out = Path(args.out)
  out.mkdir(exist_ok=True)
  (out / "matrix_sizes.json").write_text(json.dumps({"device": machine, "rows": rows}, indent=2))
  (out / "matrix_sizes.md").write_text(text)
  print(f"wrote {out / 'matrix_sizes.md'}")


if __name__ == "__main__":
  main()
