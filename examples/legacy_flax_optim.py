"""A program written for the removed flax.optim, running on today's Flax.

  python examples/legacy_flax_optim.py

Everything below the marked line is flax.optim-era code, unchanged: a Linen
MLP trained with `optim.Momentum(...).create(params)` and a per-step learning
rate, then with an `optim.MultiOptimizer` of `ModelParamTraversal`s, a
`flax.serialization.to_bytes(optimizer)` checkpoint restored with `from_bytes`,
fine-tuning of the last layer alone with `create(params, focus=...)` and a
`traverse_util` traversal, and float16 training with `optim.DynamicScale`.
"""

import optcore_flax

optcore_flax.install_legacy_namespace()  # the one added line
# ---- flax.optim-era code from here on ----

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import linen as nn  # noqa: E402
from flax import optim, serialization, traverse_util  # noqa: E402


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
  layout = serialization.to_state_dict(optimizer)["state"]["param_states"]
  print(f"one state per parameter: {sorted(layout)} -> {sorted(layout['Dense_0']['kernel'])}")

  # Fine-tune the last layer only: the first one keeps its values, with None state.
  head = traverse_util.t_identity["Dense_1"]
  tuned = optim.Adam(learning_rate=1e-2).create(optimizer.target, focus=head)
  for _ in range(50):
    tuned, loss = train_step(tuned, 1e-2)
  frozen = np.array_equal(tuned.target["Dense_0"]["kernel"], optimizer.target["Dense_0"]["kernel"])
  print(
    f"focus on Dense_1: loss {float(loss):.4f}, Dense_0 unchanged: {frozen}, "
    f"Dense_0 state: {tuned.state.param_states['Dense_0']}"
  )

  # Mixed precision: the loss in float16, scaled by DynamicScale.
  def half_loss_fn(params):
    params16 = jax.tree_util.tree_map(lambda p: p.astype(jnp.float16), params)
    out = model.apply({"params": params16}, x.astype(jnp.float16))
    return jnp.mean((out - y.astype(jnp.float16)) ** 2)

  @jax.jit
  def half_step(optimizer, dyn_scale):
    grad_fn = dyn_scale.value_and_grad(half_loss_fn)
    dyn_scale, is_fin, loss, grad = grad_fn(optimizer.target)
    new_optimizer = optimizer.apply_gradient(grad)
    # Skip the update where the scaled gradients overflowed.
    optimizer = jax.tree_util.tree_map(
      lambda new, old: jnp.where(is_fin, new, old), new_optimizer, optimizer
    )
    return optimizer, dyn_scale, is_fin, loss

  half = optim.Adam(learning_rate=1e-3).create(params)
  dyn_scale = optim.DynamicScale()
  skipped = 0
  for _ in range(50):
    half, dyn_scale, is_fin, loss = half_step(half, dyn_scale)
    skipped += int(not is_fin)
  print(
    f"float16 with dynamic loss scaling: loss {float(loss):.4f}, "
    f"scale {float(dyn_scale.scale):g}, overflowing steps skipped {skipped}"
  )


if __name__ == "__main__":
  main()
