"""A run you can watch and that survives a spike: per-layer statistics and a skipped bad step.

  python examples/spike_statistics.py [--steps 150] [--plot spike_statistics.png]

The plot needs matplotlib (``pip install matplotlib``; ``nox -s spike`` installs it);
``--plot ''`` runs without it.

A small MLP learns a 1-D function with AdamW wrapped twice: ``optcore.skip_bad_steps`` (a step
whose gradient norm spikes above its rolling window is skipped) inside
``optcore.with_statistics`` (each layer's gradient, update and parameter norms, computed in
the jitted step). At one step a bad batch arrives (its targets scaled x100). The program logs
the statistics every step as a logger would take them (a flat dict of scalars), checks them
against norms it computes itself, shows the bad step skipped (its gradient norm logged, its
update zero), restores a checkpoint taken mid-window and continues to the same parameters,
and plots each layer's gradient and update norms.
"""

from __future__ import annotations

import argparse
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np

import optcore

WIDTH = 32
BAD_STEP = 80


def data(steps: int):
  rng = np.random.default_rng(0)
  x = rng.uniform(-3, 3, size=(steps, 64, 1)).astype(np.float32)
  y = np.sin(x) + 0.05 * rng.normal(size=x.shape).astype(np.float32)
  y[BAD_STEP] *= 100.0  # the bad batch
  return jnp.asarray(x), jnp.asarray(y)


def initial_params():
  rng = np.random.default_rng(1)
  return {
    "layer0": {
      "kernel": jnp.asarray(rng.normal(size=(1, WIDTH)), jnp.float32),
      "bias": jnp.zeros(WIDTH),
    },
    "layer1": {
      "kernel": jnp.asarray(rng.normal(size=(WIDTH, 1)) / np.sqrt(WIDTH), jnp.float32),
      "bias": jnp.zeros(1),
    },
  }


def loss_fn(p, x, y):
  hidden = jnp.tanh(x @ p["layer0"]["kernel"] + p["layer0"]["bias"])
  return jnp.mean((hidden @ p["layer1"]["kernel"] + p["layer1"]["bias"] - y) ** 2)


OPT_DEF = optcore.with_statistics(  # one group per top-level key: layer0, layer1 (and global)
  optcore.skip_bad_steps(optcore.adamw(1e-2), window=20, sigmas=4.0, warmup=10)
)


@jax.jit
def train_step(opt, x, y):
  loss, grads = jax.value_and_grad(loss_fn)(opt.target, x, y)
  opt = opt.apply_gradient(grads)
  return opt, loss, optcore.statistics(opt), grads


def train(opt, xs, ys, first, last, log):
  """Steps ``first`` to ``last``, each step's loss and statistics appended to ``log``; returns
  the optimizer and what the step before the bad one saw (for the hand check)."""
  check = None
  for i in range(first, last):
    before = opt.target
    opt, loss, stats, grads = train_step(opt, xs[i], ys[i])
    log.append({"step": i, "loss": float(loss), **{k: float(v) for k, v in stats.items()}})
    if i == BAD_STEP - 1:
      check = (before, opt.target, grads)
  return opt, check


def by_hand(before, after, grads, layer):
  """The layer's gradient and update norms, computed here in float64."""
  g = [np.asarray(v, np.float64) for v in jax.tree.leaves(grads[layer])]
  u = [
    np.asarray(a, np.float64) - np.asarray(b, np.float64)
    for a, b in zip(jax.tree.leaves(after[layer]), jax.tree.leaves(before[layer]), strict=True)
  ]
  return np.sqrt(sum(np.sum(v**2) for v in g)), np.sqrt(sum(np.sum(v**2) for v in u))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=150)
  parser.add_argument("--plot", default="spike_statistics.png", help="'' for no plot")
  args = parser.parse_args()
  if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the training
    parser.exit(
      2,
      "spike_statistics.py: the plot needs matplotlib, which is not installed: pip install "
      "matplotlib (nox -s spike installs it), or pass --plot '' to train without the plot.\n",
    )
  if args.steps <= BAD_STEP + 5:
    parser.exit(2, f"spike_statistics.py: --steps must be above {BAD_STEP + 5}\n")
  xs, ys = data(args.steps)
  log: list[dict] = []
  opt, check = train(OPT_DEF.create(initial_params()), xs, ys, 0, args.steps, log)

  print(f"Trained {args.steps} steps; the batch of step {BAD_STEP} is bad (targets x100).")
  print(f"Logged each step: {len(log[0]) - 2} scalars, e.g. {sorted(log[0])[2:6]}")
  print("\n step   loss        layer0/grad_norm  layer1/grad_norm  global/update_norm")
  for row in log[BAD_STEP - 2 : BAD_STEP + 3]:
    print(
      f" {row['step']:4d}   {row['loss']:10.4f}  {row['layer0/grad_norm']:16.4f}  "
      f"{row['layer1/grad_norm']:16.4f}  {row['global/update_norm']:18.6f}"
    )
  skipped = int(optcore.skipped_steps(opt))
  print(f"\nskipped steps: {skipped}; the bad step's update norm: "
        f"{log[BAD_STEP]['global/update_norm']}")  # fmt: skip

  before, after, grads = check
  ok = True
  for layer in ("layer0", "layer1"):
    grad_norm, update_norm = by_hand(before, after, grads, layer)
    row = log[BAD_STEP - 1]
    ok &= np.isclose(row[f"{layer}/grad_norm"], grad_norm, rtol=1e-5)
    ok &= np.isclose(row[f"{layer}/update_norm"], update_norm, rtol=1e-4)
  print(f"the logged norms of step {BAD_STEP - 1} match a hand computation: {bool(ok)}")

  # A checkpoint taken mid-window, restored into a fresh optimizer, continues the same run.
  middle = BAD_STEP - 5
  first, _ = train(OPT_DEF.create(initial_params()), xs, ys, 0, middle, [])
  saved = jax.tree.map(np.asarray, first.state_dict())
  resumed = OPT_DEF.create(initial_params()).restore_state(saved)
  resumed, _ = train(resumed, xs, ys, middle, args.steps, [])
  same = all(
    np.array_equal(a, b)
    for a, b in zip(jax.tree.leaves(resumed.target), jax.tree.leaves(opt.target), strict=True)
  )
  print(f"restored at step {middle}, mid-window: the same parameters bitwise: {same}")

  if not args.plot:
    return
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  steps = [row["step"] for row in log]
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
  for layer, color in (("layer0", "C0"), ("layer1", "C1")):
    top.plot(steps, [r[f"{layer}/grad_norm"] for r in log], color=color, label=layer)
    bottom.plot(steps, [r[f"{layer}/update_norm"] for r in log], color=color, label=layer)
  top.plot([BAD_STEP], [log[BAD_STEP]["global/grad_norm"]], "rv", markersize=10,
           label=f"step {BAD_STEP}: skipped")  # fmt: skip
  top.set(ylabel="gradient norm", yscale="log", title="Per-layer statistics through a bad batch")
  bottom.set(xlabel="step", ylabel="update norm", yscale="log")
  top.legend()
  bottom.legend()
  fig.tight_layout()
  fig.savefig(args.plot, dpi=100)
  print(f"\nWrote the statistics to {args.plot}")


if __name__ == "__main__":
  main()
