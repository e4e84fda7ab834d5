"""A combination probe: every wrapper around each of a dozen definitions, and every ordered
pair of wrappers around four, each case through what a careful user tries (create, three
jitted steps, a state-dict round trip, a config round trip, ``as_optax()`` with an extra
keyword against the core face's numbers, the read-outs, a rate override, a transplant, and on
8 devices ZeRO-1 with the state in pinned host memory against one device's numbers).

Prints one line per failure, ``KIND\tcase\toperation\terror``: ``CLEAR`` for an optcore error
or a ValueError/TypeError raised by optcore with a sentence (expected where the operation does
not apply, e.g. ``statistics`` without ``with_statistics``), ``BARE`` for anything else (a
JAX or Python error, a wrong number). Not a test: a sweep to run before and after a change to
the wrapper layer (``single``: 160 cases, about 13 minutes on 2 cores; ``pairs``: 360, 50):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
      python tests/support/combination_probe.py single|pairs|all [LO:HI] [--explicit] | grep ^BARE

``--explicit``: the mesh's axes Explicit (``jax.make_mesh``'s default) instead of Auto.
"""

import itertools
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import optcore
from optcore import legacy, t5x

PARAMS = {"w": jnp.linspace(-1, 1, 64 * 72).reshape(64, 72), "b": jnp.linspace(-0.5, 0.5, 72)}
AXES = {"w": P("embed", "mlp"), "b": P("mlp")}
RULES = [("mlp", "model")]


def grads(i):
  k = jax.random.key(i)
  return {
    n: jax.random.normal(jax.random.fold_in(k, j), p.shape)
    for j, (n, p) in enumerate(sorted(PARAMS.items()))
  }


BASES = {
  "adam": lambda: optcore.adam(1e-2),
  "adamw": lambda: optcore.adamw(1e-2, weight_decay=0.1),
  "sgdm": lambda: optcore.sgd(1e-2, momentum=0.9),
  "lion": lambda: optcore.lion(1e-3),
  "legacy_adam": lambda: legacy.Adam(1e-2),
  "t5x_adafactor": lambda: t5x.Adafactor(1e-2),
  "muon": lambda: optcore.contrib.muon(1e-2),
  "soap": lambda: optcore.contrib.soap(1e-2),
  "mars": lambda: optcore.contrib.mars(1e-2),
  "dion": lambda: optcore.contrib.dion(1e-2),
  "normuon": lambda: optcore.contrib.normuon(1e-2, weight_decay=0.1, adam_weight_decay=0.1),
  "chain": lambda: optcore.chain([optax.clip_by_global_norm(1.0), optcore.adamw(1e-2)]),
  "wsd": lambda: optcore.adamw(
    optcore.schedules.warmup_stable_decay(1e-2, total_steps=8, warmup_steps=2)
  ),
  "sf_adamw": lambda: optcore.contrib.schedule_free_adamw(1e-2),
  "multi": lambda: optcore.MultiOptimizer(
    (optcore.ModelParamTraversal(lambda path, _: path.endswith("w")), optcore.adam(1e-2)),
    (optcore.ModelParamTraversal(lambda path, _: not path.endswith("w")), optcore.sgd(1e-2)),
  ),
  "multi_chains": lambda: optcore.MultiOptimizer(
    ("w$", optcore.chain([optax.clip_by_global_norm(1.0), optcore.adamw(1e-2)])),
    ("b$", optcore.chain([optcore.sgd(1e-2)])),
  ),
}
WRAPS = {
  "ema": lambda d: optcore.ema(d, 0.9),
  "acc": lambda d: optcore.accumulate(d, 2),
  "skip": lambda d: optcore.skip_bad_steps(d, window=4, warmup=1),
  "stats": lambda d: optcore.with_statistics(d),
  "lowbit": lambda d: optcore.low_bit_state(d, bits=8, min_size=0),
  "mp": lambda d: optcore.mixed_precision(d, state_dtype=jnp.bfloat16),
  "cautious": lambda d: optcore.cautious(d),
  "zclip": lambda d: optcore.zclip(d, warmup_steps=2),
  "sr": lambda d: optcore.stochastic_rounding(d),
  "grouped": lambda d: optcore.grouped(d),
}

OPTCORE_ERRORS = (
  optcore.StateDictError,
  optcore.TreeMismatchError,
  optcore.SelectorError,
  optcore.PartitionRuleError,
  optcore.MissingHyperParameterError,
  optcore.UngroupableError,
)


def clear(e):
  """An error that is ours and says what to do: an optcore error, or ValueError/TypeError
  raised from optcore's code (its last frame in optcore) with a sentence."""
  if isinstance(e, OPTCORE_ERRORS):
    return True
  tb = traceback.extract_tb(e.__traceback__)
  last = tb[-1].filename if tb else ""
  return (
    isinstance(e, (ValueError, TypeError, NotImplementedError))
    and "/optcore" in last
    and len(str(e)) > 30
  )


