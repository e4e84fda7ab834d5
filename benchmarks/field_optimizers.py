"""MARS, NorMuon, Dion, cautious AdamW, ZClip, PSGD Kron, AdamH, MuonH and μP's AdamW beside
AdamW and Muon on the small transformer of matrix_optimizers.py (stacked layers, logical axes).

Three measurements:

  bytes   state bytes per parameter of each, on that model
  time    each jitted, donated step against optcore's AdamW in the same run, compile-order
          balanced beside an A/A control (timing.py)
  loss    N steps of each on synthetic token sequences from a fixed random Markov chain (the
          same data as matrix_optimizers.py): the held-out loss after them and the curves

  python benchmarks/field_optimizers.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import jax
import matrix_optimizers
import optax
from matrix_optimizers import SIZES, band, parameter_count
from timing import device_name

import optcore

RESULTS = Path(__file__).parent / "results"

# Each at the settings its authors publish for small language models, AdamW's where they
# share one (rate 3e-3, b2 0.95, decay 0.01).
OPTIMIZERS = {
  "adamw": lambda axes: optcore.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.01),
  "muon": lambda axes: optcore.contrib.muon(
    0.02, adam_learning_rate=3e-3, adam_b2=0.95, param_logical_axes=axes
  ),
  # MARS' GPT-2 setting (its README): AdamW for the 1-D leaves at the same rate
  "mars": lambda axes: optcore.contrib.mars(
    3e-3, b1=0.95, b2=0.99, gamma=0.025, weight_decay=0.01, lr_1d=3e-3, weight_decay_1d=0.01
  ),
  "normuon": lambda axes: optcore.contrib.normuon(
    0.02, adam_learning_rate=3e-3, adam_b2=0.95, param_logical_axes=axes
  ),
  # Dion's 160M setting (configs/dion_160m.yaml): rate 0.02, rank fraction 0.5, AdamW for
  # the rest at the same rate, as one group of the reference
  "dion": lambda axes: optcore.contrib.dion(
    0.02, mu=0.95, weight_decay=0.01, rank_fraction=0.5, param_logical_axes=axes
  ),
  "cautious_adamw": lambda axes: optcore.cautious(
    optcore.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.01)
  ),
  "zclip_adamw": lambda axes: optcore.zclip(
    optcore.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.01)
  ),
  # PSGD Kron at its authors' defaults (rate 1e-3), the stacked layers read from the axes
  "kron": lambda axes: optcore.contrib.kron(1e-3, weight_decay=0.01, param_logical_axes=axes),
  # levanter's hyperball configurations: the layers' matrices on the sphere, AdamW for the
  # embedding, the norms and the head
  "adamh": lambda axes: _hyperball(optcore.contrib.adamh(0.02)),
  "muonh": lambda axes: _hyperball(optcore.contrib.muonh(learning_rate=0.02)),
  # μP's rates from the widths (base half the model's), AdamW's step per parameter group
  "mup_adamw": lambda axes: optcore.mup(
    optcore.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.01),
    {"embed": 64, "mlp": 256},
    param_logical_axes=axes,
  ),
}


def _hyperball(matrices: optcore.OptimizerDef) -> optcore.MultiOptimizer:
  rest = optcore.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.01)
  return optcore.MultiOptimizer(
    (r"layers/(query|key|value|out|wi|wo)", matrices),
    (r"embedding|final_norm|head|layers/norm.", rest),
  )


def state_bytes_per_parameter(size: dict) -> dict[str, float]:
  return matrix_optimizers.state_bytes_per_parameter(size, OPTIMIZERS)


def step_time(size: dict, rounds: int, steps: int, names: tuple[str, ...] | None = None) -> dict:
  """Each optimizer's ratio over AdamW (median, quartiles), the A/A control's, AdamW in ms;
  ``names``: the optimizers timed (None: all)."""
  names = names or tuple(n for n in OPTIMIZERS if n != "adamw")
  return matrix_optimizers.step_time(size, rounds, steps, names, OPTIMIZERS)


def train(steps: int, size: dict) -> dict:
  """matrix_optimizers.train's loop and data, with this file's optimizers."""
  return matrix_optimizers.train(steps, size, optimizers=OPTIMIZERS)


def report(result: dict, machine: str) -> str:
  times, loss = result["step_time"], result["loss"]
  lines = [
    f"MARS, NorMuon, Dion, cautious AdamW, ZClip, PSGD Kron, AdamH, MuonH and μP's AdamW beside "
    f"AdamW and Muon ({machine}), on the "
    f"{result['params']:,}-parameter transformer of matrix_optimizers.py.",
    "",
    f"Step time over AdamW's ({times['adamw_ms']:.2f} ms), median [quartiles] of "
    f"compile-order balanced rounds; A/A control {band(times['control'])}. The loss: "
    f"{result['train_steps']} steps, held out (the chain's entropy rate, the best reachable, "
    f"is {loss['entropy']:.3f}).",
    "",
    "| optimizer | state bytes / parameter | step time | held-out loss |",
    "|---|---|---|---|",
  ]
  for name in OPTIMIZERS:
    time = "x1 (the baseline)" if name == "adamw" else band(times[name])
    lines.append(
      f"| {name} | {result['bytes_per_parameter'][name]:.2f} | {time} | "
      f"{loss['runs'][name]['held_out']:.4f} |"
    )
  return "\n".join(lines) + "\n"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--train-steps", type=int, default=600)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--out", default=str(RESULTS), help="where the reports go")
  args = parser.parse_args()
  size = SIZES["quick" if args.quick else "full"]
  if args.quick:
    args.rounds, args.steps, args.train_steps = 2, 2, 30
  device = jax.devices()[0]
  machine = f"{device_name(device)}, {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; optax {optax.__version__}")
  result = {
    "size": size,
    "params": parameter_count(size),
    "bytes_per_parameter": state_bytes_per_parameter(size),
    "step_time": step_time(size, args.rounds, args.steps),
    "train_steps": args.train_steps,
    "loss": train(args.train_steps, size),
  }
  text = report(result, machine)
  print(text)
  out = Path(args.out)
  out.mkdir(exist_ok=True)
  (out / "field_optimizers.json").write_text(json.dumps({"device": machine, **result}, indent=2))
  (out / "field_optimizers.md").write_text(text)
  print(f"wrote {out / 'field_optimizers.md'}")


if __name__ == "__main__":
  main()
