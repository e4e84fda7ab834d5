"""A miniature of what T5X's trainer does with the optimizer a gin file builds.

T5X hands ``optimizer_def`` the model's logical axes (``set_param_axes``, when
it has it), creates the optimizer, derives its logical axes for the
partitioner, and passes ``learning_rate=schedule(step)`` to ``apply_gradient``
on every step.
"""

from __future__ import annotations

from typing import Any

import gin
import jax
import jax.numpy as jnp


@gin.configurable
def train(
  optimizer_def: Any = gin.REQUIRED,
  params: Any = None,
  param_axes: Any = None,
  steps: int = 3,
  learning_rate: float = 1e-2,
) -> tuple[Any, Any]:
  """Returns ``(optimizer after `steps` steps, its derived logical axes)``."""
  if hasattr(optimizer_def, "set_param_axes"):
    optimizer_def.set_param_axes(param_axes)
  optimizer = optimizer_def.create(params)
  axes = optimizer_def.derive_logical_axes(optimizer, param_axes)

  @jax.jit
  def step(optimizer, lr):
    grads = jax.grad(lambda p: sum(jnp.sum(jnp.sin(x) ** 2) for x in jax.tree.leaves(p)))(
      optimizer.target
    )
    return optimizer.apply_gradient(grads, learning_rate=lr)

  for i in range(steps):
    optimizer = step(optimizer, learning_rate / (1 + i))
  return optimizer, axes
