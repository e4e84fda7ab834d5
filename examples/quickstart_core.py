"""optcore quick start: a small MLP in plain JAX, trained with a wrapped optax
optimizer, a per-step learning rate that takes effect, and a state-dict
checkpoint that resumes bitwise.

  python examples/quickstart_core.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optcore


def init_mlp(key, sizes=(4, 32, 1)):
  keys = jax.random.split(key, len(sizes) - 1)
  return {
    f"layer_{i}": {
      "kernel": jax.random.normal(k, (n_in, n_out)) / np.sqrt(n_in),
      "bias": jnp.zeros(n_out),
    }
    for i, (k, n_in, n_out) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=True))
  }


def mlp(params, x):
  *hidden, last = params.values()
  for layer in hidden:
    x = jax.nn.tanh(x @ layer["kernel"] + layer["bias"])
  return x @ last["kernel"] + last["bias"]


def loss_fn(params, x, y):
  return jnp.mean((mlp(params, x) - y) ** 2)


@jax.jit
def train_step(optimizer, x, y, learning_rate):
  loss, grads = jax.value_and_grad(loss_fn)(optimizer.target, x, y)
  # The override is traced: a new value every step, one compilation.
  return optimizer.apply_gradient(grads, learning_rate=learning_rate), loss


def main() -> None:
  x = jax.random.normal(jax.random.key(1), (256, 4))
  y = jnp.sin(x.sum(axis=1, keepdims=True))
  schedule = optax.cosine_decay_schedule(3e-2, decay_steps=200)

  optimizer = optcore.adamw(learning_rate=3e-2, weight_decay=1e-4).create(
    init_mlp(jax.random.key(0))
  )
  print(f"optcore {optcore.__version__}: {optimizer.optimizer_def}")
  for step in range(200):
    optimizer, loss = train_step(optimizer, x, y, schedule(step))
    if step % 40 == 0 or step == 199:
      print(f"step {step:3d}  loss {float(loss):.5f}  lr {float(schedule(step)):.5f}")
    if step == 99:
      checkpoint = optimizer.state_dict()  # Flax's layout: {'target', 'state'}

  # Resume from the step-99 checkpoint in a fresh optimizer: bitwise the same.
  resumed = optcore.adamw(learning_rate=3e-2, weight_decay=1e-4).create(init_mlp(jax.random.key(0)))
  resumed = resumed.restore_state(checkpoint)
  for step in range(100, 200):
    resumed, _ = train_step(resumed, x, y, schedule(step))
  same = all(
    np.array_equal(a, b)
    for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(optimizer), strict=True)
  )
  print(f"resumed from step 100 and matched the uninterrupted run bitwise: {same}")
  assert same


if __name__ == "__main__":
  main()
