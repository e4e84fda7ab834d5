"""SOAP and Shampoo against AdamW (and Muon) on a small transformer-like model, and against
their authors' code.

Three measurements:

  bytes       state bytes per parameter of AdamW, SOAP (moments, factors and bases) and
              Shampoo (momenta, statistics and roots) on the timed model, stacked layers with
              their logical axes
  time        SOAP's and Shampoo's jitted, donated steps (a basis refresh, and new inverse
              roots, every 10 steps, so every timed call of 10 steps holds one) against
              optcore's AdamW in the same run, compile-order balanced beside an A/A control
              (timing.py); the authors' JAX Shampoo (precondition-opt, where it is installed)
              against optax's AdamW on the same shapes in the same process, timed the same
              way; with --reference DIR and --torch-python PY, the authors' PyTorch SOAP
              against torch's AdamW on the same shapes, timed the same way in a subprocess
              (benchmarks/soap_reference_timing.py)
  loss        a 2-layer causal transformer (stacked layers, logical axes) on synthetic token
              sequences from a fixed random Markov chain, N steps each of AdamW, Muon, SOAP and
              Shampoo at their usual settings; the held-out loss after them, the step at which
              each first reaches AdamW's final training loss, and the curves (plotted by the
              documentation from matrix_optimizers.json)

  python benchmarks/matrix_optimizers.py [--quick] [--reference DIR --torch-python PY]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P
from timing import balanced_ratio, device_name, donated_runner, raw_step

import optcore

RESULTS = Path(__file__).parent / "results"
HERE = Path(__file__).parent


# The model: stacked layers with logical axes, as a scanned Flax model would give them.


def model_shapes(vocab: int, embed: int, mlp: int, layers: int) -> tuple[dict, dict]:
  shapes = {
    "embedding": (vocab, embed),
    "layers": {
      "query": (layers, embed, embed),
      "key": (layers, embed, embed),
      "value": (layers, embed, embed),
      "out": (layers, embed, embed),
      "wi": (layers, embed, mlp),
      "wo": (layers, mlp, embed),
      "norm1": (layers, embed),
      "norm2": (layers, embed),
    },
    "final_norm": (embed,),
    "head": (embed, vocab),
  }
  axes = {
    "embedding": P("vocab", "embed"),
    "layers": {
      "query": P("layers", "embed", "joined_kv"),
      "key": P("layers", "embed", "joined_kv"),
      "value": P("layers", "embed", "joined_kv"),
      "out": P("layers", "joined_kv", "embed"),
      "wi": P("layers", "embed", "mlp"),
      "wo": P("layers", "mlp", "embed"),
      "norm1": P("layers", "embed"),
      "norm2": P("layers", "embed"),
    },
    "final_norm": P("embed"),
    "head": P("embed", "vocab"),
  }
  return shapes, axes


def init_params(shapes: dict, key) -> dict:
  leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
  out = []
  for i, shape in enumerate(leaves):
    if len(shape) == 1 or (len(shape) == 2 and shape[0] <= 8):  # norms
      out.append(jnp.ones(shape))
    else:
      out.append(jax.random.normal(jax.random.fold_in(key, i), shape) / np.sqrt(shape[-2]))
  return treedef.unflatten(out)


def rms_norm(x, scale):
  scale = scale.reshape((1,) * (x.ndim - 1) + scale.shape)
  return x * jax.lax.rsqrt(jnp.mean(x**2, -1, keepdims=True) + 1e-6) * scale


def forward(params, tokens, heads: int):
  x = params["embedding"][tokens]
  t = tokens.shape[1]
  mask = jnp.tril(jnp.ones((1, 1, t, t), bool))

  def layer(x, p):
    h = rms_norm(x, p["norm1"])
    q, k, v = (h @ p[n] for n in ("query", "key", "value"))
    split = lambda a: a.reshape(*a.shape[:-1], heads, -1)
    q, k, v = split(q), split(k), split(v)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    scores = jnp.where(mask, scores, -1e9)
    attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v)
    x = x + attended.reshape(x.shape) @ p["out"]
    h = rms_norm(x, p["norm2"])
    return x + jax.nn.gelu(h @ p["wi"]) @ p["wo"], None

  x, _ = jax.lax.scan(layer, x, params["layers"])
  return rms_norm(x, params["final_norm"]) @ params["head"]


def markov_chain(vocab: int, seed: int = 123) -> np.ndarray:
  """A fixed random transition matrix: each token has a few likely successors."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(vocab, vocab)) * 3.0
  probs = np.exp(logits - logits.max(1, keepdims=True))
  return probs / probs.sum(1, keepdims=True)


