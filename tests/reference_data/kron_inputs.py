"""The inputs of PSGD Kron's reference trajectories: shared by the script that runs the authors'
JAX code (`make_kron_reference.py`) and, through the file it writes, by
`tests/core/test_kron.py`.

NumPy only. Each case is keyword arguments of psgd_jax's ``kron`` (its own names, which optcore
keeps) and whether the stacked leaf is a scanned layer (``scanned_layers``). The leaves: ``w``
a matrix (two triangular factors, unless a case makes one diagonal), ``stack`` three stacked
matrices, ``v`` a vector (one diagonal factor: fewer dimensions than ``min_ndim_triangular``),
``s`` a scalar.
"""

from __future__ import annotations

import numpy as np

STEPS = 12

SHAPES = {"w": (6, 4), "stack": (3, 4, 5), "v": (5,), "s": ()}

#: case -> (psgd_jax.kron's keyword arguments, the stack a scanned layer)
CASES: dict[str, tuple[dict, bool]] = {
  "defaults": ({}, False),  # learning_rate 1e-3, b1 0.9, the annealed update probability, ...
  "fast": ({"learning_rate": 0.05, "b1": 0.95, "preconditioner_lr": 0.2}, False),
  "one_diag": (
    {"learning_rate": 0.02, "memory_save_mode": "one_diag", "max_size_triangular": 5},
    False,
  ),
  "all_diag_decay": (
    {"learning_rate": 0.02, "b1": 0.0, "memory_save_mode": "all_diag", "weight_decay": 0.1},
    False,
  ),
  "half_probability": (
    {
      "learning_rate": 0.02,
      "preconditioner_update_probability": 0.5,
      "momentum_into_precond_update": False,
      "preconditioner_init_scale": 0.5,
    },
    False,
  ),
  "scanned": ({"learning_rate": 0.02}, True),
}


def case_inputs(name: str) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  """The case's float32 parameters and one gradient per step (a fixed seed per case)."""
  rng = np.random.default_rng(700 + sorted(CASES).index(name))
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
  grads = [
    {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(STEPS)
  ]
  return params, grads


def scanned_layers(name: str) -> dict[str, bool]:
  """The case's ``scanned_layers`` tree."""
  return {k: (k == "stack" and CASES[name][1]) for k in SHAPES}
