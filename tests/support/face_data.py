"""The small training run the cross-face read-out tests share (ema, eval_params, statistics,
skip_bad_steps): two parameters, seeded normal gradients, a face's own jitted steps."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp


def params() -> dict[str, jax.Array]:
  return {"kernel": jnp.arange(6.0).reshape(2, 3) / 6, "bias": jnp.array([0.1, -0.2, 0.3])}


def grads(i: int) -> dict[str, jax.Array]:
  key = jax.random.key(i)
  return {
    "kernel": jax.random.normal(key, (2, 3)),
    "bias": jax.random.normal(jax.random.fold_in(key, 1), (3,)),
  }


def run_steps(
  face: Any, handle: Any, steps: Iterable[int], grads: Callable[[int], Any] = grads
) -> Any:
  """``handle`` after the face's own jitted step on ``grads(i)`` for each ``i`` of ``steps``."""
  jitted = face.jit(face.step)
  for i in steps:
    handle = jitted(handle, grads(i), {})
  return handle
