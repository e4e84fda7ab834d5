"""Cautious AdamW and Lion, MARS, NorMuon and ZClip against their authors' own code: the
trajectories in `tests/reference_data/field_reference.npz` (written by
`make_field_reference.py` from C-Optim, MARS, NorMuon and ZClip on torch 2.13.0, CPU), through
``create().apply_gradient`` and through ``as_optax()``, each under ``jax.jit``; then what each
promises beyond the numbers.

Tolerance (measured): the largest distance from the reference over every case, step and
leaf is 1.9e-6 (NorMuon with decay: five float32 Newton-Schulz steps and two norms in another
summation order; cautious Lion 1.2e-6, cautious AdamW 1.0e-6, where optax adds ``eps`` after
the bias correction and C-Optim before it), under XLA's default, ``SSE4_2`` and ``AVX``
instruction sets alike. ``ATOL`` is four times that.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference_runs import as_jax, check_as_optax, check_core_face

import optcore

sys.path.insert(0, str(Path(__file__).parents[1] / "reference_data"))
from field_inputs import CASES, SPIKES, STEPS, case_inputs

REFERENCE = np.load(Path(__file__).parents[1] / "reference_data" / "field_reference.npz")
ATOL = 8e-6  # 4 x the largest measured distance (1.9e-6), on every instruction set tried


def definition(name: str) -> optcore.OptimizerDef:
  """The case as an optcore user writes it, the reference's defaults spelled out where
  optax's differ (C-Optim's AdamW: eps 1e-6; its Lion: lr 1e-4, betas (0.95, 0.98), no
  decay; torch's AdamW: weight_decay 0.01)."""
  kind, kwargs, zclip_kwargs = CASES[name]
  kwargs = dict(kwargs)
  if kind == "c_adamw":
    b1, b2 = kwargs.get("betas", (0.9, 0.999))
    inner = optcore.adamw(
      kwargs["lr"], b1=b1, b2=b2, eps=kwargs.get("eps", 1e-6),
      weight_decay=kwargs.get("weight_decay", 0.0),
    )  # fmt: skip
    return optcore.cautious(inner)
  if kind == "c_lion":
    b1, b2 = kwargs.get("betas", (0.95, 0.98))
    inner = optcore.lion(
      kwargs.get("lr", 1e-4), b1=b1, b2=b2, weight_decay=kwargs.get("weight_decay", 0.0)
    )
    return optcore.cautious(inner, "sum_plus_one")
  if kind == "mars":
    if "lr" in kwargs:
      kwargs["learning_rate"] = kwargs.pop("lr")
    if "betas" in kwargs:
      kwargs["b1"], kwargs["b2"] = kwargs.pop("betas")
    return optcore.contrib.mars(**kwargs)
  if kind == "normuon":
    muon, adam = kwargs["muon"], kwargs["adam"]
    b1, b2 = adam.get("betas", (0.9, 0.95))
    return optcore.contrib.normuon(
      **({"learning_rate": muon["lr"]} if "lr" in muon else {}),
      **{k: v for k, v in muon.items() if k != "lr"},
      adam_learning_rate=adam.get("lr", 3e-4), adam_b1=b1, adam_b2=b2,
      adam_eps=adam.get("eps", 1e-10), adam_weight_decay=adam.get("weight_decay", 0.0),
    )  # fmt: skip
  if kind == "sgd":
    inner = optcore.sgd(kwargs["lr"])
  else:
    inner = optcore.adamw(
      kwargs["lr"], b1=0.9, b2=0.999, eps=1e-8, weight_decay=kwargs.get("weight_decay", 0.01)
    )
  return optcore.zclip(inner, **zclip_kwargs)