def sample(chain: jax.Array, key, batch: int, length: int) -> jax.Array:
  first = jax.random.randint(key, (batch,), 0, chain.shape[0])

  def next_token(tokens, k):
    nxt = jax.random.categorical(k, jnp.log(chain[tokens]))
    return nxt, nxt

  _, rest = jax.lax.scan(next_token, first, jax.random.split(key, length - 1))
  return jnp.concatenate([first[None], rest], 0).T


# Shampoo as its authors' file is used for transformers: blocks of 128, an RMSProp graft at
# AdamW's rate and b2 with moving-average (Adam-like) momentum, new roots every 10 steps (the
# reference's weight decay multiplies by the learning rate twice when decoupled: none here).
SHAMPOO = dict(
  learning_rate=3e-3, block_size=128, beta2=0.95, graft_type=3,
  moving_average_for_momentum=True, preconditioning_compute_steps=10,
)  # fmt: skip

OPTIMIZERS = {
  # Usual settings: AdamW as small language models train it, Muon as optax ships it (Adam
  # for the embedding, head and norms at AdamW's rate), SOAP with its authors' defaults.
  "adamw": lambda axes: optcore.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.01),
  "muon": lambda axes: optcore.contrib.muon(
    0.02, adam_learning_rate=3e-3, adam_b2=0.95, param_logical_axes=axes
  ),
  "soap": lambda axes: optcore.contrib.soap(3e-3, param_logical_axes=axes),
  "shampoo": lambda axes: optcore.contrib.shampoo(**SHAMPOO, param_logical_axes=axes),
}


def train(steps: int, size: dict, seed: int = 0, optimizers: dict | None = None) -> dict:
  """``steps`` steps of each of ``optimizers`` (name -> axes -> definition; None: this
  file's `OPTIMIZERS`) on the Markov-chain sequences: each curve, the held-out loss, and the
  chain's entropy rate."""
  shapes, axes = model_shapes(**size["model"])
  chain = jnp.asarray(markov_chain(size["model"]["vocab"]))
  batch, length, heads = size["batch"], size["length"], size["heads"]

  def loss_fn(params, tokens):
    logits = forward(params, tokens[:, :-1], heads)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  held_out = sample(chain, jax.random.key(10**6), 4 * batch, length)
  out = {}
  for name, make in (optimizers or OPTIMIZERS).items():
    opt = make(axes).create(init_params(shapes, jax.random.key(seed)))

    @jax.jit
    def step(opt, key):
      loss, grads = jax.value_and_grad(loss_fn)(opt.target, sample(chain, key, batch, length))
      return opt.apply_gradient(grads), loss

    curve = []
    for i in range(steps):
      opt, loss = step(opt, jax.random.key(i))
      curve.append(float(loss))
    out[name] = {"curve": curve, "held_out": float(loss_fn(opt.target, held_out))}
  # The entropy rate of the chain: the best loss any model can reach.
  probs = np.asarray(chain)
  stationary = np.linalg.matrix_power(probs.T, 200) @ np.full(len(probs), 1 / len(probs))
  entropy = float(-(stationary[:, None] * probs * np.log(probs + 1e-30)).sum())
  return {"runs": out, "entropy": entropy}


def smoothed(curve: list[float], window: int = 20) -> np.ndarray:
  c = np.asarray(curve)
  return np.convolve(c, np.ones(window) / window, mode="valid")


def steps_to(curve: list[float], target: float, window: int = 20) -> int | None:
  """The first step (1-based, end of the window) where the smoothed loss reaches ``target``."""
  hits = np.nonzero(smoothed(curve, window) <= target)[0]
  return int(hits[0]) + window if len(hits) else None


def parameter_count(size: dict) -> int:
  """The model's parameters at ``size``."""
  shapes, _ = model_shapes(**size["model"])
  return sum(
    int(np.prod(s)) for s in jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple))
  )


def state_bytes_per_parameter(size: dict, optimizers: dict | None = None) -> dict[str, float]:
  """Each of ``optimizers``' (None: `OPTIMIZERS`) state bytes per parameter on the model."""
  shapes, axes = model_shapes(**size["model"])
  params = jax.eval_shape(lambda: init_params(shapes, jax.random.key(0)))
  count = sum(x.size for x in jax.tree.leaves(params))
  out = {}
  for name, make in (optimizers or OPTIMIZERS).items():
    state = jax.eval_shape(make(axes).init_state, params).param_states
    out[name] = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) / count
  return out


