"""The table the composition-matrix tests are generated from (one device and the 8-device mesh):
the wrappers, the algorithms they wrap, the orders tried, and the training data. A new wrapper
joins every composition test by one line in `WRAPPERS`.

Each wrapper is tried alone on every Python; the ordered pairs run with
``OPTCORE_FULL_MATRIX=1``, what ``nox -s tests`` sets on the newest Python only (the matrix is
optcore's own logic, the same on every Python): see `CASES` and `ORDERS`."""

from __future__ import annotations

import itertools
import os

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import optcore

BF16, F32 = jnp.bfloat16, jnp.float32
WRAPPERS = {
  "accumulate": lambda d: optcore.accumulate(d, every=2),
  "ema": lambda d: optcore.ema(d, 0.9),
  "mixed_precision": lambda d: optcore.mixed_precision(d, state_dtype=BF16, master_dtype=F32),
  "skip_bad_steps": lambda d: optcore.skip_bad_steps(d, window=4, warmup=2),
  "with_statistics": lambda d: optcore.with_statistics(d),
  # Blocks of three (a row of the kernel) and no small-tensor floor: the parameters are tiny.
  "low_bit_state": lambda d: optcore.low_bit_state(d, bits=8, block_size=3, min_size=0),
  "stochastic_rounding": lambda d: optcore.stochastic_rounding(d, seed=1),
  "cautious": lambda d: optcore.cautious(d),
  # A short warm-up: the five calls reach the moving averages.
  "zclip": lambda d: optcore.zclip(d, warmup_steps=2),
  # The bias at twice the kernel's rate: two runs of the wrapped step, a leaf from each.
  "multipliers": lambda d: optcore.multipliers(d, lr_mults=[("bias", 2.0)]),
  # Three heads: the kernel's columns a query, the bias a key; two heads above tau each call.
  "qk_clip": lambda d: optcore.qk_clip(
    d,
    1.0,
    query="kernel",
    key="bias",
    param_logical_axes={"kernel": P(None, "heads"), "bias": P("heads")},
  ),
  # Two replicas (`params_for`), an outer step every other call: calls 2 and 4 synchronise.
  "diloco": lambda d: optcore.diloco(d, every=2),
}
ALGORITHMS = {
  "adam": lambda: optcore.adam(1e-2),
  "multi": lambda: optcore.MultiOptimizer(
    ("kernel", optcore.adam(1e-2)), ("bias", optcore.sgd(1e-2, momentum=0.9))
  ),
}
# The wrappers whose order changes the numbers the state holds; skip_bad_steps and
# with_statistics observe a step, stochastic_rounding rounds its result.
STATE_CHANGING = ("accumulate", "ema", "mixed_precision", "low_bit_state")
FULL = os.environ.get("OPTCORE_FULL_MATRIX") == "1"
# The wrappers that shape the step's input or output (cautious masks the update, zclip scales
# the gradient, multipliers set the rates) are paired with the state-changing ones only: their
# pairs with the observers
# (skip_bad_steps, with_statistics, stochastic_rounding) repeat programs the matrix has.
SHAPING = ("cautious", "zclip", "multipliers", "qk_clip", "diloco")
# Orders refused at construction, by design: qk_clip around accumulate would rescale the heads on
# every micro-batch's call (tests/core/test_qk_clip.py checks the refusal).
REFUSED = {("qk_clip", "accumulate")}
# Alone only in the whole matrix, for now: with their 133 pair rows the newest Python's 8-device
# run twice crashed XLA (a segfault compiling or serialising a conformance program, never
# alone); their pairs passed (63 and 70, every face and orbax) when run by themselves.
SINGLES_ONLY = ("qk_clip", "diloco")
SINGLES = [(w,) for w in WRAPPERS]
PAIRS = [
  pair
  for pair in itertools.permutations(WRAPPERS, 2)
  if (not set(pair) & set(SHAPING) or set(pair) & set(STATE_CHANGING))
  and pair not in REFUSED
  and not set(pair) & set(SINGLES_ONLY)
]
CHANGING_PAIRS = list(itertools.permutations(STATE_CHANGING, 2))
# (order, algorithm) on one device. Every Python: each wrapper alone around each algorithm. The
# whole matrix (the newest Python, one session, as heavy matrices run): every ordered pair
# around adam, and the pairs that change the state's numbers around a MultiOptimizer too (the
# triples: tests/core/test_wrapper_orders.py).
CASES = [(order, a) for order in SINGLES for a in ALGORITHMS]
if FULL:
  CASES += [(order, "adam") for order in PAIRS]
  CASES += [(order, "multi") for order in CHANGING_PAIRS]
