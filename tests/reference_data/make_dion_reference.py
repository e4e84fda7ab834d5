"""Writes `dion_reference.npz`: the parameters after every step of the authors' Dion
(``Dion`` of ``dion/dion_reference.py``, github.com/microsoft/dion: the version without
batching or overlapped communication, which follows the paper) on the cases of
`dion_inputs.py`, and each matrix's initial ``Q``.

The reference draws ``Q`` from ``torch.randn`` and, under ``'rcqr'`` and ``'cqr'``, a new
Gaussian sketch every step. The script stores the initial ``Q`` (optcore's test starts from
it); the sketches it cannot share, and needs not: they change ``P``'s column signs and the
last bits, which the update does not see (`optcore._src.optimizers.dion`'s docstring).
``torch.compile`` is an identity while the reference loads, so its functions run eagerly, op by
op, as written.

microsoft/dion is not on PyPI: clone it and name its directory (the committed data came from
0a059a4, torch 2.13.0 on CPU):

    git clone https://github.com/microsoft/dion /tmp/dion
    python tests/reference_data/make_dion_reference.py /tmp/dion [OUT]

Nothing here imports optcore or JAX.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import numpy as np
import torch
from dion_inputs import CASES, MATRICES, STEPS, case_inputs
from torch_runs import commit, parameters, record, save


def load(clone: Path) -> type:
  """The reference's class, its package loaded without ``dion/__init__.py`` (which imports
  the Triton kernels of the other optimizers)."""
  package = types.ModuleType("dion_clone")
  package.__path__ = [str(clone / "dion")]
  sys.modules["dion_clone"] = package
  compile_ = torch.compile
  torch.compile = lambda fn=None, **kwargs: fn if fn is not None else (lambda f: f)
  try:
    return importlib.import_module("dion_clone.dion_reference").Dion
  finally:
    torch.compile = compile_


def trajectory(dion: type, name: str, out: dict[str, np.ndarray]) -> None:
  kwargs, algorithm = CASES[name]
  params0, grads = case_inputs(name)
  module = parameters(params0)
  groups = [
    {"params": [module[k] for k in MATRICES]},
    {"params": [p for k, p in module.items() if k not in MATRICES], "algorithm": algorithm},
  ]
  torch.manual_seed(sorted(CASES).index(name))
  opt = dion(groups, **kwargs)
  for k in MATRICES:  # the state the first step would make, made here to be read
    group = opt.param_groups[0]
    opt._init_opt_state_dion(
      module[k], opt.state[module[k]], group["rank_fraction"], group["rank_multiple_of"]
    )
    out[f"{name}/q0/{k}"] = opt.state[module[k]]["Q"].numpy().copy()
  record(name, module, grads, opt.step, out)


def main() -> None:
  clone = Path(sys.argv[1]).resolve()
  default = Path(__file__).with_name("dion_reference.npz")
  target = Path(sys.argv[2]) if len(sys.argv) > 2 else default
  dion = load(clone)
  torch.set_num_threads(1)
  out: dict[str, np.ndarray] = {}
  for name in CASES:
    trajectory(dion, name, out)
  save(target, out, f"microsoft/dion {commit(clone)} dion/dion_reference.py", STEPS)


if __name__ == "__main__":
  main()