def step_time(
  size: dict,
  rounds: int,
  steps: int,
  names: tuple[str, ...] = ("soap", "shampoo"),
  optimizers: dict | None = None,
) -> dict:
  """``names``' and the A/A control's ratios over AdamW (median, quartiles) and AdamW's step
  in ms, each of ``optimizers`` (None: `OPTIMIZERS`, which must hold ``"adamw"``)."""
  optimizers = optimizers or OPTIMIZERS
  shapes, axes = model_shapes(**size["model"])
  params = init_params(shapes, jax.random.key(0))

  def build(key):
    name = "adamw" if key == "control" else key
    return donated_runner(optimizers[name](axes), params, steps)

  out, base_times = {}, []
  for name in (*names, "control"):
    result = balanced_ratio(build, "adamw", name, rounds, steps)
    out[name] = result["ratio"]
    base_times += result["base_times"]
  out["adamw_ms"] = 1e3 * float(np.median(base_times))
  return out


def per_layer_shapes(size: dict) -> list[list[int]]:
  """The model's shapes with each layer of a stack a parameter of its own, as the
  references hold them (a PyTorch model; the JAX Shampoo without logical axes)."""
  shapes, _ = model_shapes(**size["model"])
  flat = []
  for shape in jax.tree.leaves(shapes, is_leaf=lambda x: isinstance(x, tuple)):
    if len(shape) == 3 or (len(shape) == 2 and shape[0] == size["model"]["layers"]):
      flat += [list(shape[1:])] * shape[0]
    else:
      flat.append(list(shape))
  return flat


def shampoo_reference_time(size: dict, rounds: int, steps: int) -> dict | None:
  """The authors' JAX Shampoo (precondition-opt) against optax's AdamW, both raw optax on the
  model's per-layer shapes, with an A/A control; None where it is not installed."""
  for name in ("tree_map", "tree_flatten", "tree_unflatten"):  # gone from JAX since 0.6
    if not hasattr(jax, name):
      setattr(jax, name, getattr(jax.tree_util, name))
  try:
    from precondition import distributed_shampoo as ds
  except ImportError:
    return None
  params = {
    f"p{i:02d}": 0.02 * jax.random.normal(jax.random.key(i), tuple(shape))
    for i, shape in enumerate(per_layer_shapes(size))
  }
  adamw = lambda: optax.adamw(3e-3, b1=0.9, b2=0.95, weight_decay=0.01)
  makers = {"adamw": adamw, "control": adamw, "shampoo": lambda: ds.distributed_shampoo(**SHAMPOO)}

  def build(key):
    tx = makers[key]()
    holder = [jax.tree.map(jnp.copy, params)]
    holder.append(tx.init(holder[0]))
    grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), params)
    step = raw_step(tx)

    def run():
      p, state = holder
      for _ in range(steps):
        p, state = step(p, state, grads)
      jax.block_until_ready(p)
      holder[:] = [p, state]

    return run

  out, base_times = {}, []
  for name in ("shampoo", "control"):
    result = balanced_ratio(build, "adamw", name, rounds, steps)
    out[name] = result["ratio"]
    base_times += result["base_times"]
  out["adamw_ms"] = 1e3 * float(np.median(base_times))
  from importlib import metadata

  out["version"] = metadata.version("precondition-opt")
  return out


def reference_time(size: dict, python: str, source: str, rounds: int, steps: int) -> dict:
  """The authors' SOAP against torch's AdamW, in a subprocess with torch."""
  flat = per_layer_shapes(size)
  args = [python, str(HERE / "soap_reference_timing.py"), source, json.dumps(flat)]
  args += [str(rounds), str(steps)]
  return json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)


def band(ratio: list[float], digits: int = 2) -> str:
  """A ratio's median and quartiles: ``x1.23 [1.20-1.30]``."""
  median, low, high = ratio
  return f"x{median:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"


