"""What the wrong-input tests share: a small model, its gradients, a copy of an optimizer to
check it is unchanged after an error, and the step eager and under ``jax.jit`` (checks happen
at trace time, so both raise)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PARAMS = {"layer": {"b": jnp.zeros(2), "w": jnp.ones((2, 3))}}
GRADS = jax.tree.map(jnp.ones_like, PARAMS)


def snapshot(optimizer: Any) -> Any:
  """A host copy of every array: compared after a refused step, nothing changed."""
  return jax.tree.map(np.array, optimizer)


def steps() -> list[Callable[..., Any]]:
  """``opt.apply_gradient(g, **overrides)`` eager, and jitted."""
  eager = lambda opt, g, **kw: opt.apply_gradient(g, **kw)
  return [eager, jax.jit(eager)]
