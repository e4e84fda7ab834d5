"""Train an Equinox MLP with optcore: one optimizer object, any optcore config.

  python examples/equinox_quickstart.py

Weights get AdamW and biases plain SGD (a MultiOptimizer), the learning rate
follows a schedule passed in every step (no recompiles), and a checkpoint of
the optimizer taken halfway resumes to the same numbers bitwise.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import optcore
import optcore_equinox

STEPS = 200
schedule = optax.cosine_decay_schedule(3e-2, STEPS)


def data(key):
  x = jax.random.uniform(key, (256, 1), minval=-3.0, maxval=3.0)
  return x, jnp.sin(x)


def loss_fn(model, x, y):
  return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@eqx.filter_jit(donate="all-except-first")
def step(x_y, model, opt, lr):
  x, y = x_y
  loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
  model, opt = opt.update(grads, model, learning_rate=lr)
  return model, opt, loss


def train(model, opt, start, stop, x_y, label="training"):
  print(f"{label}: steps {start} to {stop - 1}")
  for i in range(start, stop):
    model, opt, loss = step(x_y, model, opt, jnp.asarray(schedule(i)))
    if i % 50 == 0 or i == STEPS - 1:
      print(f"  step {i:3d} loss {float(loss):.5f}")
  return model, opt


def main() -> None:
  x_y = data(jax.random.key(0))
  model = eqx.nn.MLP(1, 1, width_size=32, depth=2, activation=jnp.tanh, key=jax.random.key(1))
  config = optcore.MultiOptimizer(
    (r"/weight$", optcore.adamw(3e-2, weight_decay=1e-4)),
    (r"/bias$", optcore.sgd(3e-2, momentum=0.9)),
  )
  opt = optcore_equinox.Optimizer(config, model)

  half_model, half_opt = train(model, opt, 0, STEPS // 2, x_y, "first half")
  checkpoint = jax.tree.map(np.asarray, half_opt.state_dict())  # to host memory, as a save would
  saved_model = jax.tree.map(lambda a: np.asarray(a) if eqx.is_array(a) else a, half_model)
  final_model, _ = train(half_model, half_opt, STEPS // 2, STEPS, x_y, "second half, uninterrupted")

  # Resume from the checkpoint into a fresh optimizer and finish again.
  resumed_opt = optcore_equinox.Optimizer(config, saved_model).restore_state(checkpoint)
  resumed_model = jax.tree.map(lambda a: jnp.asarray(a) if eqx.is_array(a) else a, saved_model)
  resumed_model, _ = train(
    resumed_model, resumed_opt, STEPS // 2, STEPS, x_y, "second half, resumed from the checkpoint"
  )
  same = all(
    np.array_equal(a, b)
    for a, b in zip(
      jax.tree.leaves(eqx.filter(final_model, eqx.is_array)),
      jax.tree.leaves(eqx.filter(resumed_model, eqx.is_array)),
      strict=True,
    )
  )
  print(f"resumed run matched the uninterrupted run bitwise: {same}")


if __name__ == "__main__":
  main()
