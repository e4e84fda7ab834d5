"""`optcore.diloco`: DiLoCo's numbers (the paper's Algorithm 1, as MaxText's ``diloco.py``
computes its outer step: the replicas' mean of ``global - local``, optax's Nesterov SGD, the
inner state kept across outer steps), written here in NumPy float64 as the reference; the
replicas' contract; configs, state dicts, and clear errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal, assert_trees_within_ulps

import optcore

REPLICAS, EVERY, STEPS = 3, 3, 8
LR, WD = 0.05, 1e-2
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9


def _data():
  rng = np.random.default_rng(0)
  params = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=(3,))}
  grads = [
    [{k: rng.normal(size=v.shape) for k, v in params.items()} for _ in range(REPLICAS)]
    for _ in range(STEPS)
  ]
  cast = lambda t: {k: np.asarray(v, np.float32) for k, v in t.items()}
  return cast(params), [[cast(g) for g in step] for step in grads]


def _reference() -> tuple[list[dict], dict]:
  """Algorithm 1 of arXiv 2311.08105: ``REPLICAS`` replicas from the same start, each taking
  optax's own AdamW step (the inner optimizer is not what is checked here: each replica's is
  optax's program, jitted), and every ``EVERY`` steps the outer step in NumPy float64: the
  outer gradient ``mean_r(theta - theta_r)``, Nesterov SGD (``trace = delta + m * trace``;
  ``theta -= lr * (delta + m * trace)``, PyTorch's and optax's form) and every replica back to
  ``theta``; each replica's moments and count kept (the paper's 6.1; MaxText keeps the inner
  state). Returns the replicas after every step and the global parameters at the end."""
  params, grads = _data()
  tx = optax.adamw(LR, weight_decay=WD)
  inner = jax.jit(lambda g, s, p: tx.update(g, s, p))
  theta = {k: v.astype(np.float64) for k, v in params.items()}
  local = [{k: jnp.asarray(v) for k, v in params.items()} for _ in range(REPLICAS)]
  states = [tx.init(local[0]) for _ in range(REPLICAS)]
  trace = {k: np.zeros_like(v) for k, v in theta.items()}
  history = []
  for t in range(1, STEPS + 1):
    for r in range(REPLICAS):
      g = {k: jnp.asarray(v) for k, v in grads[t - 1][r].items()}
      updates, states[r] = inner(g, states[r], local[r])
      local[r] = optax.apply_updates(local[r], updates)
    if t % EVERY == 0:
      for k in theta:
        delta = np.mean(
          [theta[k] - np.asarray(local[r][k], np.float64) for r in range(REPLICAS)], 0
        )
        trace[k] = delta + OUTER_MOMENTUM * trace[k]
        theta[k] = theta[k] - OUTER_LR * (delta + OUTER_MOMENTUM * trace[k])
      local = [{k: jnp.asarray(v, jnp.float32) for k, v in theta.items()} for _ in range(REPLICAS)]
    history.append({k: np.stack([np.asarray(local[r][k]) for r in range(REPLICAS)]) for k in theta})
  return history, theta


def _stacked(tree: dict) -> dict:
  return {k: jnp.stack([jnp.asarray(v)] * REPLICAS) for k, v in tree.items()}


def _run() -> tuple[list[dict], optcore.Optimizer]:
  params, grads = _data()
  opt_def = optcore.diloco(optcore.adamw(LR, weight_decay=WD), every=EVERY)
  opt = opt_def.create(_stacked(params))
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  history = []
  for t in range(STEPS):
    g = {k: jnp.stack([jnp.asarray(grads[t][r][k]) for r in range(REPLICAS)]) for k in params}
    opt = step(opt, g)
    history.append(opt.target)
  return history, opt


def test_the_papers_algorithm_with_adamw_inside():
  """Every replica after every step, and the global parameters, within 2 ulps (of each leaf's
  largest value) of Algorithm 1 with its outer step in float64: the difference is the float32
  rounding of the outer step; measured at most 0.5 ulp (the default instruction set and SSE4_2,
  jax 0.10.2 and 0.12)."""
  got, opt = _run()
  ref, theta = _reference()
  for t in range(STEPS):
    for k in ref[t]:
      ulp = np.spacing(np.float32(np.max(np.abs(ref[t][k]))))
      err = np.max(np.abs(np.asarray(got[t][k], np.float64) - ref[t][k]))
      assert err <= 2 * ulp, (t, k, err / ulp)
  anchor = optcore.diloco(optcore.adamw(LR), every=EVERY).global_params(opt.state)
  for k in theta:
    ulp = np.spacing(np.float32(np.max(np.abs(theta[k]))))
    assert np.max(np.abs(np.asarray(anchor[k], np.float64) - theta[k])) <= 2 * ulp


def test_replicas_restart_equal_and_diverge_between():
  got, opt = _run()
  for t in range(STEPS):
    equal = all(bool(jnp.all(v == v[0][None])) for v in got[t].values())
    assert equal == ((t + 1) % EVERY == 0), t
  assert int(opt.state.param_states.outer_step) == STEPS // EVERY
  assert int(opt.state.step) == STEPS


def test_one_replica_every_step_with_a_unit_outer_step_is_the_inner_run():
  """The outer step ``theta - 1.0 * (theta - local)`` with no momentum: the inner optimizer's
  own trajectory (to the ulp the subtraction rounds)."""
  params, grads = _data()
  opt_def = optcore.diloco(optcore.adam(LR), every=1, outer=optcore.sgd(1.0))
  one = {k: jnp.asarray(v)[None] for k, v in params.items()}
  opt, plain = (
    opt_def.create(one),
    optcore.adam(LR).create({k: jnp.asarray(v) for k, v in params.items()}),
  )
  for t in range(4):
    g = {k: jnp.asarray(v) for k, v in grads[t][0].items()}
    opt = opt.apply_gradient({k: v[None] for k, v in g.items()})
    plain = plain.apply_gradient(g)
  assert_trees_within_ulps({k: v[0] for k, v in opt.target.items()}, plain.target)


def test_config_and_state_dict_round_trip():
  opt_def = optcore.diloco(optcore.adamw(1e-3), every=50, outer=optcore.sgd(0.5, momentum=0.8))
  config = optcore.config.to_config(opt_def)
  assert config["every"] == 50 and config["outer"]["name"] == "sgd"
  assert optcore.config.from_config(config) == opt_def
  default = optcore.diloco(optcore.adamw(1e-3), every=50)
  assert "outer" not in optcore.config.to_config(default)
  assert optcore.config.from_config(optcore.config.to_config(default)) == default
  _, opt = _run()
  fresh = optcore.diloco(optcore.adamw(LR, weight_decay=WD), every=EVERY).create(
    jax.tree.map(jnp.zeros_like, opt.target)
  )
  assert_trees_equal(fresh.restore_state(opt.state_dict()).state, opt.state)


def test_logical_axes_name_the_replicas_axis():
  """Every inner state leaf takes the replicas' entry first and one replica's axes after; the
  global parameters and the outer state take one replica's; the counts are replicated."""
  params = {"w": jnp.ones((2, 4, 3)), "b": jnp.ones((2, 3))}
  axes = {"w": P("replica", "embed", "mlp"), "b": P("replica", "mlp")}
  opt_def = optcore.diloco(optcore.adam(1e-3), every=4)
  derived = opt_def.derive_logical_axes(opt_def.create(params), axes).state.param_states
  adam = derived.inner[0]
  assert adam.mu == {"w": P("replica", "embed", "mlp"), "b": P("replica", "mlp")}
  assert adam.count == P("replica")
  assert derived.anchor == {"w": P("embed", "mlp"), "b": P("mlp")}
  assert derived.outer[0].trace == {"w": P("embed", "mlp"), "b": P("mlp")}
  assert derived.outer_step == P()


def test_bad_input_is_named():
  with pytest.raises(optcore.ArgumentError, match=r"every must be"):
    optcore.diloco(optcore.adam(1e-3), every=0)
  with pytest.raises(TypeError, match=r"outer must be an optimizer definition"):
    optcore.diloco(optcore.adam(1e-3), every=2, outer=0.7)
  with pytest.raises(ValueError, match=r"leading sizes \['2', '3'\].*broadcast_to"):
    optcore.diloco(optcore.adam(1e-3), every=2).create({"w": jnp.ones((2, 3)), "b": jnp.ones(3)})
  with pytest.raises(TypeError, match=r"wraps diloco twice"):
    optcore.diloco(optcore.diloco(optcore.adam(1e-3), every=2), every=2)
