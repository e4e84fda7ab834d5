"""Writes `soap_reference.npz`: the parameters after every step of the SOAP authors' own
PyTorch optimizer (``soap.py`` of github.com/nikhilvyas/SOAP) on the cases of
`soap_inputs.py`.

The authors' file is not on PyPI, so it is not installed here: clone their repository and
name the directory holding ``soap.py`` (the committed data came from commit a1e5535, torch
2.13.0 on CPU):

    git clone https://github.com/nikhilvyas/SOAP /tmp/SOAP
    python tests/reference_data/make_soap_reference.py /tmp/SOAP [OUT.npz]

The tests (`tests/core/test_soap.py`) read the committed file. Nothing here imports optcore
or JAX.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from soap_inputs import CASES, STEPS, case_inputs
from torch_runs import commit, parameters, record, save


def trajectory(soap_class, name: str, out: dict[str, np.ndarray]) -> None:
  _, kwargs = CASES[name]
  params0, grads = case_inputs(name)
  module = parameters(params0)
  opt = soap_class(list(module.values()), **kwargs)
  record(name, module, grads, opt.step, out)


def main() -> None:
  source = Path(sys.argv[1]).resolve()
  default = Path(__file__).with_name("soap_reference.npz")
  target = Path(sys.argv[2]) if len(sys.argv) > 2 else default
  sys.path.insert(0, str(source))
  from soap import SOAP  # the authors' class, from their clone

  torch.set_num_threads(1)
  out: dict[str, np.ndarray] = {}
  for name in CASES:
    trajectory(SOAP, name, out)
  save(target, out, f"nikhilvyas/SOAP {commit(source, short=False)}", STEPS)


if __name__ == "__main__":
  main()
