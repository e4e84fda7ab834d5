"""A small transformer (scanned layers, logical axes) in plain JAX: trained with Muon
on its matrices and AdamW on the rest, the split derived from the axes, with an EMA
of the parameters and the hyper-parameters logged each step; then fine-tuned on a
new task, with a new parameter, under AdamW, its state moved over by transplant.

  python examples/transformer_muon_transplant.py

The task: sequences that count by a fixed step modulo the vocabulary (3, 7, 11,
...), next-token prediction from the second token on. Pre-training counts up by
1 to 7; fine-tuning counts down.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

import optcore

VOCAB, EMBED, HEADS, KV, MLP, LAYERS, LENGTH = 32, 32, 4, 8, 64, 2, 12

# Every parameter's logical axes, as a sharded trainer writes them. Muon reads its
# matrices from them: "layers" is a batch of matrices (the scanned stack), embed/mlp/
# heads/kv form the matrix, "vocab" and "position" tables go to its Adam branch.
AXES = {
  "embedding": P("vocab", "embed"),
  "position": P("position", "embed"),
  "layers": {
    "query": P("layers", "embed", "heads", "kv"),
    "key": P("layers", "embed", "heads", "kv"),
    "value": P("layers", "embed", "heads", "kv"),
    "out": P("layers", "heads", "kv", "embed"),
    "wi": P("layers", "embed", "mlp"),
    "wo": P("layers", "mlp", "embed"),
    "norm_attn": P("layers", "embed"),
    "norm_mlp": P("layers", "embed"),
  },
  "final_norm": P("embed"),
  "head": P("embed", "vocab"),
}


def init_params(key):
  keys = iter(jax.random.split(key, 10))

  def normal(shape, fan_in):
    return jax.random.normal(next(keys), shape) / np.sqrt(fan_in)

  return {
    "embedding": normal((VOCAB, EMBED), 1.0),
    "position": normal((LENGTH, EMBED), 1.0) * 0.1,
    "layers": {
      "query": normal((LAYERS, EMBED, HEADS, KV), EMBED),
      "key": normal((LAYERS, EMBED, HEADS, KV), EMBED),
      "value": normal((LAYERS, EMBED, HEADS, KV), EMBED),
      "out": normal((LAYERS, HEADS, KV, EMBED), HEADS * KV),
      "wi": normal((LAYERS, EMBED, MLP), EMBED),
      "wo": normal((LAYERS, MLP, EMBED), MLP),
      "norm_attn": jnp.ones((LAYERS, EMBED)),
      "norm_mlp": jnp.ones((LAYERS, EMBED)),
    },
    "final_norm": jnp.ones(EMBED),
    "head": normal((EMBED, VOCAB), EMBED),
  }


def rms_norm(x, scale):
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def block(x, layer):
  h = rms_norm(x, layer["norm_attn"])
  q, k, v = (jnp.einsum("td,dhk->thk", h, layer[name]) for name in ("query", "key", "value"))
  scores = jnp.einsum("thk,shk->hts", q, k) / np.sqrt(KV)
  causal = jnp.tril(jnp.ones((LENGTH, LENGTH), bool))
  weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
  x = x + jnp.einsum("hts,shk,hkd->td", weights, v, layer["out"])
  h = rms_norm(x, layer["norm_mlp"])
  return x + jax.nn.gelu(h @ layer["wi"]) @ layer["wo"], None


def forward(params, tokens):
  x = params["embedding"][tokens] + params["position"]
  if "task" in params:  # the fine-tuning model's one new parameter
    x = x + params["task"]
  x, _ = jax.lax.scan(block, x, params["layers"])  # the scanned layers
  return rms_norm(x, params["final_norm"]) @ params["head"]


def loss_fn(params, tokens):
  logits = jax.vmap(forward, in_axes=(None, 0))(params, tokens)[:, 1:-1]
  targets = tokens[:, 2:]  # from the second token on, the step is known
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def batch(key, steps):
  start_key, step_key = jax.random.split(key)
  start = jax.random.randint(start_key, (64, 1), 0, VOCAB)
  step = jax.random.choice(step_key, jnp.asarray(steps), (64, 1))
  return (start + step * jnp.arange(LENGTH)) % VOCAB


@jax.jit
def train_step(opt, tokens):
  loss, grads = jax.value_and_grad(loss_fn)(opt.target, tokens)
  opt = opt.apply_gradient(grads)
  return opt, loss, opt.current_hyper_params()


def evaluate(params, steps):
  return float(loss_fn(params, batch(jax.random.key(10_000), steps)))


def train(opt, steps, task, every):
  for i in range(steps):
    opt, loss, hyper_params = train_step(opt, batch(jax.random.key(i), task))
    if i % every == 0 or i == steps - 1:
      logged = "  ".join(
        f"{name} {float(value):.3g}"
        for name, value in sorted(hyper_params.items())
        if name.endswith(("learning_rate", "weight_decay"))
      )
      print(f"step {int(opt.state.step):4d}  loss {float(loss):.4f}  {logged}")
  return opt


def main():
  up, down = list(range(1, 8)), list(range(-7, 0))
  params = init_params(jax.random.key(0))

  # 1. Pre-training: Muon on the matrices (each layer of the stack its own matrix),
  # AdamW on embeddings, norms and the head, an EMA of the parameters.
  schedule = optax.warmup_cosine_decay_schedule(0.0, 0.02, 20, 300, end_value=0.002)
  muon = optcore.contrib.muon(
    schedule,
    adam_learning_rate=3e-3,
    adam_weight_decay=0.01,
    param_logical_axes=AXES,
    matrix_rules={"position": "adam"},  # our own axis name: a table, not a matrix
  )
  opt = optcore.ema(muon, decay=0.98).create(params)
  print("pre-training (muon + adamw, ema; logged: the hyper-parameters of the next step)")
  opt = train(opt, 300, up, every=50)
  print(f"pre-trained: loss {evaluate(opt.target, up):.4f}, ema {evaluate(opt.ema_params, up):.4f}")
  print(f"on the new task before fine-tuning: ema {evaluate(opt.ema_params, down):.4f}")

  # 2. Fine-tuning: the EMA weights plus a new parameter, AdamW everywhere, and what of
  # the old state still fits: the Adam branch's moments, the EMA.
  new_params = {**opt.ema_params, "task": jnp.zeros(EMBED)}
  fine_def = optcore.ema(optcore.adamw(3e-3, weight_decay=0.01), decay=0.98)
  fine, report = optcore.transplant(fine_def.create(new_params), opt.state_dict())
  print(report)  # kept / initialised / dropped, by path (a dozen rows of each)
  fine = train(fine, 150, down, every=50)
  print(
    f"fine-tuned: loss {evaluate(fine.target, down):.4f}, ema {evaluate(fine.ema_params, down):.4f}"
  )


if __name__ == "__main__":
  main()
