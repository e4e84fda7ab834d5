"""Treex code on today's JAX: Treex's Optimizer API, with optcore underneath.

  python examples/treex_quickstart.py

A Treex-style linear model on treeo (parameters plus a running statistic of
another kind) learns a noisy linear map. The loop is Treex's documented one:
`Optimizer(optax.adam(...)).init(params)`, then `optimizer.update(grads,
params)` inside a jitted step that returns the optimizer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import treeo as to

import optcore_treex


class Parameter(to.KindMixin):
  pass


class BatchStat(to.KindMixin):
  pass


class Linear(to.Tree):
  w: jnp.ndarray = to.field(node=True, kind=Parameter)
  b: jnp.ndarray = to.field(node=True, kind=Parameter)
  seen: jnp.ndarray = to.field(node=True, kind=BatchStat)  # examples seen: not a parameter

  def __init__(self, key):
    self.w = 0.1 * jax.random.normal(key, (4, 1))
    self.b = jnp.zeros(1)
    self.seen = jnp.zeros((), jnp.int32)

  def __call__(self, x):
    return x @ self.w + self.b


def main() -> None:
  kx, kn, kw = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (128, 4))
  y = x @ jnp.array([[1.0], [-2.0], [0.5], [3.0]]) + 0.7 + 0.01 * jax.random.normal(kn, (128, 1))

  model = Linear(kw)
  optimizer = optcore_treex.Optimizer(optax.adam(5e-2)).init(to.filter(model, Parameter))

  def loss_fn(params, model):
    return jnp.mean((to.merge(model, params)(x) - y) ** 2)

  @jax.jit
  def train_step(model, optimizer):
    params = to.filter(model, Parameter)
    loss, grads = jax.value_and_grad(loss_fn)(params, model)
    params = optimizer.update(grads, params)
    model = to.merge(model, params)
    model.seen = model.seen + x.shape[0]
    return model, optimizer, loss

  for step in range(300):
    model, optimizer, loss = train_step(model, optimizer)
    if step % 100 == 0 or step == 299:
      print(f"step {step:3d} loss {float(loss):.5f}")
  print(f"w = {model.w.ravel().round(2).tolist()}, b = {float(model.b[0]):.2f}")
  print(f"examples seen: {int(model.seen)}; optimizer steps: {int(optimizer.state.step)}")


if __name__ == "__main__":
  main()
