"""Writes `hyperball_reference.npz`: the parameters after every step of levanter's AdamH
(``scale_by_adamh``, ``src/levanter/optim/adamh.py``) and MuonH (``scale_with_muonh``,
``src/levanter/optim/muonh.py``), github.com/marin-community/levanter, on the cases of
`hyperball_inputs.py`: each step ``optax.apply_updates`` of its updates under ``jax.jit``, as a
trainer runs it; and each case's spread of the reference itself (``{optimizer}/{case}/spread``:
the largest distance between its jitted and its eager trajectory), from which
`tests/core/test_hyperball.py` takes its tolerance.

The references are JAX code, but their modules import levanter's configuration and haliax (for
the configuration classes and haliax's ``Linear``, not for the two functions): the script loads
each file with those names stubbed (and ``chex``, which only annotates and checks a rank, where
it is not installed), and runs the functions as written. MuonH orthogonalises the weights of
haliax ``Linear`` layers, which levanter hands it flattened to matrices, a stack of layers one
layer at a time: the stub of ``map_flattened_linear_layers`` hands it each 2-D leaf as such a
layer, and each layer of a 3-D leaf; any other leaf is no layer and is left as it is, as there.
levanter's hyperball optimizers are not in its PyPI release (levanter 1.1): name the directory
of a clone (the committed data came from a4f7721, jax 0.12 on CPU):

    git clone https://github.com/marin-community/levanter /tmp/levanter
    python tests/reference_data/make_hyperball_reference.py \\
      /tmp/levanter/src/levanter/optim [OUT [LABEL]]

``LABEL`` (default: the directory) is what ``meta/source`` records. Nothing here imports
optcore.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from hyperball_inputs import CASES, STEPS, case_inputs


@dataclasses.dataclass
class _Weight:  # haliax.NamedArray, as MuonH reads it: .array and .ndim
  array: Any

  @property
  def ndim(self) -> int:
    return self.array.ndim


@dataclasses.dataclass
class _Linear:  # haliax.nn.Linear, as MuonH reads it: .weight
  weight: _Weight


def _map_flattened_linear_layers(fn: Any, updates: Any) -> Any:
  """levanter's ``map_flattened_linear_layers`` on plain arrays: ``fn`` on each matrix as a
  layer, on each layer of a stack of them; other leaves are no layers."""

  def one(u: jax.Array) -> jax.Array:
    if u.ndim == 2:
      return fn(_Linear(_Weight(u))).weight.array
    if u.ndim == 3:
      return jax.vmap(lambda x: fn(_Linear(_Weight(x))).weight.array)(u)
    return u

  return jax.tree.map(one, updates)


def _stub_modules() -> None:
  """The names the references' modules import for what the two functions do not use."""

  class _Registry:  # levanter.optim.config.OptimizerConfig: only its decorator is used
    @staticmethod
    def register_subclass(name: str) -> Any:
      return lambda cls: cls

  names = [
    "haliax", "haliax.nn", "levanter", "levanter.optim", "levanter.optim.config",
    "levanter.optim.util", "levanter.utils", "levanter.utils.jax_utils",
  ]  # fmt: skip
  stubs = {name: types.ModuleType(name) for name in names}
  try:  # chex only annotates the state and checks a rank; newer optax no longer installs it
    import chex  # noqa: F401
  except ImportError:
    stubs["chex"] = types.ModuleType("chex")
    stubs["chex"].Array = object
    stubs["chex"].assert_rank = lambda x, rank: None
  stubs["haliax"].nn = stubs["haliax.nn"]
  stubs["haliax.nn"].Linear = _Linear
  stubs["levanter.optim.config"].OptimizerConfig = _Registry
  stubs["levanter.optim.util"].map_flattened_linear_layers = _map_flattened_linear_layers
  stubs["levanter.utils.jax_utils"].leaf_key_paths = None
  sys.modules.update(stubs)


def load(path: Path, name: str) -> types.ModuleType:
  """The reference's module ``levanter.optim.<name>``, run from its file."""
  module = types.ModuleType(f"levanter.optim.{name}")
  sys.modules[module.__name__] = module  # its dataclass looks its module up by name
  exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
  return module


def trajectory(tx: optax.GradientTransformation, optimizer: str, name: str, jit: bool) -> list:
  params, grads = case_inputs(optimizer, name)
  params = {k: jax.numpy.asarray(v) for k, v in params.items()}
  state = tx.init(params)

  def step(params, state, grad):
    updates, state = tx.update(grad, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(step) if jit else step
  out = []
  for grad in grads:
    params, state = step(params, state, {k: jax.numpy.asarray(v) for k, v in grad.items()})
    out.append({k: np.asarray(v) for k, v in params.items()})
  return out


def main() -> None:
  source = Path(sys.argv[1])
  target = (
    Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).with_name("hyperball_reference.npz")
  )
  _stub_modules()
  adamh = load(source / "adamh.py", "adamh")  # muonh.py imports it
  muonh = load(source / "muonh.py", "muonh")
  factories = {"adamh": adamh.scale_by_adamh, "muonh": muonh.scale_with_muonh}
  out: dict[str, np.ndarray] = {}
  for optimizer, cases in sorted(CASES.items()):
    for name in sorted(cases):
      runs = [trajectory(factories[optimizer](**cases[name]), optimizer, name, j) for j in (1, 0)]
      spread = 0.0
      for i, (a, b) in enumerate(zip(*runs, strict=True), start=1):
        for key, value in a.items():
          out[f"{optimizer}/{name}/step{i}/{key}"] = value
          spread = max(spread, float(np.max(np.abs(value - b[key]))))
      out[f"{optimizer}/{name}/spread"] = np.array(spread, np.float32)
      print(f"{optimizer} {name}: the reference's jitted and eager runs differ by {spread:.3g}")
  out["meta/source"] = np.array(sys.argv[3] if len(sys.argv) > 3 else str(source))
  out["meta/jax"] = np.array(jax.__version__)
  out["meta/steps"] = np.array(STEPS)
  np.savez_compressed(target, **out)
  print(f"wrote {target}: {len(out)} arrays")


if __name__ == "__main__":
  main()
