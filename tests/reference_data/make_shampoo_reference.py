"""Writes `shampoo_reference.npz`: the parameters after every step of the authors' JAX
Shampoo (``distributed_shampoo``) on the cases of `shampoo_inputs.py`.

The reference the issue names is ``scalable_shampoo/optax/distributed_shampoo.py`` of
google-research, which is not packaged. Its authors continued that file as
``precondition/distributed_shampoo.py`` of google-research/precondition, on PyPI as
``precondition-opt``; the committed data came from precondition-opt 0.3.0. On the paths
these cases take the two files compute the same numbers: the later one only adds options
(off by default here) and differs in two places that this script checks are not reached:

* a failed inverse root (error above 0.05) is retried with a larger epsilon: every inverse
  root of these cases succeeded on its first try (``total_retries == 1``);
* eigenvalue and norm floors of 1e-25 where the earlier file has 1e-6 and 1e-16: every
  statistic's largest eigenvalue here is above 1e-6.

The package still calls ``jax.tree_map`` and friends, gone from JAX since 0.6; they are put
back as aliases. Run in an environment with jax, flax, chex, optax and
``pip install --no-deps precondition-opt==0.3.0``:

    python tests/reference_data/make_shampoo_reference.py [OUT.npz]

Beside each trajectory array ``NAME`` the file holds ``spread/NAME``: how far the reference's
own run moves from it when XLA's CPU code is limited to another instruction set
(``--xla_cpu_max_isa=SSE4_2``, ``AVX``, ``AVX2``: with and without fused multiply-add, the
roundings another CPU gives). The inverse roots amplify a last-bit difference by the
statistics' condition number, so this spread (up to 6.5e-4 on the ``defaults`` case, where
parameters are of order 5) is the measured part of the tests' tolerance.

Nothing here imports optcore.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

for _name in ("tree_map", "tree_flatten", "tree_unflatten", "tree_leaves", "tree_structure"):
  setattr(jax, _name, getattr(jax.tree_util, _name))

from precondition import distributed_shampoo as ds  # noqa: E402
from shampoo_inputs import CASES, STEPS, case_inputs  # noqa: E402


def check_first_tries(name: str, step: int, state) -> None:
  for key, stats in state.stats.items():
    metrics = stats.training_metrics
    if not isinstance(metrics, ds.TrainingMetrics) or metrics.total_retries.size == 0:
      continue
    retries = np.asarray(metrics.total_retries)
    computed = retries > 0  # 0: never computed yet
    if np.any(retries[computed] != 1):
      raise SystemExit(f"{name} step {step} {key}: an inverse root was retried: {retries}")
    largest = np.asarray(metrics.max_eigen_value)[computed]
    if np.any(largest <= 1e-6):
      raise SystemExit(f"{name} step {step} {key}: an eigenvalue under 1e-6: {largest}")


def trajectory(name: str, out: dict[str, np.ndarray]) -> None:
  _, kwargs = CASES[name]
  params0, grads = case_inputs(name)
  opt = ds.distributed_shampoo(**kwargs)
  params = {k: jnp.asarray(v) for k, v in params0.items()}
  state = opt.init(params)
  update = jax.jit(opt.update)
  for step, grad in enumerate(grads, start=1):
    updates, state = update({k: jnp.asarray(v) for k, v in grad.items()}, state, params)
    params = optax.apply_updates(params, updates)
    check_first_tries(name, step, state)
    for k, p in params.items():
      out[f"{name}/step{step}/{k}"] = np.asarray(p).copy()


#: XLA's CPU instruction sets the reference is rerun under to measure its spread.
OTHER_ISAS = ("SSE4_2", "AVX", "AVX2")


def trajectories() -> dict[str, np.ndarray]:
  out: dict[str, np.ndarray] = {}
  for name in CASES:
    trajectory(name, out)
  return out


def spread(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The largest difference, per array, between ``out`` and the same trajectories run by the
  reference under each of OTHER_ISAS (a process each: XLA reads its flags once)."""
  widest = {key: np.float32(0.0) for key in out}
  with tempfile.TemporaryDirectory() as tmp:
    for isa in OTHER_ISAS:
      path = os.path.join(tmp, f"{isa}.npz")
      flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_max_isa={isa}".strip()
      subprocess.run(
        [sys.executable, __file__, "--trajectories-only", path],
        check=True,
        env={**os.environ, "XLA_FLAGS": flags},
      )
      with np.load(path) as other:
        for key, value in out.items():
          moved = np.abs(other[key].astype(np.float64) - value).max(initial=0.0)
          widest[key] = np.float32(max(widest[key], moved))
  return {f"spread/{key}": value for key, value in widest.items()}


def main() -> None:
  if sys.argv[1:2] == ["--trajectories-only"]:
    np.savez_compressed(sys.argv[2], **trajectories())
    return
  default = Path(__file__).with_name("shampoo_reference.npz")
  target = Path(sys.argv[1]) if len(sys.argv) > 1 else default
  out = trajectories()
  out.update(spread(out))
  out["meta/source"] = np.array(f"precondition-opt {metadata.version('precondition-opt')}")
  out["meta/jax"] = np.array(jax.__version__)
  out["meta/steps"] = np.array(STEPS)
  out["meta/spread_isas"] = np.array(" ".join(OTHER_ISAS))
  np.savez_compressed(target, **out)
  print(f"wrote {target}: {len(out)} arrays")


if __name__ == "__main__":
  main()