# The orders on the 8-device mesh (around adam): each wrapper's state placed alone, and in the
# whole matrix the pairs that change the state's numbers.
ORDERS = SINGLES + (CHANGING_PAIRS if FULL else [])
CALLS = 5  # every=2: the last call is in the middle of a window
#: The faces of tests/conformance/test_composition_matrix.py are `faces.FACES` up to this one;
#: test_composition_matrix_faces.py has the rest (two files: two pytest-xdist workers).
FACES_IN_FIRST_FILE = 3


def build(order: tuple[str, ...], algorithm: str = "adam") -> optcore.OptimizerDef:
  """``algorithm`` wrapped in ``order``, outermost first."""
  opt_def = ALGORITHMS[algorithm]()
  for name in reversed(order):
    opt_def = WRAPPERS[name](opt_def)
  return opt_def


def params():
  return {
    "kernel": (jnp.arange(6.0).reshape(2, 3) / 6).astype(BF16),
    "bias": jnp.array([0.1, -0.2, 0.3], BF16),
  }


def grads(i: int):
  key = jax.random.key(i)
  return {
    "kernel": jax.random.normal(key, (2, 3), BF16),
    "bias": jax.random.normal(jax.random.fold_in(key, 1), (3,), BF16),
  }


def order_id(order: tuple[str, ...], algorithm: str = "adam") -> str:
  return "(".join(order) + f"({algorithm})" + ")" * (len(order) - 1)


def case_id(case) -> str:
  return order_id(*case)


REPLICAS = 2


def params_for(opt_def) -> dict:
  """`params`, as ``opt_def`` takes them: stacked replicas where it declares that every
  parameter carries them (`OptimizerDef.stacked_replicas`: diloco), each starting equal."""
  if not opt_def.stacked_replicas:
    return params()
  return jax.tree.map(lambda p: jnp.stack([p] * REPLICAS), params())


def grads_for(opt_def, i: int) -> dict:
  """`grads` of call ``i``, stacked as `params_for` stacks: each replica's from its own data."""
  if not opt_def.stacked_replicas:
    return grads(i)
  return jax.tree.map(lambda *g: jnp.stack(g), *(grads(i + 100 * r) for r in range(REPLICAS)))


def qk_logits(i: int) -> dict:
  """Call ``i``'s per-head maximum logits for the ``qk_clip`` row (the model is the module)."""
  return {"": jnp.array([2.0 + i, 0.5, 1.5], F32)}


def step_arguments(opt_def, face_name: str, i: int) -> dict:
  """The keywords of call ``i``'s step in a face: the extra arguments ``opt_def`` declares it
  reads (`OptimizerDef.extra_arg_names`), in the face's own spelling (the NNX face's and
  optax's ``update(..., qk_logits=...)``, every other's ``extra_args=``)."""
  reads = opt_def.extra_arg_names()
  if reads is None or "qk_logits" not in reads:
    return {}
  extra = {"qk_logits": qk_logits(i)}
  return extra if face_name == "nnx" else {"extra_args": extra}


def train(face, opt_def, calls=CALLS, handle=None):
  """``calls`` jitted steps of ``opt_def`` in ``face`` from `params` (or on from ``handle``)."""
  handle = face.create(opt_def, params_for(opt_def)) if handle is None else handle
  step = face.jit(face.step)
  for i in range(calls):
    handle = step(handle, grads_for(opt_def, i), step_arguments(opt_def, face.name, i))
  return handle


def check_face(case, face, core) -> None:
  """``case`` trained in ``face`` gives the core face's run ``core`` bitwise (parameters, state
  dict, moving average); a fresh handle restored from its state dict continues as the
  uninterrupted run does."""
  from tree_testing import assert_trees_equal

  opt_def = build(*case)
  handle = train(face, opt_def)
  assert_trees_equal(face.params(handle), core.target)
  assert_trees_equal(face.state_dict(handle)["state"], core.state_dict()["state"])
  if face.ema_params is not None and "ema" in case[0]:
    assert_trees_equal(face.ema_params(handle), core.ema_params)
  fresh = face.restore(face.create(opt_def, face.params(handle)), face.state_dict(handle))
  step = face.jit(face.step)
  more, g = step_arguments(opt_def, face.name, CALLS), grads_for(opt_def, CALLS)
  assert_trees_equal(face.params(step(fresh, g, more)), face.params(step(handle, g, more)))