def report(result: dict, machine: str) -> str:
  bpp, times, loss = result["bytes_per_parameter"], result["step_time"], result["loss"]
  control = times["control"]
  lines = [
    f"SOAP and Shampoo against AdamW and Muon ({machine}).",
    "",
    f"A {result['params'] / 1e3:.0f}k-parameter model of {result['size']['model']['layers']} "
    f"stacked layers (embed {result['size']['model']['embed']}, mlp "
    f"{result['size']['model']['mlp']}, vocab {result['size']['model']['vocab']}): state "
    "bytes per parameter, and a jitted donated step's time over AdamW's (median [quartiles] "
    f"of {result['timed_steps']}-step calls; a basis refresh and new roots every 10 steps; "
    f"A/A control {band(control, 3)}):",
    "",
    "| optimizer | state bytes / parameter | step time over AdamW |",
    "|---|---|---|",
    f"| AdamW | {bpp['adamw']:.2f} | x1 (the baseline) |",
    f"| Muon | {bpp['muon']:.2f} | not timed |",
    f"| SOAP | {bpp['soap']:.2f} | {band(times['soap'])} |",
    f"| Shampoo | {bpp['shampoo']:.2f} | {band(times['shampoo'])} |",
    "",
    f"optcore's AdamW step: {times['adamw_ms']:.2f} ms; so SOAP's: about "
    f"{times['adamw_ms'] * times['soap'][0]:.1f} ms, and Shampoo's about "
    f"{times['adamw_ms'] * times['shampoo'][0]:.1f} ms.",
  ]
  sref = result.get("shampoo_reference_time")
  if sref:
    r, c = sref["shampoo"], sref["control"]
    lines += [
      "",
      f"The authors' JAX Shampoo (precondition-opt {sref['version']}) over optax's AdamW on the "
      f"same shapes, each layer a parameter of its own: {band(r)} (A/A control "
      f"{band(c, 3)}); optax's AdamW step: "
      f"{sref['adamw_ms']:.2f} ms, so the authors' Shampoo's: about "
      f"{sref['adamw_ms'] * r[0]:.1f} ms.",
    ]
  else:
    lines += ["", "The authors' JAX Shampoo was not timed in this run (precondition-opt)."]
  ref = result.get("reference_time")
  if ref:
    r, c = ref["soap"], ref["control"]
    lines += [
      "",
      f"The authors' PyTorch SOAP over torch's AdamW on the same shapes (torch {ref['torch']}, "
      f"CPU threads {ref['threads']}): {band(r)} (A/A control {band(c, 3)}); torch's AdamW "
      f"step: {ref['adamw_ms']:.2f} ms, so "
      f"the authors' SOAP's: about {ref['adamw_ms'] * r[0]:.1f} ms. Ratios over each "
      "framework's own AdamW: XLA fuses AdamW into one program, so its baseline is the "
      "smaller one; the milliseconds compare the two SOAPs.",
    ]
  else:
    lines += ["", "The authors' PyTorch SOAP was not timed in this run (--reference)."]
  runs, target = loss["runs"], loss["runs"]["adamw"]["curve"]
  final = float(smoothed(target)[-1])
  steps = len(target)
  lines += [
    "",
    f"Training: {steps} steps of {result['size']['batch']} sequences of "
    f"{result['size']['length']} tokens from a fixed random Markov chain (entropy rate "
    f"{loss['entropy']:.3f} nats, the best loss possible). Held-out loss after them, and the "
    f"first step whose 20-step mean training loss reaches AdamW's final one ({final:.3f}):",
    "",
    "| optimizer | held-out loss | steps to AdamW's final loss |",
    "|---|---|---|",
  ]
  for name, run in runs.items():
    reached = steps_to(run["curve"], final)
    lines.append(
      f"| {name} | {run['held_out']:.4f} | {reached if reached is not None else 'not reached'} |"
    )
  return "\n".join(lines) + "\n"


SIZES = {
  "full": {
    "model": {"vocab": 256, "embed": 128, "mlp": 512, "layers": 2},
    "batch": 32,
    "length": 64,
    "heads": 4,
  },
  "quick": {
    "model": {"vocab": 32, "embed": 16, "mlp": 32, "layers": 2},
    "batch": 4,
    "length": 8,
    "heads": 2,
  },
}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--train-steps", type=int, default=600)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--reference", help="a clone of github.com/nikhilvyas/SOAP")
  parser.add_argument("--torch-python", default=sys.executable, help="a Python with torch")
  parser.add_argument("--out", default=str(RESULTS), help="where the reports go")
  args = parser.parse_args()
  size = SIZES["quick" if args.quick else "full"]
  if args.quick:
    args.rounds, args.steps, args.train_steps = 2, 2, 30
  device = jax.devices()[0]
  machine = f"{device_name(device)}, {platform.machine()}, jax {jax.__version__}"
  print(f"device: {machine}; optax {optax.__version__}")
  result = {
    "size": size,
    "params": parameter_count(size),
    "bytes_per_parameter": state_bytes_per_parameter(size),
    "step_time": step_time(size, args.rounds, args.steps),
    "timed_steps": args.steps,
    "loss": train(args.train_steps, size),
    "shampoo_reference_time": shampoo_reference_time(size, args.rounds, args.steps),
  }
  if args.reference:
    result["reference_time"] = reference_time(
      size, args.torch_python, args.reference, args.rounds, args.steps
    )
  text = report(result, machine)
  print(text)
  out = Path(args.out)
  out.mkdir(exist_ok=True)
  (out / "matrix_optimizers.json").write_text(json.dumps({"device": machine, **result}, indent=2))
  (out / "matrix_optimizers.md").write_text(text)
  print(f"wrote {out / 'matrix_optimizers.md'}")


if __name__ == "__main__":
  main()
