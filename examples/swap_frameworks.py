"""One optimizer config, five frameworks, the same numbers: optcore's promise, shown.

  python examples/swap_frameworks.py [--steps 200] [--plot swap_frameworks.png]

The plot needs matplotlib (``pip install matplotlib``; ``nox -s demo`` installs it);
``--plot ''`` runs without it.

A small MLP learns a 1-D function on synthetic data with ONE config (a dict:
AdamW on the kernels, SGD with momentum on the biases, a learning-rate
schedule applied per step) through the core, Flax (flax.optim's API), Flax NNX
(``nnx.Optimizer``'s API: ``from optcore_flax import nnx`` in place of
``from flax import nnx``), Equinox and Treex. It prints the per-step losses
side by side, the shardings the config derives for an 8-device mesh, saves an
orbax checkpoint from Equinox halfway and resumes the run in Flax, and plots
every loss curve to a PNG.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from pathlib import Path

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()

import equinox as eqx
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import treeo as to
from jax.sharding import Mesh, PartitionSpec

import optcore
import optcore_equinox
import optcore_flax
import optcore_treex
from optcore_flax import nnx  # flax.nnx, with nnx.Optimizer taking optcore definitions

CONFIG = {
  "name": "multi",
  "groups": [
    {
      # Flax names a layer's matrix 'kernel', Equinox's own eqx.nn.Linear 'weight': this
      # selector reads both, so the config keeps working on eqx.nn.MLP (/layers/0/weight).
      "select": "(kernel|weight)$",
      "optimizer": {"name": "adamw", "learning_rate": 0.02, "weight_decay": 1e-4},
    },
    {"select": "bias$", "optimizer": {"name": "sgd", "learning_rate": 0.02, "momentum": 0.9}},
  ],
}
WIDTH = 32
LOGICAL_AXES = {
  "layer0": {"kernel": PartitionSpec(None, "mlp"), "bias": PartitionSpec("mlp")},
  "layer1": {"kernel": PartitionSpec("mlp", None), "bias": PartitionSpec(None)},
}
RULES = [("mlp", "model")]


def learning_rate(step: int, steps: int) -> jax.Array:
  return jnp.float32(0.02 * 0.5 * (1 + np.cos(np.pi * step / steps)))


def data():
  rng = np.random.default_rng(0)
  x = rng.uniform(-3, 3, size=(256, 1)).astype(np.float32)
  return jnp.asarray(x), jnp.asarray(np.sin(x) + 0.05 * rng.normal(size=x.shape).astype(np.float32))


def initial_params() -> dict:
  rng = np.random.default_rng(1)
  return {
    "layer0": {
      "kernel": rng.normal(size=(1, WIDTH)).astype(np.float32),
      "bias": np.zeros(WIDTH, np.float32),
    },
    "layer1": {
      "kernel": (rng.normal(size=(WIDTH, 1)) / np.sqrt(WIDTH)).astype(np.float32),
      "bias": np.zeros(1, np.float32),
    },
  }


def mlp(layer0, layer1, x):
  """The one model, written once; each framework holds its parameters its own way."""
  return jnp.tanh(x @ layer0["kernel"] + layer0["bias"]) @ layer1["kernel"] + layer1["bias"]


# The same parameters as each framework holds them.


class LinenDense(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.initializers.zeros, (x.shape[-1], self.width))
    bias = self.param("bias", nn.initializers.zeros, (self.width,))
    return x @ kernel + bias


class LinenMLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return LinenDense(1, name="layer1")(jnp.tanh(LinenDense(WIDTH, name="layer0")(x)))


class EqxDense(eqx.Module):
  kernel: jax.Array
  bias: jax.Array


class EqxMLP(eqx.Module):
  layer0: EqxDense
  layer1: EqxDense

  def __call__(self, x):  # the whole batch at once, as the other frameworks compute it
    as_dict = lambda d: {"kernel": d.kernel, "bias": d.bias}
    return mlp(as_dict(self.layer0), as_dict(self.layer1), x)


class NnxDense(nnx.Module):
  def __init__(self, kernel, bias):
    self.kernel, self.bias = nnx.Param(kernel), nnx.Param(bias)


class NnxMLP(nnx.Module):
  def __init__(self, layer0, layer1):
    self.layer0, self.layer1 = NnxDense(**layer0), NnxDense(**layer1)

  def __call__(self, x):
    as_dict = lambda d: {"kernel": d.kernel[...], "bias": d.bias[...]}
    return mlp(as_dict(self.layer0), as_dict(self.layer1), x)


class TreeoDense(to.Tree):
  kernel: jax.Array = to.field(node=True)
  bias: jax.Array = to.field(node=True)

  def __init__(self, kernel, bias):
    self.kernel, self.bias = kernel, bias


class TreeoMLP(to.Tree):
  layer0: TreeoDense = to.field(node=True)
  layer1: TreeoDense = to.field(node=True)

  def __init__(self, layer0, layer1):
    self.layer0, self.layer1 = layer0, layer1


def loss_of(params_as_dicts, x, y):
  return jnp.mean((mlp(params_as_dicts["layer0"], params_as_dicts["layer1"], x) - y) ** 2)


# One training loop per framework, each written as that framework's users write it.


def train_core(steps, x, y, start=None):
  opt = optcore.config.from_config(CONFIG).create(jax.tree.map(jnp.asarray, initial_params()))

  @jax.jit
  def step(opt, lr):
    loss, grads = jax.value_and_grad(loss_of)(opt.target, x, y)
    return opt.apply_gradient(grads, learning_rate=lr), loss

  return _loop("core", steps, lambda s, lr: step(s, lr), opt)


def train_flax(steps, x, y, optimizer=None, first=0):
  optcore_flax.install_legacy_namespace()
  from flax import optim  # the legacy flax.optim API, on optcore

  model = LinenMLP()
  if optimizer is None:
    variables = model.init(jax.random.key(0), x)  # shapes from Linen, values shared below
    params = flax.core.freeze(jax.tree.map(jnp.asarray, initial_params()))
    assert jax.tree.structure(params) == jax.tree.structure(flax.core.freeze(variables["params"]))
    optimizer = optcore.config.from_config(CONFIG).create(params)
  assert isinstance(optimizer, optim.Optimizer)

  @jax.jit
  def step(optimizer, lr):
    loss_fn = lambda p: jnp.mean((model.apply({"params": p}, x) - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(optimizer.target)
    return optimizer.apply_gradient(grads, learning_rate=lr), loss

  return _loop("flax", steps, step, optimizer, first=first)


def train_equinox(steps, x, y, stop_at=None):
  p = jax.tree.map(jnp.asarray, initial_params())
  model = EqxMLP(EqxDense(**p["layer0"]), EqxDense(**p["layer1"]))
  opt = optcore_equinox.Optimizer(optcore.config.from_config(CONFIG), model)

  @eqx.filter_jit
  def step(model_opt, lr):
    model, opt = model_opt
    loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    return opt.update(grads, model, learning_rate=lr), loss

  return _loop("equinox", steps, step, (model, opt), stop_at=stop_at)


def train_nnx(steps, x, y):
  model = NnxMLP(**jax.tree.map(jnp.asarray, initial_params()))
  optimizer = nnx.Optimizer(model, optcore.config.from_config(CONFIG), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, lr):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads, learning_rate=lr)  # an override, as in every face
    return loss

  return _loop("nnx", steps, lambda state, lr: (state, step(*state, lr)), (model, optimizer))


def train_treex(steps, x, y):
  p = jax.tree.map(jnp.asarray, initial_params())
  params = TreeoMLP(TreeoDense(**p["layer0"]), TreeoDense(**p["layer1"]))
  optimizer = optcore_treex.Optimizer(optcore.config.from_config(CONFIG)).init(params)
  as_dicts = lambda t: {
    n: {"kernel": getattr(t, n).kernel, "bias": getattr(t, n).bias} for n in ("layer0", "layer1")
  }

  @jax.jit
  def step(params_opt, lr):
    params, optimizer = params_opt
    loss, grads = jax.value_and_grad(lambda t: loss_of(as_dicts(t), x, y))(params)
    params = optimizer.update(grads, params, learning_rate=lr)
    return (params, optimizer), loss

  return _loop("treex", steps, step, (params, optimizer))


def _loop(name, steps, step, state, first=0, stop_at=None):
  losses = []
  started = time.perf_counter()
  for i in range(first, stop_at or steps):
    state, loss = step(state, learning_rate(i, steps))
    losses.append(float(loss))
    if (i + 1) % 50 == 0:
      print(f"  [{name:7s}] step {i + 1:4d}/{steps}  loss {losses[-1]:.6f}", flush=True)
  print(f"  [{name:7s}] done in {time.perf_counter() - started:.1f} s", flush=True)
  return state, losses


def show_shardings():
  devices = jax.devices()
  print(f"\nDerived shardings on an {len(devices)}-device mesh ('model' axis), rules {RULES}:")
  mesh = Mesh(np.array(devices[:8]), ("model",))
  opt_def = optcore.config.from_config(CONFIG)
  params = jax.tree.map(jnp.asarray, initial_params())
  opt = opt_def.create_sharded(params, LOGICAL_AXES, mesh, RULES)
  for path, leaf in jax.tree_util.tree_flatten_with_path(opt.state.param_states)[0]:
    if leaf.ndim:
      per_device = max(s.data.nbytes for s in leaf.addressable_shards)
      print(
        f"  state{jax.tree_util.keystr(path):40s} {leaf.sharding.spec!s:18s} "
        f"{per_device:4d} of {leaf.nbytes:4d} bytes per device"
      )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument(
    "--plot", default="swap_frameworks.png", help="where the loss curves go; '' for no plot"
  )
  args = parser.parse_args()
  if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the training
    parser.exit(
      2,
      "swap_frameworks.py: the plot needs matplotlib, which is not installed: pip install "
      "matplotlib (nox -s demo installs it), or pass --plot '' to train without the plot.\n",
    )
  steps = args.steps
  x, y = data()
  print(f"One config for every framework:\n  {CONFIG}\n\nTraining {steps} steps in each:")
  runs = {
    "core": train_core(steps, x, y)[1],
    "flax": train_flax(steps, x, y)[1],
    "nnx": train_nnx(steps, x, y)[1],
    "equinox": train_equinox(steps, x, y)[1],
    "treex": train_treex(steps, x, y)[1],
  }

  print("\nPer-step losses:")
  print(f"  {'step':>5s} " + " ".join(f"{n:>12s}" for n in runs))
  for i in [0, 1, 2, *range(49, steps, 50)]:
    print(f"  {i + 1:5d} " + " ".join(f"{runs[n][i]:12.8f}" for n in runs))
  identical = all(runs[n] == runs["core"] for n in runs)
  print(f"  identical in every framework, bitwise: {identical}")

  show_shardings()

  print(f"\nCheckpoint: Equinox saves at step {steps // 2} (orbax), Flax resumes from it:")
  (model, eqx_opt), _ = train_equinox(steps, x, y, stop_at=steps // 2)
  with tempfile.TemporaryDirectory() as tmp:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(
      Path(tmp) / "ckpt", {"model": eqx.filter(model, eqx.is_array), **eqx_opt.state_dict()}
    )
    checkpointer.wait_until_finished()
    params = flax.core.freeze(jax.tree.map(jnp.asarray, initial_params()))
    fresh = optcore.config.from_config(CONFIG).create(params)
    like = {"model": eqx.filter(model, eqx.is_array), "state": fresh.state_dict()["state"]}
    restored = checkpointer.restore(
      Path(tmp) / "ckpt", jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    )
  target = flax.core.freeze(
    {
      n: {
        "kernel": getattr(restored["model"], n).kernel,
        "bias": getattr(restored["model"], n).bias,
      }
      for n in ("layer0", "layer1")
    }
  )
  optimizer = fresh.restore_state(
    {"target": flax.serialization.to_state_dict(target), "state": restored["state"]}
  )
  _, resumed = train_flax(steps, x, y, optimizer=optimizer, first=steps // 2)
  same = resumed == runs["flax"][steps // 2 :]
  print(f"  resumed in Flax, the second half matches the uninterrupted run bitwise: {same}")

  if not args.plot:
    return
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 4))
  for (name, losses), style in zip(runs.items(), ["-", "--", (0, (5, 1)), "-.", ":"], strict=True):
    ax.plot(range(1, steps + 1), losses, linestyle=style, label=name, linewidth=2)
  ax.plot(
    range(steps // 2 + 1, steps + 1), resumed, "x", markevery=10, label="flax, resumed from equinox"
  )
  ax.set(xlabel="step", ylabel="loss", yscale="log", title="One optcore config, five frameworks")
  ax.legend()
  fig.tight_layout()
  fig.savefig(args.plot, dpi=100)
  print(f"\nWrote the loss curves to {args.plot}")


if __name__ == "__main__":
  main()
