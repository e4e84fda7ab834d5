"""The inputs of μP's reference trajectories (microsoft/mup's ``MuAdam``, ``MuAdamW`` and
``MuSGD``): shared by the script that runs mup (`make_mup_reference.py`) and, through the file
it writes, by `tests/core/test_multipliers.py`.

NumPy only. The model is an MLP in torch's layout (a weight is ``(out, in)``): an input layer
``(WIDTH, D_IN)`` (fan-in finite: vector-like), a hidden layer ``(WIDTH, WIDTH)`` (matrix-like),
mup's ``MuReadout`` ``(D_OUT, WIDTH)`` (vector-like), each with its bias. mup's base shapes
come from a model of width ``BASE`` and a delta model of width ``DELTA``; the trained model is
``WIDTH`` wide, a width multiplier of ``WIDTH / BASE`` = 4. Each case is one of mup's
optimizers and its keyword arguments; gradients are given, one per step.
"""

from __future__ import annotations

import numpy as np

STEPS = 8
D_IN, D_OUT = 5, 3
BASE, DELTA, WIDTH = 4, 6, 16

#: name -> (the torch layout's shape, its logical axes in torch's layout: ``'width'`` marks the
#: dimensions mup finds infinite)
LEAVES: dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]] = {
  "input.weight": ((WIDTH, D_IN), ("width", None)),
  "input.bias": ((WIDTH,), ("width",)),
  "hidden.weight": ((WIDTH, WIDTH), ("width", "width")),
  "hidden.bias": ((WIDTH,), ("width",)),
  "readout.weight": ((D_OUT, WIDTH), (None, "width")),
  "readout.bias": ((D_OUT,), (None,)),
}

#: case -> (mup's optimizer, its keyword arguments)
CASES: dict[str, tuple[str, dict]] = {
  "adam_coupled_wd": ("MuAdam", {"lr": 1e-2, "weight_decay": 0.1}),
  "adamw": ("MuAdamW", {"lr": 1e-2, "weight_decay": 0.1}),
  "adamw_decoupled_wd": ("MuAdamW", {"lr": 1e-2, "weight_decay": 0.1, "decoupled_wd": True}),
  "sgd_momentum": ("MuSGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3}),
  "sgd_plain": ("MuSGD", {"lr": 0.05}),
}


def case_inputs(name: str) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  """The case's float32 parameters and one gradient per step (a fixed seed per case)."""
  rng = np.random.default_rng(700 + sorted(CASES).index(name))
  params = {k: rng.normal(size=s).astype(np.float32) for k, (s, _) in LEAVES.items()}
  grads = [
    {k: rng.normal(size=s).astype(np.float32) for k, (s, _) in LEAVES.items()} for _ in range(STEPS)
  ]
  return params, grads
