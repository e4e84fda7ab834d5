"""Writes `field_reference.npz`: the parameters after every step of the authors' own PyTorch
code for the optimizers of issue 51, on the cases of `field_inputs.py`:

- cautious AdamW and Lion: ``c_adamw.py`` and ``c_lion.py`` of github.com/kyleliang919/C-Optim
  (AdamW with ``foreach=False``, its per-parameter loop);
- MARS: ``MARS/optimizers/mars.py`` of github.com/AGI-Arena/MARS;
- NorMuon: ``SingleDeviceNorMuonWithAuxAdam`` of ``normuon.py``, github.com/zichongli5/NorMuon,
  with its one bfloat16 cast (the Newton-Schulz input) made a no-op while it steps, so the
  iteration runs in float32 on float32 parameters as issue 51 asks. As written, d45c9a4 cannot
  step float32 parameters: its Newton-Schulz returns bfloat16 and ``second_momentum.lerp_``
  refuses it ("expected dtype float for `end` but got dtype c10::BFloat16");
- ZClip: ``zclip/zclip.py`` of github.com/bluorion-com/ZClip, called after ``backward`` and
  before torch's own SGD or AdamW step, as its README says.

None of them is on PyPI in this form, so they are not installed: clone the four repositories
and name their directories (the committed data came from C-Optim 2c0517c, MARS 4831e28,
ZClip 584ce4f and NorMuon d45c9a4, torch 2.13.0 on CPU):

    git clone https://github.com/kyleliang919/C-Optim /tmp/C-Optim
    git clone https://github.com/AGI-Arena/MARS /tmp/MARS
    git clone https://github.com/bluorion-com/ZClip /tmp/ZClip
    git clone https://github.com/zichongli5/NorMuon /tmp/NorMuon
    python tests/reference_data/make_field_reference.py /tmp/C-Optim /tmp/MARS /tmp/ZClip \
      /tmp/NorMuon [OUT]

ZClip alone is on PyPI, as ``zclip==1.0.0``, whose ``zclip/zclip.py`` is the clone's byte for
byte. With ``--zclip-only`` the script writes the ZClip cases from that installed package and
needs no clone; ``nox -s reference`` does that, and the test then checks the committed ZClip
trajectories against the fresh ones:

    python tests/reference_data/make_field_reference.py --zclip-only OUT

The tests (`tests/core/test_field_optimizers.py`) read the committed file. Nothing here
imports optcore or JAX.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import sys
import types
from pathlib import Path

import numpy as np
import torch
from field_inputs import CASES, STEPS, case_inputs
from torch_runs import commit, parameters, record, save

#: The reference classes each case needs besides its own (ZClip's: the optimizers it feeds).
TORCH_OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}


def load_installed_zclip() -> dict[str, object]:
  """ZClip from the installed ``zclip`` package (PyPI), with torch's SGD and AdamW."""
  return {"zclip": importlib.import_module("zclip").ZClip, **TORCH_OPTIMIZERS}


def load(c_optim: Path, mars: Path, zclip: Path, normuon: Path) -> dict[str, object]:
  """The authors' classes, from their clones."""
  # c_adamw.py imports its helpers relatively (from .opt_utils): load the clone as a package.
  package = types.ModuleType("c_optim")
  package.__path__ = [str(c_optim)]
  sys.modules["c_optim"] = package
  sys.path.insert(0, str(mars / "MARS" / "optimizers"))
  sys.path.insert(0, str(zclip))
  sys.path.insert(0, str(normuon))
  return {
    "normuon": importlib.import_module("normuon").SingleDeviceNorMuonWithAuxAdam,
    "c_adamw": importlib.import_module("c_optim.c_adamw").AdamW,
    "c_lion": importlib.import_module("c_optim.c_lion").Lion,
    "mars": importlib.import_module("mars").MARS,
    "zclip": importlib.import_module("zclip.zclip").ZClip,
    **TORCH_OPTIMIZERS,
  }


def trajectory(classes: dict, name: str, out: dict[str, np.ndarray]) -> None:
  reference, kwargs, zclip_kwargs = CASES[name]
  params0, grads = case_inputs(name)
  module = parameters(params0)
  if reference == "c_adamw":
    kwargs = {**kwargs, "foreach": False, "no_deprecation_warning": True}
  if reference == "normuon":
    matrices = [p for p in module.values() if p.ndim == 2]
    others = [p for p in module.values() if p.ndim != 2]
    opt = classes[reference](
      [
        {"params": matrices, "use_muon": True, **kwargs["muon"]},
        {"params": others, "use_muon": False, **kwargs["adam"]},
      ]
    )
  else:
    opt = classes[reference](list(module.values()), **kwargs)
  before_step = None
  if zclip_kwargs is not None:
    clipper = classes["zclip"](**zclip_kwargs)

    def before_step(step: int) -> None:  # after backward, before the optimizer's step
      clipper.step(module)
      mean = np.nan if clipper.mean is None else clipper.mean
      out[f"{name}/step{step}/zclip_mean"] = np.array(mean, np.float64)

  step = opt.step
  if reference == "normuon":

    def step() -> None:
      with float32_newton_schulz():
        opt.step()

  record(name, module, grads, step, out, before_step=before_step)


@contextlib.contextmanager
def float32_newton_schulz():
  """NorMuon's ``zeropower_via_newtonschulz5`` starts with ``G.bfloat16()``: while this holds,
  that cast keeps the tensor as it is (the only call of ``Tensor.bfloat16`` in a step)."""
  cast = torch.Tensor.bfloat16
  torch.Tensor.bfloat16 = lambda self, *args, **kwargs: self
  try:
    yield
  finally:
    torch.Tensor.bfloat16 = cast


def main() -> None:
  torch.set_num_threads(1)
  out: dict[str, np.ndarray] = {}
  if sys.argv[1] == "--zclip-only":
    target = Path(sys.argv[2])
    classes = load_installed_zclip()
    names = [name for name in CASES if CASES[name][2] is not None]
    source = f"zclip {importlib.metadata.version('zclip')} (PyPI)"
  else:
    c_optim, mars, zclip, normuon = (Path(a).resolve() for a in sys.argv[1:5])
    default = Path(__file__).with_name("field_reference.npz")
    target = Path(sys.argv[5]) if len(sys.argv) > 5 else default
    classes = load(c_optim, mars, zclip, normuon)
    names = list(CASES)
    source = (
      f"kyleliang919/C-Optim {commit(c_optim)}, AGI-Arena/MARS {commit(mars)}, "
      f"bluorion-com/ZClip {commit(zclip)}, zichongli5/NorMuon {commit(normuon)}"
    )
  for name in names:
    trajectory(classes, name, out)
  save(target, out, source, STEPS)


if __name__ == "__main__":
  main()
