"""Every order of the three wrappers around one algorithm, each against the same training
written by hand in plain JAX (Adam's update by its formula, the running mean, the master copy,
the moving average), and the table of the orders that the training-at-scale page shows.

The table below is the one place the orders are described: `test_the_page_shows_this_table`
holds the page to it (run ``OPTCORE_WRITE_DOCS=1 pytest`` on this file to rewrite the page's
table after changing it). bfloat16 parameters, a float32 master copy, bfloat16 moments,
two gradients per update, five calls (the last one in the middle of a window).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optcore

LR, B1, B2, EPS, DECAY, EVERY, CALLS = 1e-2, 0.9, 0.999, 1e-8, 0.9, 2, 5
BF16, F32 = jnp.bfloat16, jnp.float32
PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "training_at_scale.md"

# order (outermost first) -> (when the moving average moves, whose dtype it has)
ORDERS = {
  ("accumulate", "ema", "mixed_precision"): ("each applied update", "the parameters' (bfloat16)"),
  ("accumulate", "mixed_precision", "ema"): ("each applied update", "the master's (float32)"),
  ("ema", "accumulate", "mixed_precision"): ("every call", "the parameters' (bfloat16)"),
  ("ema", "mixed_precision", "accumulate"): ("every call", "the parameters' (bfloat16)"),
  ("mixed_precision", "accumulate", "ema"): ("each applied update", "the master's (float32)"),
  ("mixed_precision", "ema", "accumulate"): ("every call", "the master's (float32)"),
}


def build(order: tuple[str, ...]) -> optcore.OptimizerDef:
  opt_def = optcore.adam(LR, b1=B1, b2=B2, eps=EPS)
  wrap = {
    "accumulate": lambda d: optcore.accumulate(d, every=EVERY),
    "ema": lambda d: optcore.ema(d, DECAY),
    "mixed_precision": lambda d: optcore.mixed_precision(d, state_dtype=BF16, master_dtype=F32),
  }
  for name in reversed(order):
    opt_def = wrap[name](opt_def)
  return opt_def


def params():
  key = jax.random.key(0)
  return {
    "w": jax.random.normal(key, (4, 3)).astype(BF16),
    "b": jax.random.normal(jax.random.fold_in(key, 1), (3,)).astype(BF16),
  }


def grads(i: int):
  key = jax.random.key(10 + i)
  return {
    "w": jax.random.normal(key, (4, 3)).astype(BF16),
    "b": jax.random.normal(jax.random.fold_in(key, 1), (3,)).astype(BF16),
  }


def by_hand(order: tuple[str, ...]):
  """The same training in plain JAX: ``(params, ema)`` after ``CALLS`` calls."""
  p = params()
  master = {k: x.astype(F32) for k, x in p.items()}
  mu = {k: jnp.zeros(x.shape, BF16) for k, x in p.items()}  # stored in bfloat16
  nu = {k: jnp.zeros(x.shape, BF16) for k, x in p.items()}
  count = 0
  acc = {k: jnp.zeros(x.shape, F32) for k, x in p.items()}
  n = 0
  ema_of_master = order.index("ema") > order.index("mixed_precision")
  average = dict(master) if ema_of_master else dict(p)

  def adam(g):  # on the master copy, moments read in float32
    nonlocal count
    count += 1
    for k in master:
      m = B1 * mu[k].astype(F32) + (1 - B1) * g[k]
      v = B2 * nu[k].astype(F32) + (1 - B2) * g[k] ** 2
      m_hat, v_hat = m / (1 - B1**count), v / (1 - B2**count)
      master[k] = master[k] - LR * m_hat / (jnp.sqrt(v_hat) + EPS)
      mu[k], nu[k] = m.astype(BF16), v.astype(BF16)
      p[k] = master[k].astype(BF16)

  def average_now():
    for k in average:
      new = master[k] if ema_of_master else p[k]
      average[k] = DECAY * average[k] + (1 - DECAY) * new.astype(average[k].dtype)

  for i in range(CALLS):
    g = grads(i)
    if order.index("mixed_precision") < order.index("accumulate"):
      g = {k: x.astype(F32) for k, x in g.items()}  # cast by mixed_precision first
    acc = {k: (acc[k] + (g[k] - acc[k]) / (n + 1)).astype(F32) for k in acc}
    applies = n == EVERY - 1
    n = (n + 1) % EVERY
    if applies:
      mean = {k: acc[k].astype(g[k].dtype).astype(F32) for k in acc}
      acc = {k: jnp.zeros_like(a) for k, a in acc.items()}
      adam(mean)
    # The average moves after each applied update when accumulate is outside it, else each call.
    if applies or order.index("ema") < order.index("accumulate"):
      average_now()
  return p, master, average


def master_copy(state):
  """The master copies, wherever the order put `mixed_precision`'s state."""
  is_mixed = lambda x: isinstance(x, optcore.MixedPrecisionState)
  (mixed,) = [x for x in jax.tree.leaves(state, is_leaf=is_mixed) if is_mixed(x)]
  return mixed.master


