"""The inputs of the SOAP reference trajectories: shared by the script that runs the authors'
code (`make_soap_reference.py`) and, through the file it writes, by `tests/core/test_soap.py`.

NumPy only. Each case is parameters, a gradient per step and the reference's keyword
arguments (its own names: ``lr``, ``betas``). The shapes are chosen so that every factor's
first value, one gradient's outer product, has a null space of at most one dimension: a
larger one makes the first eigenbasis depend on the LAPACK build (see docs/concepts/soap.md).
"""

from __future__ import annotations

import numpy as np

STEPS = 12

#: name -> (parameter shapes, the reference's keyword arguments)
CASES: dict[str, tuple[dict[str, tuple[int, ...]], dict]] = {
  # The defaults: a matrix, a vector (Adam, one step late) and a 3-D tensor.
  "defaults": ({"w": (4, 3), "b": (3,), "t": (3, 4, 3)}, {}),
  # Every other argument away from its default; a dimension above max_precond_dim, a
  # preconditioned vector and one too long to precondition.
  "settings": (
    {"w": (4, 5), "big": (3, 20), "v": (2,), "long": (12,)},
    {
      "lr": 0.02,
      "betas": (0.9, 0.99),
      "shampoo_beta": 0.8,
      "eps": 1e-6,
      "weight_decay": 0.1,
      "precondition_frequency": 2,
      "max_precond_dim": 10,
      "precondition_1d": True,
      "normalize_grads": True,
    },
  ),
  # merge_dims on convolution kernels, read as NCHW from NHWC; no bias correction.
  "merged": (
    {"k": (4, 3, 2, 5), "m": (2, 2, 5)},
    {
      "lr": 0.01,
      "precondition_frequency": 3,
      "max_precond_dim": 10,
      "merge_dims": True,
      "data_format": "channels_last",
      "correct_bias": False,
    },
  ),
  # Two layers of a stack and an embedding whose vocabulary is above max_precond_dim: the
  # copies optcore keeps as one (2, 4, 3) parameter with axes (layers, embed, mlp), and the
  # identity optcore gives the vocab axis by its rule.
  "axes": (
    {"layer0": (4, 3), "layer1": (4, 3), "emb": (12, 4)},
    {"lr": 0.01, "precondition_frequency": 4, "max_precond_dim": 10},
  ),
}


def case_inputs(name: str) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  """(initial parameters, one gradient dict per step) of case ``name``, float32."""
  shapes, _ = CASES[name]
  rng = np.random.default_rng(sorted(CASES).index(name))
  params = {k: rng.standard_normal(s).astype(np.float32) for k, s in sorted(shapes.items())}
  grads = [
    {k: rng.standard_normal(s).astype(np.float32) for k, s in sorted(shapes.items())}
    for _ in range(STEPS)
  ]
  return params, grads
