"""ZeRO-1 in the core: replicated parameters, every optimizer-state leaf split
over the data-parallel mesh axis, and the same numbers as the replicated run."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from optimizer_catalogue import CASES, Case, grads_and_extra
from sharding_setup import (
  AXES,
  REORDERED_TOLERANCE,
  RULES,
  comparable,
  make_params,
  param_shaped_leaves,
)

import optcore

FACTORED = Case("adafactor", {"learning_rate": 0.05, "min_dim_size_to_factor": 8})
# Per-element maths: splitting the state changes no operation. On jax 0.10 the numbers are
# bitwise equal; jax 0.12's compiler fuses the split step differently (measured: up to 1 ulp,
# 9.5e-7 absolute, on ~30% of the elements after 3 steps), so there they are compared to 1e-6.
BITWISE = jax.__version_info__ < (0, 11)
PER_ELEMENT = {"adam", "adamw", "adamax", "adamaxw", "amsgrad", "nadam", "nadamw", "lion", "sgd"}
PER_ELEMENT |= {"rmsprop", "adagrad", "adabelief", "yogi", "sign_sgd", "signum"}
# Elsewhere a reduction over a split dimension (a norm, a factored mean, an SVD) sums in another
# float32 order: 1e-6, and sharding_setup.REORDERED_TOLERANCE where the optimizer amplifies it.


@pytest.fixture(scope="module")
def mesh(cpu_devices):
  return Mesh(np.array(cpu_devices), ("data",))


def _step(case: Case):
  def step(opt):
    grads, extra = grads_and_extra(case, opt.target)
    return opt.apply_gradient(grads, extra_args=extra or None)

  return step


@pytest.mark.parametrize(
  "case", [*CASES, pytest.param(FACTORED, id="adafactor-factored")], ids=lambda c: c.name
)
def test_state_is_split_eight_ways_and_steps_equal_the_replicated_run(case, mesh):
  params = make_params()
  opt_def = case.optcore_factory()(**case.optcore_kwargs())
  zero1 = opt_def.create_sharded(params, mesh=mesh, state_axis="data")
  shardings = jax.tree.map(lambda x: x.sharding, zero1)
  assert shardings == opt_def.derive_shardings(zero1, mesh=mesh, state_axis="data")
  for leaf in jax.tree.leaves(zero1.target):
    assert leaf.sharding.is_fully_replicated
  # Every parameter-shaped state leaf: 1/8 of its bytes on each device.
  for path, leaf in param_shaped_leaves(zero1.state.param_states, params):
    shard = leaf.addressable_shards[0].data
    assert shard.nbytes * 8 == leaf.nbytes, path
  step = _step(case)
  zero1_step = jax.jit(step, in_shardings=(shardings,), out_shardings=shardings)
  plain, plain_step = opt_def.create(params), jax.jit(step)
  for _ in range(3):
    zero1, plain = zero1_step(zero1), plain_step(plain)
  for leaf in jax.tree.leaves(zero1.target):
    assert leaf.sharding.is_fully_replicated
  tol = REORDERED_TOLERANCE.get(case.name, 1e-6)
  for a, b in zip(jax.tree.leaves(zero1), jax.tree.leaves(plain), strict=True):
    if case.name in PER_ELEMENT and BITWISE:
      np.testing.assert_array_equal(comparable(a), comparable(b))
    else:
      np.testing.assert_allclose(comparable(a), comparable(b), rtol=tol, atol=tol)


def test_the_axis_goes_on_the_largest_free_dimension_and_composes_with_logical_axes(mesh):
  params = make_params()
  opt_def = optcore.adam(1e-3)
  opt = opt_def.create(params)
  plain = opt_def.derive_shardings(opt, mesh=mesh, state_axis="data")
  mu = plain.state.param_states[0].mu
  assert mu["dense"]["kernel"].spec == P(None, "data")  # (16, 32): the 32
  assert mu["attn"].spec == P(None, None, "data")  # (2, 8, 16): the 16
  assert plain.target["attn"].spec == P(None, None, None)
  # With a 2 x 4 mesh and logical axes, the state axis takes a dimension the model axis leaves.
  mesh2 = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "x"))
  both = opt_def.derive_shardings(opt, AXES, mesh2, RULES, state_axis="data")
  assert both.state.param_states[0].nu["dense"]["kernel"].spec == P("data", "x")
  assert both.target["dense"]["kernel"].spec == P(None, "x")


def test_leaves_it_cannot_split_stay_replicated_and_are_reported(mesh, caplog):
  params = {"w": jnp.zeros((16, 8)), "odd": jnp.zeros((3, 5))}
  opt_def = optcore.adam(1e-3)
  with caplog.at_level(logging.INFO, logger="optcore"):
    shardings = opt_def.derive_shardings(opt_def.create(params), mesh=mesh, state_axis="data")
  mu = shardings.state.param_states[0].mu
  assert mu["odd"].spec == P() or all(s is None for s in mu["odd"].spec)
  assert mu["w"].spec == P("data", None)
  assert "left 2 state leaves replicated" in caplog.text
  assert "['odd'] (3, 5)" in caplog.text


def test_a_state_axis_the_mesh_lacks_is_named(mesh):
  opt_def = optcore.adam(1e-3)
  with pytest.raises(optcore.PartitionRuleError, match="state_axis='batch' is not an axis"):
    opt_def.derive_shardings(opt_def.create(make_params()), mesh=mesh, state_axis="batch")
  with pytest.raises(TypeError, match="a mesh is required"):
    opt_def.create_sharded(make_params(), state_axis="data")


def test_a_state_split_checkpoint_restores_replicated(mesh):
  params = make_params()
  opt_def = optcore.adam(1e-3)
  zero1 = opt_def.create_sharded(params, mesh=mesh, state_axis="data")
  zero1 = zero1.apply_gradient(jax.tree.map(jnp.ones_like, params))
  restored = opt_def.create(params).restore_state(jax.device_get(zero1.state_dict()))
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(zero1), strict=True):
    np.testing.assert_array_equal(comparable(a), comparable(b))
  assert isinstance(zero1.state.param_states[0].mu["attn"].sharding, NamedSharding)


def assert_equal(a, b, err_msg: str) -> None:
  if BITWISE:
    np.testing.assert_array_equal(a, b, err_msg=err_msg)
  else:
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=err_msg)


def _grads(params):
  return jax.tree.map(lambda p: jnp.cos(p) * 0.1, params)


def test_every_face_splits_the_state_and_matches_the_replicated_core(mesh):
  import optcore_equinox
  import optcore_flax
  import optcore_treex

  params = make_params()
  opt_def = optcore.adamw(1e-2, weight_decay=0.1)
  core, core_step = opt_def.create(params), jax.jit(lambda o: o.apply_gradient(_grads(o.target)))
  for _ in range(3):  # jitted, as the faces are: eager steps round differently (no fusion)
    core = core_step(core)

  # Flax (Linen's logical partitioning helpers, here without axes: replicated params).
  flax_opt = optcore_flax.create_sharded(opt_def, params, mesh, state_axis="data")
  shardings = optcore_flax.optimizer_shardings(flax_opt, params, mesh, state_axis="data")
  flax_step = jax.jit(
    lambda o: o.apply_gradient(_grads(o.target)), in_shardings=(shardings,), out_shardings=shardings
  )
  for _ in range(3):
    flax_opt = flax_step(flax_opt)

  # Equinox.
  eqx_opt = optcore_equinox.Optimizer(opt_def, params).shard(params, mesh=mesh, state_axis="data")
  eqx_shardings = eqx_opt.shardings(params, mesh=mesh, state_axis="data")
  model = params

  @jax.jit
  def eqx_step(model, opt):
    model, opt = opt.update(_grads(model), model)
    return model, jax.lax.with_sharding_constraint(opt, eqx_shardings)

  for _ in range(3):
    model, eqx_opt = eqx_step(model, eqx_opt)

  # Treex.
  tx_opt = optcore_treex.Optimizer(opt_def).init(params).shard(params, mesh=mesh, state_axis="data")
  tx_shardings = tx_opt.shardings(params, mesh=mesh, state_axis="data")
  tx_params = params

  @jax.jit
  def tx_step(params, opt):
    params = opt.update(_grads(params), params)
    return params, jax.lax.with_sharding_constraint(opt, tx_shardings)

  for _ in range(3):
    tx_params, tx_opt = tx_step(tx_params, tx_opt)

  for name, new_params, state in (
    ("flax", flax_opt.target, flax_opt.state.param_states),
    ("equinox", model, eqx_opt.state.param_states),
    ("treex", tx_params, tx_opt.opt_state),
  ):
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(core.target), strict=True):
      assert_equal(np.asarray(a), np.asarray(b), err_msg=name)
    for path, leaf in param_shaped_leaves(state, params):
      assert leaf.addressable_shards[0].data.nbytes * 8 == leaf.nbytes, (name, path)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(core.state.param_states), strict=True):
      assert_equal(comparable(a), comparable(b), err_msg=name)
