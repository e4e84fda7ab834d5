"""Writes `kron_reference.npz`: the parameters after every step of the authors' PSGD Kron
(``kron`` of ``psgd_jax/kron.py``, evanatyourservice/psgd_jax, psgd-jax 0.2.9 on PyPI) on the
cases of `kron_inputs.py`: each step ``optax.apply_updates`` of its updates under ``jax.jit``,
as a trainer runs it; and each case's spread of the reference itself (``{case}/spread``: the
largest distance between its jitted and its eager trajectory), from which
`tests/core/test_kron.py` takes its tolerance.

psgd-jax 0.2.9 imports ``optax._src.clipping``, gone from optax 0.2.8 and unused by
``kron.py``: the script stands an empty module in for it (an upstream incompatibility).

The reference draws its own random numbers (``fold_in(PRNGKey(5318008), count)`` a step), so
the trajectories are its draws too. It imports flax.linen and chex (for Flax's boxed
parameters); install them beside it (the committed data: psgd-jax 0.2.9, jax 0.12.0.1, CPU):

    pip install --no-deps psgd-jax==0.2.9 && pip install flax chex
    python tests/reference_data/make_kron_reference.py [OUT]

Nothing here imports optcore.
"""

from __future__ import annotations

import sys
import types
from importlib.metadata import version
from pathlib import Path

import jax
import numpy as np
import optax
from kron_inputs import CASES, STEPS, case_inputs, scanned_layers

# psgd-jax 0.2.9 imports ``optax._src.clipping``, which optax 0.2.8 moved to
# ``optax.transforms``; kron.py never uses it: an empty module stands in for it.
if "optax._src.clipping" not in sys.modules:
  try:
    import optax._src.clipping  # an optax that still has it
  except ImportError:
    sys.modules["optax._src.clipping"] = types.ModuleType("optax._src.clipping")
from psgd_jax.kron import kron


def trajectory(name: str, jit: bool) -> list[dict[str, np.ndarray]]:
  kwargs, scanned = CASES[name]
  params, grads = case_inputs(name)
  params = jax.tree.map(jax.numpy.asarray, params)
  tx = kron(**kwargs, scanned_layers=scanned_layers(name) if scanned else None)
  state = tx.init(params)

  def step(params, state, grad):
    updates, state = tx.update(grad, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(step) if jit else step
  out = []
  for grad in grads:
    params, state = step(params, state, jax.tree.map(jax.numpy.asarray, grad))
    out.append({k: np.asarray(v) for k, v in params.items()})
  return out


def main() -> None:
  here = Path(__file__).parent
  target = Path(sys.argv[1]) if len(sys.argv) > 1 else here / "kron_reference.npz"
  out: dict[str, np.ndarray] = {}
  for name in sorted(CASES):
    jitted, eager = trajectory(name, True), trajectory(name, False)
    spread = 0.0
    for i, (a, b) in enumerate(zip(jitted, eager, strict=True), start=1):
      for key, value in a.items():
        out[f"{name}/step{i}/{key}"] = value
        spread = max(spread, float(np.max(np.abs(value - b[key]))))
    out[f"{name}/spread"] = np.array(spread, np.float32)
    print(f"{name}: the reference's jitted and eager runs differ by {spread:.3g}")
  out["meta/source"] = np.array(f"psgd-jax {version('psgd-jax')} (psgd_jax/kron.py)")
  out["meta/jax"] = np.array(jax.__version__)
  out["meta/steps"] = np.array(STEPS)
  np.savez_compressed(target, **out)
  print(f"wrote {target}")


if __name__ == "__main__":
  main()