def test_the_committed_zclip_data_is_what_zclip_writes_now():
  """Run by ``nox -s reference``, where zclip from PyPI (its ``zclip.py`` the clone's, byte for
  byte) has just written the ZClip cases (``make_field_reference.py --zclip-only``)."""
  fresh = os.environ.get("OPTCORE_FIELD_REFERENCE")
  if not fresh:
    pytest.skip("needs the ZClip data zclip wrote in this run: nox -s reference")
  zclip_cases = {name for name in CASES if CASES[name][2] is not None}
  with np.load(fresh) as data:
    keys = [k for k in data.files if not k.startswith("meta/")]
    assert {k.split("/")[0] for k in keys} == zclip_cases
    for key in keys:
      # torch picks its CPU kernels by instruction set: the run without vectorization
      # (ATEN_CPU_CAPABILITY=default) is 1.2e-7 from the committed AVX-512 one, AVX2 equal
      np.testing.assert_allclose(REFERENCE[key], data[key], rtol=0, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("name", sorted(CASES))
def test_create_apply_gradient_matches_the_authors_code(name):
  params, grads = case_inputs(name)
  opt = check_core_face(REFERENCE, ATOL, name, definition(name).create(as_jax(params)), grads)
  assert int(opt.state.step) == STEPS


@pytest.mark.parametrize("name", sorted(CASES))
def test_as_optax_matches_the_authors_code(name):
  params, grads = case_inputs(name)
  params = as_jax(params)
  tx = definition(name).as_optax()
  check_as_optax(REFERENCE, ATOL, name, tx, tx.init(params), params, grads)


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if CASES[n][2] is not None])
def test_zclip_averages_follow_the_reference(name):
  """The moving mean (kept in float64 by the reference, float32 here) after every step."""
  params, grads = case_inputs(name)
  opt = definition(name).create(as_jax(params))
  for i, grad in enumerate(grads, start=1):
    opt = opt.apply_gradient(as_jax(grad))
    expected = REFERENCE[f"{name}/step{i}/zclip_mean"]
    kept = opt.state.param_states
    if np.isnan(expected):  # still warming up
      assert int(kept.seen) < CASES[name][2]["warmup_steps"]
    else:
      np.testing.assert_allclose(float(kept.mean), expected, rtol=1e-6)


def test_zclip_clips_the_spikes_it_is_built_for():
  """After the warm-up a step is clipped exactly where its z-score against the averages
  before it is above z_thresh (2.5); every spike of the inputs is."""
  params, grads = case_inputs("zclip_sgd")
  opt = definition("zclip_sgd").create(as_jax(params))
  warmup = CASES["zclip_sgd"][2]["warmup_steps"]
  for i, grad in enumerate(grads, start=1):
    before = opt.state.param_states
    opt = opt.apply_gradient(as_jax(grad))
    stats = optcore.statistics(opt)
    norm = float(stats["zclip/grad_norm"])
    clipped = float(stats["zclip/clip_norm"]) < norm
    if i <= warmup:
      assert not clipped, i  # every norm here is under max_grad_norm=1
      continue
    z = (norm - float(before.mean)) / (float(np.sqrt(before.var)) + 1e-6)
    assert clipped == (z > 2.5), (i, z)
    if SPIKES.get(i, 1.0) > 1:
      assert clipped, i


def test_cautious_never_masks_weight_decay():
  """A gradient that disagrees with every component of the step leaves the decay alone:
  adamw's step from momentum pointing the other way moves the parameters by -lr*wd*p only."""
  params = {"w": jnp.ones(4)}
  opt = optcore.cautious(optcore.adamw(0.1, weight_decay=0.5)).create(params)
  opt = opt.apply_gradient({"w": jnp.ones(4)})  # momentum along +1
  before = opt.target["w"]
  # a gradient of -1e-3: the momentum stays positive, the step disagrees in every component
  opt = opt.apply_gradient({"w": jnp.full(4, -1e-3)})
  np.testing.assert_allclose(opt.target["w"], before - 0.1 * 0.5 * before, rtol=1e-6)


