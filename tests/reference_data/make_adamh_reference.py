"""Writes `adamh_reference.npz`: the parameters after every step of levanter's AdamH
(``scale_by_adamh`` of ``src/levanter/optim/adamh.py``, github.com/marin-community/levanter)
on the cases of `adamh_inputs.py`, each step ``optax.apply_updates`` of its updates, under
``jax.jit`` as a trainer runs it; and the spread of the reference itself (``{case}/spread``:
the largest distance between its jitted and its eager trajectory), from which
`tests/core/test_adamh.py` takes its tolerance.

The reference is JAX code, but its module imports levanter's configuration and haliax (for
the configuration class, not for ``scale_by_adamh``): the script loads the file with those two
names stubbed (and ``chex``, which only annotates its state, where it is not installed), and
runs the function as written. levanter's AdamH is not in the PyPI release
(levanter 1.1): name the file of a clone (the committed data came from a4f7721, jax 0.12 on
CPU):

    git clone https://github.com/marin-community/levanter /tmp/levanter
    python tests/reference_data/make_adamh_reference.py \\
      /tmp/levanter/src/levanter/optim/adamh.py [OUT [LABEL]]

``LABEL`` (default: the file's path) is what ``meta/source`` records.

Nothing here imports optcore.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import jax
import numpy as np
import optax
from adamh_inputs import CASES, STEPS, case_inputs


def load(path: Path) -> types.ModuleType:
  """The reference's module, with the names it imports for its configuration class stubbed."""

  class _Registry:  # levanter.optim.config.OptimizerConfig: only its decorator is used
    @staticmethod
    def register_subclass(name):
      return lambda cls: cls

  stubs = {
    "haliax": types.ModuleType("haliax"),
    "haliax.nn": types.ModuleType("haliax.nn"),
    "levanter": types.ModuleType("levanter"),
    "levanter.optim": types.ModuleType("levanter.optim"),
    "levanter.optim.config": types.ModuleType("levanter.optim.config"),
    "levanter.utils": types.ModuleType("levanter.utils"),
    "levanter.utils.jax_utils": types.ModuleType("levanter.utils.jax_utils"),
  }
  try:  # chex only annotates the state; newer optax no longer installs it
    import chex  # noqa: F401
  except ImportError:
    stubs["chex"] = types.ModuleType("chex")
    stubs["chex"].Array = object
  stubs["haliax.nn"].Linear = type("Linear", (), {})
  stubs["levanter.optim.config"].OptimizerConfig = _Registry
  stubs["levanter.utils.jax_utils"].leaf_key_paths = None
  sys.modules.update(stubs)
  module = types.ModuleType("levanter_adamh")
  sys.modules["levanter_adamh"] = module  # its dataclass looks its module up by name
  exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
  return module


def trajectory(reference: types.ModuleType, name: str, jit: bool) -> list[dict[str, np.ndarray]]:
  params, grads = case_inputs(name)
  tx = reference.scale_by_adamh(**CASES[name])
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
    Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).with_name("adamh_reference.npz")
  )
  reference = load(source)
  out: dict[str, np.ndarray] = {}
  for name in sorted(CASES):
    jitted, eager = trajectory(reference, name, True), trajectory(reference, name, False)
    spread = 0.0
    for i, (a, b) in enumerate(zip(jitted, eager, strict=True), start=1):
      for key, value in a.items():
        out[f"{name}/step{i}/{key}"] = value
        spread = max(spread, float(np.max(np.abs(value - b[key]))))
    out[f"{name}/spread"] = np.array(spread, np.float32)
    print(f"{name}: the reference's jitted and eager runs differ by up to {spread:.3g}")
  out["meta/source"] = np.array(sys.argv[3] if len(sys.argv) > 3 else str(source))
  out["meta/jax"] = np.array(jax.__version__)
  out["meta/steps"] = np.array(STEPS)
  np.savez_compressed(target, **out)
  print(f"wrote {target}: {len(out)} arrays")


if __name__ == "__main__":
  main()
