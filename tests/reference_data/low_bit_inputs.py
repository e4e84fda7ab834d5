"""The inputs of the low-bit reference data, shared by the script that writes it
(`make_low_bit_reference.py`, with torch) and the tests that read it (with JAX): numpy only."""

from __future__ import annotations

import numpy as np

#: The parameters of the trajectories: a matrix whose rows hold whole blocks, one whose size
#: is no multiple of the blocks (bitsandbytes pads its last block; torchao keeps it float32),
#: one at exactly the small-tensor limit, and a vector under it.
SHAPES = {"w": (16, 256), "e": (45, 100), "k": (4096,), "b": (8,)}
STEPS = 12
KEPT_STEPS = (1, 12)
HYPER = {"lr": 1e-2, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.01}


def arrays_to_quantize() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(20261126)
  heavy = rng.standard_t(2, size=1000).astype(np.float32)  # outliers in some blocks
  moments = (rng.normal(size=(6, 128)) ** 2).astype(np.float32) * 1e-3
  moments[2] = 0.0  # an all-zero block
  return {
    "normal": rng.normal(size=(4, 320)).astype(np.float32),
    "heavy": heavy,
    "second": moments,
    "tiny": (rng.normal(size=512) * 1e-6).astype(np.float32),
  }


def gradients() -> list[dict[str, np.ndarray]]:
  rng = np.random.default_rng(7)
  out = []
  for step in range(STEPS):
    scale = 1.0 if step != 4 else 30.0  # one large step: the scales move
    out.append({k: (rng.normal(size=s) * scale).astype(np.float32) for k, s in SHAPES.items()})
  return out


def initial_params() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(3)
  return {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
