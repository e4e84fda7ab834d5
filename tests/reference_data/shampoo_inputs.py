"""The inputs of the Shampoo reference trajectories: shared by the script that runs the
authors' JAX code (`make_shampoo_reference.py`) and, through the file it writes, by
`tests/core/test_shampoo.py`.

NumPy only. Each case is parameters, a gradient per step and the reference's keyword
arguments, under its own names (``graft_type`` and ``precondtioner_type`` as the integers of
its enums). Gradients are of order one, so every statistic's largest eigenvalue stays far
above the floors where the reference's versions differ (see the script).
"""

from __future__ import annotations

import numpy as np

STEPS = 12

#: the reference's GraftingType and PreconditionerType, by value
SGD, ADAGRAD, RMSPROP, RMSPROP_NORMALIZED, SQRT_N, ADAGRAD_NORMALIZED = 1, 2, 3, 4, 5, 6
ALL, INPUT = 1, 2

#: name -> (parameter shapes, the reference's keyword arguments)
CASES: dict[str, tuple[dict[str, tuple[int, ...]], dict]] = {
  # The defaults (block_size has none; 128, the reference's advice): a matrix, a vector, a
  # 3-D tensor whose small dimensions merge, and a scalar (never preconditioned).
  "defaults": (
    {"w": (4, 3), "b": (3,), "t": (3, 4, 5), "s": ()},
    {"learning_rate": 0.1, "block_size": 128},
  ),
  # Blocks (a dimension above block_size split in pieces, the last one shorter), a
  # dimension above skip_preconditioning_dim_size_gt (the graft alone), merged small
  # dimensions, statistics and preconditioners computed only every few steps, RMSProp
  # grafting on normalized gradients, moving-average momentum without Nesterov, coupled
  # weight decay.
  "settings": (
    {"w": (7, 5), "t": (2, 3, 8), "long": (12, 3), "v": (5,)},
    {
      "learning_rate": 0.05,
      "block_size": 4,
      "beta1": 0.8,
      "beta2": 0.99,
      "diagonal_epsilon": 1e-8,
      "matrix_epsilon": 1e-2,
      "weight_decay": 0.01,
      "start_preconditioning_step": 2,
      "preconditioning_compute_steps": 3,
      "statistics_compute_steps": 2,
      "graft_type": RMSPROP_NORMALIZED,
      "nesterov": False,
      "moving_average_for_momentum": True,
      "skip_preconditioning_dim_size_gt": 10,
      "merge_small_dims_block_size": 6,
    },
  ),
  # AdaGrad grafting, a fixed exponent, an absolute matrix epsilon, no shape interpretation
  # (a size-1 dimension keeps its own 1x1 statistic), coupled learning rate, decoupled
  # weight decay.
  "adagrad": (
    {"w": (3, 1, 4), "b": (1,), "m": (6, 2)},
    {
      "learning_rate": 0.3,
      "block_size": 5,
      "graft_type": ADAGRAD,
      "exponent_override": 2,
      "relative_matrix_epsilon": False,
      "best_effort_shape_interpretation": False,
      "decoupled_learning_rate": False,
      "decoupled_weight_decay": True,
      "weight_decay": 0.1,
      "start_preconditioning_step": 3,
    },
  ),
  # RMSProp grafting clipped by the scaled gradient norm, one-sided (input) preconditioning,
  # vectors left to the graft, beta2 = 1 (a sum, as AdaGrad). (precondition-opt 0.3.0
  # fails an assertion on a one-sided matrix merged into a vector: none is here.)
  "rmsprop": (
    {"w": (5, 4), "t": (2, 3, 4), "b": (4,)},
    {
      "learning_rate": 0.02,
      "block_size": 16,
      "beta2": 1.0,
      "graft_type": RMSPROP,
      "clip_by_scaled_gradient_norm": 0.5,
      "precondtioner_type": INPUT,
      "skip_preconditioning_rank_lt": 2,
      "start_preconditioning_step": 1,
      "merge_small_dims_block_size": 6,
    },
  ),
  # The last two grafts: the sign (SQRT_N) and AdaGrad on normalized gradients.
  "sqrt_n": (
    {"w": (6, 4), "b": (4,)},
    {"learning_rate": 0.01, "block_size": 4, "graft_type": SQRT_N},
  ),
  "adagrad_normalized": (
    {"w": (4, 6), "b": (6,)},
    {"learning_rate": 0.2, "block_size": 8, "graft_type": ADAGRAD_NORMALIZED, "beta1": 0.5},
  ),
  # Two layers of a stack and an embedding whose vocabulary is above
  # skip_preconditioning_dim_size_gt: the copies optcore keeps as one (2, 4, 3) parameter
  # with axes (layers, embed, mlp), and the graft optcore gives the vocab axis by its rule.
  # At the default matrix_epsilon a layer's one 12x12 statistic of a few gradients is so
  # near-singular that the reference itself moved by 4e-5 between jax 0.10 and 0.12: 1e-3.
  "axes": (
    {"layer0": (4, 3), "layer1": (4, 3), "emb": (12, 4)},
    {
      "learning_rate": 0.1,
      "block_size": 128,
      "skip_preconditioning_dim_size_gt": 10,
      "matrix_epsilon": 1e-3,
    },
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
