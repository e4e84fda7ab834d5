"""An optimizer written outside optcore, in one file, as a user writes one (issue 61): an optax
transformation whose NamedTuple state says what each field holds with optcore's four public
annotations, made a definition by `optcore.wrap_optax_optimizer` and nothing else. Its state
holds a copy of the parameters under a name optcore has never seen (``slow``), which low-bit
state must leave alone, and moments under names no optax state uses (``velocity``, ``scale``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

import optcore


class SlowAdamState(NamedTuple):
  count: optcore.Replicated
  velocity: optcore.FirstMoment
  scale: optcore.SecondMoment
  slow: optcore.ParamShaped


def slow_adam(
  learning_rate: float = 1e-3,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  alpha: float = 0.5,
  every: int = 3,
) -> optax.GradientTransformation:
  """Adam whose parameters move ``alpha`` of the way back to a slow copy every ``every``
  steps (Lookahead over Adam)."""

  def init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return SlowAdamState(jnp.zeros([], jnp.int32), zeros, zeros, jax.tree.map(jnp.array, params))

  def update(grads, state, params):
    count = state.count + 1
    velocity = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.velocity, grads)
    scale = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.scale, grads)

    def step(m, v):
      return -learning_rate * (m / (1 - b1**count)) / (jnp.sqrt(v / (1 - b2**count)) + eps)

    fast = jax.tree.map(lambda p, m, v: p + step(m, v), params, velocity, scale)
    sync = count % every == 0
    slow = jax.tree.map(lambda s, f: jnp.where(sync, s + alpha * (f - s), s), state.slow, fast)
    new = jax.tree.map(lambda f, s: jnp.where(sync, s, f), fast, slow)
    return jax.tree.map(jnp.subtract, new, params), SlowAdamState(count, velocity, scale, slow)

  return optax.GradientTransformation(init, update)


SlowAdam = optcore.wrap_optax_optimizer(slow_adam)
