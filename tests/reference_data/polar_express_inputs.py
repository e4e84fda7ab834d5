"""The inputs of the Polar Express reference directions: shared by the script that runs the
authors' function (`make_polar_express_reference.py`) and, through the file it writes, by
`tests/core/test_muon_at_scale.py`.

NumPy only. Each case is a gradient (a matrix, wide or tall, or a stack of matrices, one
orthogonalised at a time) and the number of Newton-Schulz steps: fewer than the authors' table
has rows, as many, and more (their last row repeated).
"""

from __future__ import annotations

import numpy as np

#: case -> (the gradient's shape, ns_steps)
CASES: dict[str, tuple[tuple[int, ...], int]] = {
  "square_5": ((16, 16), 5),
  "wide_5": ((12, 40), 5),
  "tall_5": ((40, 12), 5),
  "wide_1": ((8, 24), 1),
  "tall_3": ((30, 10), 3),
  "square_8": ((20, 20), 8),
  "wide_10": ((6, 33), 10),
  "stack_5": ((3, 10, 14), 5),
  "ill_conditioned_6": ((24, 16), 6),
}


def case_gradient(name: str) -> np.ndarray:
  """The case's float32 gradient (a fixed seed per case). ``ill_conditioned`` spreads its
  singular values over four decades, where the first quintics matter most."""
  shape, _ = CASES[name]
  rng = np.random.default_rng(500 + sorted(CASES).index(name))
  g = rng.normal(size=shape)
  if name.startswith("ill_conditioned"):
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    s = np.logspace(0, -4, min(shape))
    g = (u * s) @ vt
  return g.astype(np.float32)