def run(name, make, mesh):
  out = []

  def op(label, fn):
    try:
      fn()
      return True
    except Exception as e:
      kind = "CLEAR" if clear(e) else "BARE"
      out.append((kind, name, label, f"{type(e).__name__}: {str(e)[:300]}"))
      return False

  state = {}
  try:
    d = make()
  except Exception as e:
    out.append(
      ("CLEAR" if clear(e) else "BARE", name, "construct", f"{type(e).__name__}: {str(e)[:300]}")
    )
    return out

  def create():
    state["opt"] = d.create(PARAMS)

  if not op("create", create):
    return out
  step = jax.jit(lambda o, g: o.apply_gradient(g))

  def steps():
    o = state["opt"]
    for i in range(3):
      o = step(o, grads(i))
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(o.target)), (
      "non-finite params"
    )
    state["o3"] = o

  if not op("step", steps):
    return out

  def roundtrip():
    o = state["o3"]
    r = d.create(PARAMS).restore_state(o.state_dict())
    a, b = step(o, grads(5)), step(r, grads(5))
    for x, y in zip(jax.tree.leaves(a.target), jax.tree.leaves(b.target), strict=True):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

  op("state_dict", roundtrip)

  def config():
    c = optcore.config.to_config(d)
    assert optcore.config.from_config(c) == d, "config round trip differs"

  op("config", config)

  def as_optax():
    tx = d.as_optax()
    s = tx.init(PARAMS)
    p = PARAMS
    upd = jax.jit(lambda g, s, p: tx.update(g, s, p, unused_extra=1.0))
    for i in range(3):
      u, s = upd(grads(i), s, p)
      p = optax.apply_updates(p, u)
    ref = state["o3"].target
    for x, y in zip(jax.tree.leaves(p), jax.tree.leaves(ref), strict=True):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-5, rtol=1e-5)

  if "sr" not in name:
    op("as_optax", as_optax)
  op("statistics", lambda: optcore.statistics(state["o3"]))
  op("eval_params", lambda: optcore.eval_params(state["o3"]))
  op("current_hp", lambda: optcore.current_hyper_params(state["o3"]))
  op("dequantize", lambda: optcore.dequantize_state(state["o3"].state))
  if "ema" in name:
    op("ema_params", lambda: optcore.ema_params(state["o3"]))
  op("lr_override", lambda: state["o3"].apply_gradient(grads(7), learning_rate=0.0))

  def transplant():
    old = optcore.adam(1e-2).create(PARAMS).apply_gradient(grads(0))
    optcore.transplant(state["o3"], old.state_dict())

  op("transplant", transplant)

  def create_sharded():
    return d.create_sharded(
      PARAMS,
      AXES,
      mesh,
      logical_axis_rules=RULES,
      state_axis="data",
      state_memory_kind="pinned_host",
    )

  def sharded():
    o = create_sharded()
    for i in range(3):
      o = step(o, grads(i))
    ref = state["o3"].target
    for x, y in zip(jax.tree.leaves(o.target), jax.tree.leaves(ref), strict=True):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-5, rtol=1e-5)
    r = create_sharded().restore_state(o.state_dict())
    step(r, grads(4))
    optcore.statistics(o)
    optcore.eval_params(o)
    optcore.dequantize_state(o.state)

  if mesh is not None:
    op("sharded_host", sharded)
  return out


def main():
  explicit = "--explicit" in sys.argv  # the mesh's axes Explicit, as jax.make_mesh makes them
  argv = [a for a in sys.argv if a != "--explicit"]
  which = argv[1] if len(argv) > 1 else "single"
  kind = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
  mesh = (
    Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"), axis_types=(kind, kind))
    if len(jax.devices()) == 8
    else None
  )
  cases = []
  if which in ("single", "all"):
    for b, w in itertools.product(BASES, WRAPS):
      cases.append((f"{w}({b})", lambda b=b, w=w: WRAPS[w](BASES[b]())))
  if which in ("pairs", "all"):
    for b in ["adam", "legacy_adam", "multi", "muon"]:
      for w1, w2 in itertools.permutations(WRAPS, 2):
        cases.append(
          (f"{w1}({w2}({b}))", lambda b=b, w1=w1, w2=w2: WRAPS[w1](WRAPS[w2](BASES[b]())))
        )
  lo, hi = (int(x) for x in argv[2].split(":")) if len(argv) > 2 else (0, len(cases))
  for name, make in cases[lo:hi]:
    for kind, n, label, msg in run(name, make, mesh):
      print(f"{kind}\t{n}\t{label}\t{msg}", flush=True)
  print("DONE", len(cases[lo:hi]), flush=True)


if __name__ == "__main__":
  main()
