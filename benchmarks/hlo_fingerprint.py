"""The compiled step of plain optimizers, as a fingerprint to compare across commits.

A refactor of the wrapper layer should not change what a plain (unwrapped) optimizer compiles
to. This prints, for each case, a hash of the optimized HLO of the jitted
``opt.apply_gradient(grads, learning_rate=lr)`` on 16 leaves, with source-location metadata,
XLA's stack-frame tables and the module's name stripped (they name files and lines, not
computation). Run it on two checkouts and compare the lines:

    python benchmarks/hlo_fingerprint.py > after.txt
    git worktree add /tmp/before <commit> && \\
      PYTHONPATH=/tmp/before/packages/core/src python benchmarks/hlo_fingerprint.py > before.txt
    diff before.txt after.txt

``--dump DIR`` also writes each case's stripped HLO text, to read a difference.
"""

from __future__ import annotations

import argparse
import hashlib
import re
from pathlib import Path

import jax
import jax.numpy as jnp

import optcore
from optcore import legacy


def params() -> dict:
  key = jax.random.key(0)
  shapes = [(64, 32), (32,), (32, 16), (16,)] * 4
  return {
    f"p{i:02d}": jax.random.normal(jax.random.fold_in(key, i), shape)
    for i, shape in enumerate(shapes)
  }


def cases() -> dict:
  return {
    "adam": optcore.adam(1e-3),
    "legacy.Adam": legacy.Adam(1e-3),
    "multi(adamw, legacy.Momentum)": optcore.MultiOptimizer(
      (r"p0[0-7]", optcore.adamw(1e-3)), (r"p(0[89]|1)", legacy.Momentum(1e-3))
    ),
    "t5x.Adafactor": optcore.t5x.Adafactor(1e-3),
    "accumulate(adam)": optcore.accumulate(optcore.adam(1e-3), every=2),
    "ema(adam)": optcore.ema(optcore.adam(1e-3), 0.99),
    "mixed_precision(adam)": optcore.mixed_precision(optcore.adam(1e-3), state_dtype=jnp.bfloat16),
  }


def stripped_hlo(opt_def: optcore.OptimizerDef) -> str:
  opt = opt_def.create(params())
  grads = jax.tree.map(jnp.ones_like, opt.target)
  step = jax.jit(lambda opt, g, lr: opt.apply_gradient(g, learning_rate=lr))
  text = step.lower(opt, grads, jnp.float32(1e-3)).compile().as_text()
  text = re.sub(r",? ?metadata=\{[^}]*\}", "", text)
  # Newer XLA prints tables of source files, functions and stack frames: locations, not maths.
  text = re.sub(
    r"^(FileNames|FunctionNames|FileLocations|StackFrames)\n(.+\n)*", "", text, flags=re.M
  )
  return re.sub(r"^HloModule \S+", "HloModule step", text, flags=re.M)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dump", type=Path, help="write each case's stripped HLO here")
  args = parser.parse_args()
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}")
  for name, opt_def in cases().items():
    text = stripped_hlo(opt_def)
    if args.dump:
      args.dump.mkdir(parents=True, exist_ok=True)
      (args.dump / f"{re.sub(r'[^A-Za-z0-9.]+', '_', name)}.hlo").write_text(text)
    print(f"{name:32s} {hashlib.sha256(text.encode()).hexdigest()[:16]}")


if __name__ == "__main__":
  main()
