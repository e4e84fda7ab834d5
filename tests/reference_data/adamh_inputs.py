"""The inputs of AdamH's reference trajectories: shared by the script that runs the authors'
code (`make_adamh_reference.py`) and, through the file it writes, by
`tests/core/test_adamh.py`.

NumPy only. Each case is the keyword arguments of levanter's ``scale_by_adamh`` (its own
names, which optcore keeps). The leaves: ``w`` a matrix (one norm), ``stack`` three stacked
matrices (one norm a slice along the first axis), ``v`` a vector (one norm an element, the
reference's rule for any leaf that is not a matrix).
"""

from __future__ import annotations

import numpy as np

STEPS = 10

SHAPES = {"w": (6, 4), "stack": (3, 4, 5), "v": (5,)}

#: name -> levanter's scale_by_adamh keyword arguments
CASES: dict[str, dict] = {
  "defaults": {},  # b1 0.9, b2 0.999, eps 1e-8, learning_rate 0.02
  "fast": {"learning_rate": 0.2, "b1": 0.8, "b2": 0.95},
  "eps": {"learning_rate": 0.05, "eps": 1e-3},
}


def case_inputs(name: str) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  """The case's float32 parameters and one gradient per step (a fixed seed per case)."""
  rng = np.random.default_rng(100 + sorted(CASES).index(name))
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
  grads = [
    {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(STEPS)
  ]
  return params, grads
