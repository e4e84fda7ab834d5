"""Dion against its authors' code: the trajectories in `tests/reference_data/dion_reference.npz`
(written by `make_dion_reference.py` from microsoft/dion's ``dion_reference.py`` on torch
2.13.0, CPU), through ``create().apply_gradient`` and through ``as_optax()``, each under
``jax.jit`` and from the reference's initial ``Q``; then what Dion promises beyond them.

Tolerance (measured): the largest distance from the reference over every case, step and leaf
is 1.2e-6 (the randomized cases, which draw other sketches than torch's; ``qr``, a Householder
QR and matrix products in another summation order, 9.5e-7), the same under XLA's default,
``SSE4_2`` and ``AVX`` instruction sets. ``ATOL`` is five times that.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec
from reference_runs import as_jax, check_as_optax, check_core_face

import optcore

sys.path.insert(0, str(Path(__file__).parents[1] / "reference_data"))
from dion_inputs import CASES, MATRICES, STEPS, case_inputs

REFERENCE = np.load(Path(__file__).parents[1] / "reference_data" / "dion_reference.npz")
ATOL = 6e-6  # 5 x the largest measured distance (1.2e-6), on every instruction set tried


def definition(name: str) -> optcore.OptimizerDef:
  """The case as an optcore user writes it: the reference's names, ``lr`` and ``betas`` as
  optax spells them, the other group's algorithm as ``scalar_algorithm``."""
  kwargs, algorithm = CASES[name]
  kwargs = dict(kwargs)
  if "lr" in kwargs:
    kwargs["learning_rate"] = kwargs.pop("lr")
  if "betas" in kwargs:
    kwargs["b1"], kwargs["b2"] = kwargs.pop("betas")
  return optcore.contrib.dion(**kwargs, scalar_algorithm=algorithm)


def with_reference_q(state: optcore.contrib.DionState, name: str) -> optcore.contrib.DionState:
  """The state with the reference's initial ``Q`` (torch's ``randn``) in place of optcore's."""
  q = {**state.q, **{k: jnp.asarray(REFERENCE[f"{name}/q0/{k}"]) for k in MATRICES}}
  return state._replace(q=q)


@pytest.mark.parametrize("name", sorted(CASES))
def test_create_apply_gradient_matches_the_authors_code(name):
  params, grads = case_inputs(name)
  opt = definition(name).create(as_jax(params))
  state = opt.state.replace(param_states=with_reference_q(opt.state.param_states, name))
  opt = check_core_face(REFERENCE, ATOL, name, opt.replace(state=state), grads)
  assert int(opt.state.step) == STEPS


@pytest.mark.parametrize("name", sorted(CASES))
def test_as_optax_matches_the_authors_code(name):
  params, grads = case_inputs(name)
  params = as_jax(params)
  tx = definition(name).as_optax()
  state = with_reference_q(tx.init(params), name)
  check_as_optax(REFERENCE, ATOL, name, tx, state, params, grads)


def test_the_state_has_the_references_shapes():
  """``Q`` is ``min(m, n) x r`` (the reference's ``(n, r)``, or ``(m, r)`` transposed), r from
  rank_fraction rounded up to rank_multiple_of; AdamW's variance only off the matrices."""
  params, _ = case_inputs("rank_multiple")  # rank 0.3 * min, rounded up to a multiple of 2
  state = definition("rank_multiple").create(as_jax(params)).state.param_states
  assert state.q["w"].shape == (4, 2) and state.q["v"].shape == (3, 2)
  for k in MATRICES:
    np.testing.assert_array_equal(REFERENCE[f"rank_multiple/q0/{k}"].shape, state.q[k].shape)
  assert state.variance["b"].shape == (4,) and state.variance["w"].shape == ()


def test_the_three_qr_methods_give_one_update():
  """Householder, randomized Cholesky and Cholesky QR differ in column signs and rounding,
  which the update does not see: one step from one state, each method (the spread measured:
  3e-7 on parameters of order 1)."""
  params, grads = case_inputs("defaults")
  out = {}
  for method in ("qr", "rcqr", "cqr"):
    opt = optcore.contrib.dion(learning_rate=0.05, qr_method=method, cqr_warmup_steps=0)
    opt = opt.create(as_jax(params))
    for grad in grads[:3]:
      opt = opt.apply_gradient(as_jax(grad))
    out[method] = opt.target["w"]
  np.testing.assert_allclose(out["rcqr"], out["qr"], atol=2e-6)
  np.testing.assert_allclose(out["cqr"], out["qr"], atol=2e-6)


