"""A program written for the removed flax.optim, running on today's Flax.

  python examples/legacy_flax_optim.py

Everything below the marked line is flax.optim-era code, unchanged: a Linen
MLP trained with `optim.Momentum(...).create(params)` and a per-step learning
rate, then with an `optim.MultiOptimizer` of `ModelParamTraversal`s, and a
`flax.serialization.to_bytes(optimizer)` checkpoint restored with `from_bytes`.
"""

import optcore_flax

optcore_flax.install_legacy_namespace()  # the one added line
# ---- flax.optim-era code from here on ----

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax import optim, serialization  # noqa: E402


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(32)(x)
    x = nn.relu(x)
    return nn.Dense(1)(x)


def make_data():
  rng = np.random.RandomState(0)
  x = rng.uniform(-2, 2, size=(128, 1)).astype(np.float32)
  return jnp.asarray(x), jnp.asarray(np.sin(2 * x))


def make_train_step(model, x, y):
  def loss_fn(params):
    return jnp.mean((model.apply({"params": params}, x) - y) ** 2)

  @jax.jit
  def train_step(optimizer, learning_rate):
    loss, grad = jax.value_and_grad(loss_fn)(optimizer.target)
    optimizer = optimizer.apply_gradient(grad, learning_rate=learning_rate)
    return optimizer, loss

  return train_step


def main():
  x, y = make_data()
  model = MLP()
  params = model.init(jax.random.PRNGKey(0), x)["params"]
  train_step = make_train_step(model, x, y)

  optimizer = optim.Momentum(learning_rate=0.1, beta=0.9).create(params)
  for step in range(200):
    learning_rate = 0.05 * (1.0 - step / 200)
    optimizer, loss = train_step(optimizer, learning_rate)
    if step % 50 == 0:
      print(f"momentum step {step:3d} loss {float(loss):.4f}")
  print(f"momentum final loss {float(loss):.4f}")

  kernels = optim.ModelParamTraversal(lambda path, _: "kernel" in path)
  biases = optim.ModelParamTraversal(lambda path, _: "bias" in path)
  optimizer_def = optim.MultiOptimizer(
    (kernels, optim.Adam(learning_rate=1e-2)), (biases, optim.GradientDescent(learning_rate=1e-2))
  )
  optimizer = optimizer_def.create(optimizer.target)
  for _ in range(100):
    optimizer, loss = train_step(optimizer, 1e-2)
  print(f"multi-optimizer loss {float(loss):.4f}")

  checkpoint = serialization.to_bytes(optimizer)
  restored = serialization.from_bytes(optimizer_def.create(params), checkpoint)
  same = jax.tree_util.tree_all(
    jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(a, b)), restored, optimizer)
  )
  print(f"checkpoint of {len(checkpoint)} bytes restored bitwise: {same}")
  resumed, _ = train_step(restored, 1e-2)
  continued, _ = train_step(optimizer, 1e-2)
  same = jax.tree_util.tree_all(
    jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(a, b)), resumed, continued)
  )
  print(f"training resumes identically: {same}")


if __name__ == "__main__":
  main()