def test_cautious_lion_mask_sum_plus_one():
  """C-Optim's c_lion rescaling, size / (kept + 1): all four kept gives 4/5, two of four
  (against the gradient) 4/3."""
  params = {"w": jnp.zeros(4)}
  opt = optcore.cautious(optcore.lion(0.1, weight_decay=0.0), "sum_plus_one").create(params)
  opt = opt.apply_gradient({"w": jnp.array([1.0, 1.0, -1.0, -1.0])})
  first = np.array([-0.08, -0.08, 0.08, 0.08])
  np.testing.assert_allclose(opt.target["w"], first, rtol=1e-6)
  # momentum [.01, .01, -.01, -.01]; a gradient of 1e-3 * [-1, 1, 1, -1]: lion's direction
  # follows the momentum, which agrees with the gradient at indices 1 and 3
  opt = opt.apply_gradient({"w": 1e-3 * jnp.array([-1.0, 1.0, 1.0, -1.0])})
  step = np.asarray(opt.target["w"]) - first
  # atol: float32 parameters of 0.08 differ from the float64 0.08 by 5.7e-9
  np.testing.assert_allclose(step, [0.0, -0.1 * 4 / 3, 0.0, 0.1 * 4 / 3], atol=1e-7)


@pytest.mark.parametrize(
  "opt_def",
  [
    optcore.cautious(optcore.adamw(1e-2, weight_decay=0.1)),
    optcore.zclip(optcore.adam(1e-2), warmup_steps=2),
    optcore.contrib.mars(learning_rate=1e-2, amsgrad=True),
  ],
  ids=["cautious", "zclip", "mars"],
)
def test_config_and_state_dict_round_trip(opt_def):
  """Configs as data and Flax-layout state dicts: a restored run continues bit for bit."""
  config = optcore.config.to_config(opt_def)
  assert optcore.config.from_config(config) == opt_def
  params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}
  grad = {"w": jnp.full((3, 2), 0.3), "b": jnp.full(2, -0.2)}
  opt = opt_def.create(params)
  for _ in range(3):
    opt = opt.apply_gradient(grad)
  restored = opt_def.create(params).restore_state(opt.state_dict())
  a, b = opt.apply_gradient(grad), restored.apply_gradient(grad)
  for x, y in zip(jax.tree.leaves(a.target), jax.tree.leaves(b.target), strict=True):
    np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name", ["c_adamw", "mars_amsgrad", "normuon_settings", "zclip_adamw"])
def test_a_donated_step_runs(name):
  """Every state array is a buffer of its own: a jitted step that donates the optimizer
  (as training loops do) runs, twice. ZClip's four scalars were once one array."""
  params, grads = case_inputs(name)
  opt = definition(name).create(as_jax(params))
  step = jax.jit(lambda opt, g: opt.apply_gradient(g), donate_argnums=(0,))
  for grad in grads[:2]:
    opt = step(opt, as_jax(grad))
  assert int(opt.state.step) == 2


def test_low_bit_state_quantizes_moments_not_last_grad():
  """MARS keeps the last gradient: a copy, not a moment, so low_bit_state leaves it float."""
  params = {"w": jnp.ones((64, 64))}
  opt = optcore.low_bit_state(optcore.contrib.mars(), bits=8).create(params)
  quantized = lambda x: isinstance(x, optcore.QuantizedArray)
  leaves = jax.tree.leaves(opt.state.param_states, is_leaf=quantized)
  assert sum(map(quantized, leaves)) == 2, leaves  # exp_avg and exp_avg_sq
  float_copies = [x for x in leaves if not quantized(x) and jnp.shape(x) == (64, 64)]
  assert len(float_copies) == 1 and float_copies[0].dtype == jnp.float32  # last_grad


def test_bad_arguments_say_what_to_do():
  with pytest.raises(ValueError, match="normalization must be one of"):
    optcore.cautious(optcore.adam(1e-3), "median")
  with pytest.raises(ValueError, match="mode must be one of"):
    optcore.zclip(optcore.adam(1e-3), mode="iqr")
  with pytest.raises(ValueError, match="second backward pass"):
    optcore.contrib.mars(is_approx=False).create({"w": jnp.ones((2, 2))})
  with pytest.raises(ValueError, match="mars-shampoo"):
    optcore.contrib.mars(mars_type="mars-shampoo").create({"w": jnp.ones((2, 2))})
  with pytest.raises(TypeError, match="twice"):
    optcore.zclip(optcore.zclip(optcore.adam(1e-3)))