def test_a_zero_gradient_moves_only_by_decay():
  """The reference's all-zero guard: ``P`` is zero, ``R`` is the old ``Q`` (so the new ``Q``
  is its columns normalised), and the parameters only decay."""
  params = {"w": jnp.ones((4, 3))}
  opt = optcore.contrib.dion(learning_rate=0.1, weight_decay=0.5).create(params)
  q = opt.state.param_states.q["w"]
  opt = opt.apply_gradient({"w": jnp.zeros((4, 3))})
  expected = q / (np.linalg.norm(q, axis=0, keepdims=True) + 1e-8)
  np.testing.assert_allclose(opt.state.param_states.q["w"], expected, rtol=1e-6)
  np.testing.assert_allclose(opt.target["w"], 1 - 0.1 * 0.5, rtol=1e-6)


def test_stacked_matrices_from_logical_axes_are_separate_matrices():
  """A ``(layers, embed, mlp)`` leaf with its logical axes is one Dion matrix per layer: each
  layer moves as that matrix alone does (the same ``Q``, the same Householder QR)."""
  rng = np.random.default_rng(0)
  stacked = {"w": jnp.asarray(rng.normal(size=(2, 5, 3)), jnp.float32)}
  grad = {"w": jnp.asarray(rng.normal(size=(2, 5, 3)), jnp.float32)}
  axes = {"w": PartitionSpec("layers", "embed", "mlp")}
  opt_def = optcore.contrib.dion(learning_rate=0.1, qr_method="qr", param_logical_axes=axes)
  opt = opt_def.create(stacked)
  q = opt.state.param_states.q["w"]
  assert q.shape == (2, 3, 3)
  opt = opt.apply_gradient(grad)
  for layer in range(2):
    alone = optcore.contrib.dion(learning_rate=0.1, qr_method="qr")
    one = alone.create({"w": stacked["w"][layer]})
    states = one.state.param_states._replace(q={"w": q[layer]})
    one = one.replace(state=one.state.replace(param_states=states))
    one = one.apply_gradient({"w": grad["w"][layer]})
    # atol: a vmapped QR and matrix products against unbatched ones, 1e-7 measured
    np.testing.assert_allclose(opt.target["w"][layer], one.target["w"], atol=1e-6)
  # without axes the 3-D leaf is not a matrix: the scalar algorithm takes it
  plain = optcore.contrib.dion(learning_rate=0.1).create(stacked)
  assert plain.state.param_states.q["w"].shape == ()


def test_the_sketch_key_moves_every_step():
  params = {"w": jnp.ones((6, 2))}
  opt = optcore.contrib.dion().create(params)
  keys = [opt.state.param_states.key]
  for _ in range(2):
    opt = opt.apply_gradient({"w": jnp.arange(12.0).reshape(6, 2)})
    keys.append(opt.state.param_states.key)
  assert len({tuple(np.asarray(k)) for k in keys}) == 3


def test_config_state_dict_and_donated_step():
  """Configs as data; a restored run continues bit for bit; a donated step runs."""
  opt_def = definition("cqr_lion")
  assert optcore.config.from_config(optcore.config.to_config(opt_def)) == opt_def
  params, grads = case_inputs("cqr_lion")
  opt = opt_def.create(as_jax(params))
  for grad in grads[:4]:
    opt = opt.apply_gradient(as_jax(grad))
  restored = opt_def.create(as_jax(params)).restore_state(opt.state_dict())
  a, b = (o.apply_gradient(as_jax(grads[4])) for o in (opt, restored))
  for x, y in zip(jax.tree.leaves(a.target), jax.tree.leaves(b.target), strict=True):
    np.testing.assert_array_equal(x, y)
  step = jax.jit(lambda opt, g: opt.apply_gradient(g), donate_argnums=(0,))
  for grad in grads[:2]:
    opt = step(opt, as_jax(grad))
  assert int(opt.state.step) == 6


def test_low_bit_state_quantizes_the_moments_only():
  """The momentum (signed) and AdamW's variance (unsigned) are moments; ``Q``, a basis, and
  the key stay as they are."""
  params = {"w": jnp.ones((64, 64)), "b": jnp.ones(4096)}
  opt = optcore.low_bit_state(optcore.contrib.dion(), bits=8).create(params)
  inner = opt.state.param_states.inner
  quantized = lambda x: isinstance(x, optcore.QuantizedArray)
  assert quantized(inner.momentum["w"]) and quantized(inner.momentum["b"])
  assert quantized(inner.variance["b"]) and not quantized(inner.q["w"])
  assert inner.q["w"].dtype == jnp.float32


@pytest.mark.parametrize(
  ("kwargs", "message"),
  [
    ({"rank_fraction": 0.0}, "rank_fraction must be a number in \\(0, 1\\]"),
    ({"qr_method": "svd"}, "qr_method must be one of"),
    ({"scalar_algorithm": "sgd"}, "scalar_algorithm must be one of"),
    ({"power_iters": 0}, "power_iters must be an integer >= 1"),
  ],
)
def test_bad_settings_name_the_setting(kwargs, message):
  with pytest.raises(ValueError, match=message):
    optcore.contrib.dion(**kwargs).create({"w": jnp.ones((2, 2))})
