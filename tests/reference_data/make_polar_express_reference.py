"""Writes `polar_express_reference.npz`: the orthogonalised directions of the authors' Polar
Express function on the gradients of `polar_express_inputs.py`, and the function's own float32
spread on each (its float32 result against the same function in float64).

The function is ``PolarExpress(G, steps)`` of Amsel, Persson, Musco and Gower, "The Polar
Express: Optimal Matrix Sign Methods and Their Application to the Muon Algorithm" (2025,
arXiv:2505.16932), Algorithm 1 and the authors' ``basic.py`` (github.com/NoahAmsel/PolarExpress),
transcribed below as published, PyTorch as theirs is: their eight rows of coefficients, their
safety factor 1.01 on all but the last row, their normalisation ``X / (||X||_F * 1.01 + 1e-7)``,
the transpose of a tall matrix, ``A = X X^T; B = b A + c A A; X = a X + B X`` per step, the last
row repeated past the table. One change, which the issue that asked for it names: theirs casts
``G`` to bfloat16 for speed; here it keeps ``G``'s dtype (float32, and float64 for the spread),
as optcore does. (The repository could not be cloned where this was written, so the function
is the paper's; the coefficients agree with every copy of ``basic.py`` in the wild.)

    python tests/reference_data/make_polar_express_reference.py [OUT]

Torch on CPU (the committed data: torch 2.13.0). Nothing here imports optcore or JAX.
"""

from __future__ import annotations

import sys
from itertools import repeat
from pathlib import Path

import numpy as np
import torch
from polar_express_inputs import CASES, case_gradient

coeffs_list = [
  (8.28721201814563, -23.595886519098837, 17.300387312530933),
  (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
  (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
  (3.3184196573706015, -2.488488024314874, 0.51004894012372),
  (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
  (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
  (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
  (1.875, -1.25, 0.375),  # subsequent coeffs equal this numerically
]
# safety factor for numerical stability (but exclude last polynomial)
coeffs_list = [(a / 1.01, b / 1.01**3, c / 1.01**5) for (a, b, c) in coeffs_list[:-1]] + [
  coeffs_list[-1]
]


def PolarExpress(G: torch.Tensor, steps: int) -> torch.Tensor:  # the authors names
  assert G.ndim >= 2
  X = G  # theirs: G.bfloat16()
  if G.size(-2) > G.size(-1):
    X = X.mT
  X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-7)
  hs = coeffs_list[:steps] + list(repeat(coeffs_list[-1], steps - len(coeffs_list)))
  for a, b, c in hs:
    A = X @ X.mT
    B = b * A + c * A @ A
    X = a * X + B @ X
  if G.size(-2) > G.size(-1):
    X = X.mT
  return X


def main() -> None:
  here = Path(__file__).parent
  target = Path(sys.argv[1]) if len(sys.argv) > 1 else here / "polar_express_reference.npz"
  out: dict[str, np.ndarray] = {}
  for name in sorted(CASES):
    _, steps = CASES[name]
    g = case_gradient(name)
    single = PolarExpress(torch.tensor(g), steps).numpy()
    double = PolarExpress(torch.tensor(g.astype(np.float64)), steps).numpy()
    out[f"{name}/direction"] = single
    out[f"{name}/spread"] = np.array(np.max(np.abs(single - double)), np.float32)
  out["meta/source"] = np.array("PolarExpress, arXiv:2505.16932 Algorithm 1 / basic.py")
  out["meta/torch"] = np.array(torch.__version__)
  np.savez_compressed(target, **out)
  spreads = {k.split("/")[0]: float(v) for k, v in out.items() if k.endswith("/spread")}
  print(f"wrote {target}; float32 spread per case: {spreads}")


if __name__ == "__main__":
  main()
