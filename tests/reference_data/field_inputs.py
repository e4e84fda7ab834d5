"""The inputs of the reference trajectories of the optimizers of issue 51 (cautious AdamW and
Lion, MARS, NorMuon, ZClip): shared by the script that runs the authors' code
(`make_field_reference.py`) and, through the file it writes, by
`tests/core/test_field_optimizers.py`.

NumPy only. Each case is parameter shapes, the reference's class and its keyword arguments
(its own names: ``lr``, ``betas``), and for ZClip the clipper's keyword arguments and the
optimizer it feeds. The ZClip cases' gradients have spikes: steps in `SPIKES` are scaled by
their factor, after the warm-up, so the z-score clips them.
"""

from __future__ import annotations

import numpy as np

STEPS = 14

SHAPES = {"w": (4, 3), "b": (3,), "k": (2, 3, 2)}

#: step (1-based) -> the factor its gradient is scaled by, in the ZClip cases.
SPIKES = {7: 12.0, 8: 0.2, 11: 30.0}

#: name -> (the reference, its keyword arguments, ZClip's keyword arguments or None)
CASES: dict[str, tuple[str, dict, dict | None]] = {
  # C-Optim's AdamW (foreach=False: the per-parameter loop; eps small, as optax adds it after
  # the bias correction and theirs before).
  "c_adamw": ("c_adamw", {"lr": 1e-2, "eps": 1e-8, "weight_decay": 0.1}, None),
  "c_adamw_betas": ("c_adamw", {"lr": 3e-2, "betas": (0.8, 0.95), "eps": 1e-8}, None),
  "c_lion": ("c_lion", {"lr": 1e-2, "betas": (0.9, 0.99), "weight_decay": 0.1}, None),
  # MARS: its defaults (the 1-D leaves to AdamW), then each branch and option.
  "mars_defaults": ("mars", {}, None),
  "mars_decay": ("mars", {"lr": 1e-2, "weight_decay": 0.1, "gamma": 0.05}, None),
  "mars_lion": ("mars", {"lr": 1e-3, "mars_type": "mars-lion", "weight_decay": 0.1}, None),
  "mars_amsgrad": ("mars", {"lr": 1e-2, "amsgrad": True, "betas": (0.9, 0.99)}, None),
  "mars_1d": ("mars", {"lr": 1e-2, "optimize_1d": True, "weight_decay": 0.05}, None),
  # NorMuon with its auxiliary Adam: the matrix w (4 x 3, tall) takes NorMuon, b and k Adam.
  "normuon_defaults": ("normuon", {"muon": {}, "adam": {}}, None),
  "normuon_settings": (
    "normuon",
    {
      "muon": {"lr": 0.05, "weight_decay": 0.1, "momentum": 0.9, "beta2": 0.99},
      "adam": {"lr": 1e-3, "betas": (0.8, 0.99), "eps": 1e-8, "weight_decay": 0.01},
    },
    None,
  ),
  # ZClip around SGD and AdamW (torch's), every mode.
  "zclip_sgd": ("sgd", {"lr": 0.1}, {"warmup_steps": 4}),
  "zclip_adamw": ("adamw", {"lr": 1e-2, "weight_decay": 0.01}, {"warmup_steps": 4}),
  "zclip_mean_skip": (
    "sgd",
    {"lr": 0.1},
    {"warmup_steps": 3, "clip_option": "mean", "skip_update_on_spike": True, "alpha": 0.9},
  ),
  "zclip_percentile": (
    "sgd",
    {"lr": 0.1},
    {"warmup_steps": 5, "mode": "percentile", "z_thresh": 1.5, "max_grad_norm": None},
  ),
  "zclip_scaled": (
    "adamw",
    {"lr": 1e-2},
    {"warmup_steps": 3, "z_thresh": 2.0, "clip_factor": 0.7, "max_grad_norm": 5.0},
  ),
}


def case_inputs(name: str) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
  """The case's float32 parameters and one gradient per step (a fixed seed per case)."""
  seed = sorted(CASES).index(name)
  rng = np.random.default_rng(seed)
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
  zclip = CASES[name][2] is not None
  grads = []
  for step in range(1, STEPS + 1):
    scale = SPIKES.get(step, 1.0) if zclip else 1.0
    # small gradients, so ZClip's default cap (max_grad_norm=1) leaves most steps unclipped
    size = 0.1 if zclip else 1.0
    grads.append(
      {k: (scale * size * rng.normal(size=s)).astype(np.float32) for k, s in SHAPES.items()}
    )
  return params, grads
