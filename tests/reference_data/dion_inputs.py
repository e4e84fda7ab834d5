"""The inputs of Dion's reference trajectories: shared by the script that runs the authors'
code (`make_dion_reference.py`) and, through the file it writes, by
`tests/core/test_dion.py`.

NumPy only. Each case is the reference's keyword arguments (its own names: ``lr``,
``betas``) and the ``algorithm`` of the group that holds the leaves that are not matrices.
The matrices are ``w`` (tall: Dion on ``M``), ``v`` (wide: on ``M^T``) and ``u`` (square: at
full rank ``P`` is square, where ``'rcqr'`` takes Householder QR and ``'cqr'`` still Cholesky);
``b`` and ``s`` take the scalar algorithm, in a second group with the same settings, as one
optcore definition gives them. The reference refuses tensors of more than two dimensions in
every group, so there are none here.
"""

from __future__ import annotations

import numpy as np

STEPS = 12

SHAPES = {"w": (6, 4), "v": (3, 5), "u": (4, 4), "b": (4,), "s": ()}
MATRICES = ("w", "v", "u")

#: name -> (the reference's keyword arguments, the other group's algorithm)
CASES: dict[str, tuple[dict, str]] = {
  # its defaults: rcqr (a fresh sketch each step), full rank, AdamW for the rest
  "defaults": ({}, "adamw"),
  "qr": (
    {"lr": 0.02, "mu": 0.9, "betas": (0.8, 0.99), "weight_decay": 0.1, "qr_method": "qr"},
    "adamw",
  ),
  # low rank with two power iterations, and rounding of the rank
  "low_rank": ({"lr": 0.02, "rank_fraction": 0.5, "power_iters": 2}, "adamw"),
  "rank_multiple": ({"lr": 0.02, "rank_fraction": 0.3, "rank_multiple_of": 2}, "adamw"),
  # Cholesky QR after three steps of rcqr, Lion for the rest
  "cqr_lion": (
    {"lr": 0.01, "qr_method": "cqr", "cqr_warmup_steps": 3, "epsilon": 1e-6, "weight_decay": 0.05},
    "lion",
  ),
}


def case_inputs(name: str) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  """The case's float32 parameters and one gradient per step (a fixed seed per case)."""
  rng = np.random.default_rng(sorted(CASES).index(name))
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
  grads = [
    {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()} for _ in range(STEPS)
  ]
  return params, grads
