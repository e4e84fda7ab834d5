"""The inputs of the hyperball optimizers' reference trajectories (AdamH, MuonH): shared by the
script that runs the authors' code (`make_hyperball_reference.py`) and, through the file it
writes, by `tests/core/test_hyperball.py`.

NumPy only. Each case is the keyword arguments of levanter's ``scale_by_adamh`` or
``scale_with_muonh`` (their own names, which optcore keeps). The leaves: ``w`` a matrix (one
norm), ``stack`` three stacked matrices (one norm a slice along the first axis; MuonH
orthogonalises each), ``v`` a vector (one norm an element, the references' rule for any leaf
that is not a matrix).
"""

from __future__ import annotations

import numpy as np

STEPS = 10

SHAPES = {"w": (6, 4), "stack": (3, 4, 5), "v": (5,)}

#: optimizer -> case name -> the reference's keyword arguments
CASES: dict[str, dict[str, dict]] = {
  "adamh": {
    "defaults": {},  # b1 0.9, b2 0.999, eps 1e-8, learning_rate 0.02
    "fast": {"learning_rate": 0.2, "b1": 0.8, "b2": 0.95},
    "eps": {"learning_rate": 0.05, "eps": 1e-3},
  },
  "muonh": {
    "defaults": {},  # momentum 0.95, nesterov, 5 steps, muon_eps 1e-8, learning_rate 0.02
    "plain": {"momentum": 0.9, "nesterov": False, "learning_rate": 0.1},
    "three_steps": {"steps": 3, "muon_eps": 1e-4, "learning_rate": 0.05},
  },
}


def case_inputs(
  optimizer: str, name: str
) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  """The case's float32 parameters and one gradient per step (a fixed seed per case)."""
  seed = 100 * (1 + sorted(CASES).index(optimizer)) + sorted(CASES[optimizer]).index(name)
  rng = np.random.default_rng(seed)
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
  grads = [
    {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(STEPS)
  ]
  return params, grads