def assert_close(got, want, dtype):
  eps = float(jnp.finfo(dtype).eps)
  for k in want:
    assert got[k].dtype == want[k].dtype, (k, got[k].dtype, want[k].dtype)
    np.testing.assert_allclose(
      np.asarray(got[k], np.float32), np.asarray(want[k], np.float32), rtol=2 * eps, atol=2 * eps
    )


@pytest.mark.parametrize("order", sorted(ORDERS), ids=lambda o: "(".join(o))
def test_each_order_trains_as_the_hand_written_loop(order):
  opt = build(order).create(params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(CALLS):
    opt = step(opt, grads(i))
  want_params, want_master, want_average = by_hand(order)
  assert_close(opt.target, want_params, BF16)
  assert_close(master_copy(opt.state), want_master, F32)  # float32: a tighter check
  average = opt.ema_params
  assert_close(average, want_average, average["w"].dtype)
  assert int(opt.state.step) == CALLS // EVERY  # updates applied, whatever the order
  moved = np.abs(np.asarray(average["w"], np.float32) - np.asarray(params()["w"], np.float32))
  assert moved.max() > 0  # the average moves (a bfloat16 one of decay 0.999 once did not)


def markdown_table() -> str:
  lines = [
    "| order (outermost first) | the moving average is updated | and has the dtype of |",
    "|---|---|---|",
  ]
  for order, (when, dtype) in sorted(ORDERS.items()):
    expression = "(".join(order) + "(adam)" + ")" * (len(order) - 1)
    lines.append(f"| `{expression}` | {when} | {dtype} |")
  return "\n".join(lines)


def test_the_page_shows_this_table():
  text = PAGE.read_text()
  start = "<!-- wrapper-orders: generated by tests/core/test_wrapper_orders.py -->"
  pattern = re.compile(f"({re.escape(start)}\n)(.*?)(\n<!-- /wrapper-orders -->)", re.S)
  match = pattern.search(text)
  assert match, f"{PAGE} has no wrapper-orders block"
  if os.environ.get("OPTCORE_WRITE_DOCS") == "1":
    PAGE.write_text(pattern.sub(lambda m: m[1] + markdown_table() + m[3], text))
    return
  assert match[2] == markdown_table(), (
    "the page's table of wrapper orders is stale; rewrite it with OPTCORE_WRITE_DOCS=1 pytest "
    "tests/core/test_wrapper_orders.py"
  )


@pytest.mark.parametrize(
  "make",
  [
    lambda: optcore.ema(optcore.accumulate(optcore.ema(optcore.sgd(0.1)), every=2)),
    lambda: optcore.ema(optcore.MultiOptimizer(("w", optcore.ema(optcore.sgd(0.1))))),
    lambda: optcore.accumulate(optcore.ema(optcore.accumulate(optcore.sgd(0.1), 2)), 2),
    lambda: optcore.mixed_precision(
      optcore.ema(optcore.mixed_precision(optcore.sgd(0.1), state_dtype=BF16)), state_dtype=BF16
    ),
  ],
  ids=["ema-accumulate-ema", "ema-of-a-group-with-ema", "accumulate-twice", "mixed-twice"],
)
def test_a_wrapper_twice_anywhere_in_one_chain_is_refused_naming_both(make):
  with pytest.raises(TypeError, match=r"wraps (ema|accumulate|mixed_precision) twice"):
    make()


@pytest.mark.parametrize(
  ("accumulator", "param", "grad"),
  [(BF16, F32, F32), (F32, BF16, BF16), (F32, jnp.complex64, jnp.complex64)],
  ids=["bfloat16-accumulator-float32-grads", "float32-of-bfloat16", "complex"],
)
def test_an_accumulator_keeps_its_dtype_through_a_fori_loop(accumulator, param, grad):
  """accumulate(adam, every=2, dtype=bfloat16) with float32 gradients turned its accumulator
  float32 after one call: lax.fori_loop refused the changed carry."""
  p = {"w": jnp.ones((3,), param)}
  opt = optcore.accumulate(optcore.sgd(0.1), every=2, dtype=accumulator).create(p)
  kept = opt.state.param_states.accumulated["w"].dtype
  g = {"w": jnp.full((3,), 1 + 1j if jnp.issubdtype(grad, jnp.complexfloating) else 1.0, grad)}
  opt = jax.lax.fori_loop(0, 3, lambda _, o: o.apply_gradient(g), opt)  # mid-window after 3
  assert opt.state.param_states.accumulated["w"].dtype == kept
  np.testing.assert_allclose(np.asarray(opt.state.param_states.accumulated["w"]), g["w"])
  np.testing.assert_allclose(np.asarray(opt.target["w"]), np.asarray(p["w"] - 0.1 * g["w"]))
