"""Writes `mup_reference.npz`: the parameters after every step of microsoft/mup's own μP
optimizers (``mup.MuAdam``, ``MuAdamW``, ``MuSGD``) on the cases of `mup_inputs.py`, in float32
and in float64; the float64 run is the float32 run's own spread, what the tests' tolerance is
made from.

The committed file came from github.com/microsoft/mup at 19814971 (2023-10-20), torch 2.13.0 on
CPU: its optimizers take ``decoupled_wd``, which mup 1.0.0 on PyPI (2022) does not. With the
PyPI package the script writes the cases that do not ask for it and says which it left out;
``nox -s reference`` does that, and the test checks the committed cases against those.

mup sets each parameter's ``infshape`` from a base and a delta model (``set_base_shapes``): the
MLP of `mup_inputs.py` built at widths ``BASE`` and ``DELTA``, the trained one at ``WIDTH``. Its
readout is mup's ``MuReadout``. The case's parameters are copied in, each step's gradients set
on ``.grad`` and the optimizer stepped: mup's optimizers are torch's with each parameter group's
``lr`` and ``weight_decay`` scaled, which is what optcore's `mup` must give.

    git clone https://github.com/microsoft/mup /tmp/mup-src
    pip install torch pyyaml && pip install --no-deps mup==1.0.0   # or PYTHONPATH=/tmp/mup-src
    PYTHONPATH=/tmp/mup-src python tests/reference_data/make_mup_reference.py [OUT]

`nox -s reference` writes it anew and the test compares the committed file with it. Nothing
here imports optcore or JAX.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import mup
import numpy as np
import torch
from mup_inputs import BASE, CASES, D_IN, D_OUT, DELTA, STEPS, WIDTH, case_inputs


class MLP(torch.nn.Module):
  def __init__(self, width: int):
    super().__init__()
    self.input = torch.nn.Linear(D_IN, width)
    self.hidden = torch.nn.Linear(width, width)
    self.readout = mup.MuReadout(width, D_OUT)


def run(name: str, dtype: torch.dtype, out: dict[str, np.ndarray]) -> None:
  optimizer, kwargs = CASES[name]
  model = MLP(WIDTH)
  mup.set_base_shapes(model, MLP(BASE), delta=MLP(DELTA))
  params, grads = case_inputs(name)
  model = model.to(dtype)
  named = dict(model.named_parameters())
  with torch.no_grad():
    for k, p in named.items():
      p.copy_(torch.tensor(params[k], dtype=dtype))
  opt = getattr(mup, optimizer)(model.parameters(), **kwargs)
  suffix = "" if dtype == torch.float32 else "/float64"
  for i in range(1, STEPS + 1):
    for k, p in named.items():
      p.grad = torch.tensor(grads[i - 1][k], dtype=dtype)
    opt.step()
    for k, p in named.items():
      out[f"{name}{suffix}/step{i}/{k}"] = p.detach().numpy().copy()
  # what mup made of each parameter: matrix-like, vector-like, and its learning rate
  for group in opt.param_groups:
    for p in group["params"]:
      key = next(k for k, q in named.items() if q is p)
      out[f"{name}/lr/{key}"] = np.float64(group["lr"])
      out[f"{name}/weight_decay/{key}"] = np.float64(group.get("weight_decay", 0.0))


def main() -> None:
  target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("mup_reference.npz")
  out: dict[str, np.ndarray] = {}
  takes_decoupled = "decoupled_wd" in inspect.signature(mup.MuAdam).parameters
  for name in CASES:
    if "decoupled_wd" in CASES[name][1] and not takes_decoupled:
      print(f"{name}: left out, this mup ({Path(mup.__file__).parent}) has no decoupled_wd")
      continue
    for dtype in (torch.float32, torch.float64):
      run(name, dtype, out)
  where = "with decoupled_wd (github.com/microsoft/mup)" if takes_decoupled else "1.0.0 (PyPI)"
  out["meta/source"] = np.array(f"mup {where}, torch {torch.__version__}")
  out["meta/steps"] = np.array(STEPS)
  np.savez_compressed(target, **out)
  print(f"wrote {target}: {len(out)} arrays")


if __name__ == "__main__":
  main()
