"""ZeRO-1 splits the state, never the parameters: a plain ``jax.jit`` step (no
``out_shardings``) returns the parameters sharded as they were created, on an
8-device ('data', 'model') mesh. Without the constraint the compiler took the
update's sharding, so a kernel placed ``P(None, None, 'model')`` came back
``P(None, 'data', 'model')`` (issue 41)."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from sharding_setup import AXES, MODEL_RULES, grads_at, make_params
from tree_testing import assert_trees_within_ulps

import optcore
import optcore_equinox
import optcore_treex


@pytest.fixture(scope="module")
def mesh(cpu_devices):
  return Mesh(np.array(cpu_devices).reshape(4, 2), ("data", "model"))


def mesh_axes(spec: P) -> set[str]:
  return {a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry)}


def specs(tree):
  return jax.tree.map(lambda x: x.sharding, tree)


DEFINITIONS = {
  "adamw": lambda: optcore.adamw(1e-2, weight_decay=1e-3),
  "muon": lambda: optcore.contrib.muon(0.02),
  "accumulate+ema": lambda: optcore.ema(optcore.accumulate(optcore.adam(1e-2), every=2), 0.9),
}


@pytest.mark.parametrize("name", sorted(DEFINITIONS))
def test_a_plain_jit_step_keeps_the_parameters_sharding(name, mesh):
  params = make_params()
  opt = DEFINITIONS[name]().create_sharded(params, AXES, mesh, MODEL_RULES, state_axis="data")
  placed = specs(opt.target)
  assert placed["attn"].spec == P(None, None, "model")
  step = jax.jit(lambda o, g: o.apply_gradient(g))  # no in_ or out_shardings
  reference = DEFINITIONS[name]().create(params)
  if name == "muon":
    reference = DEFINITIONS[name]().with_param_logical_axes(AXES).create(params)
  for i in range(3):
    opt, reference = step(opt, grads_at(i, params)), step(reference, grads_at(i, params))
  for got, want in zip(jax.tree.leaves(opt.target), jax.tree.leaves(placed), strict=True):
    assert got.sharding.is_equivalent_to(want, got.ndim), (got.sharding, want)
  # The state keeps its ZeRO-1 split, and the numbers stay the one-device run's.
  state = jax.tree.leaves(opt.state.param_states)
  assert any("data" in mesh_axes(x.sharding.spec) for x in state if x.ndim)
  assert_trees_within_ulps(opt.target, reference.target, ulps=8)


def test_an_eager_step_keeps_them_too(mesh):
  params = make_params()
  opt = optcore.adam(1e-2).create_sharded(params, AXES, mesh, MODEL_RULES, state_axis="data")
  placed = specs(opt.target)
  opt = opt.apply_gradient(grads_at(0, params))
  for got, want in zip(jax.tree.leaves(opt.target), jax.tree.leaves(placed), strict=True):
    assert got.sharding.is_equivalent_to(want, got.ndim)


def test_a_grouped_optimizer_keeps_its_buffers_replicated(mesh):
  params = make_params()
  opt_def = optcore.grouped(optcore.adam(1e-2), max_leaf_size=600)  # the bias and kernel grouped
  opt = opt_def.create_sharded(params, mesh=mesh, state_axis="data")
  assert opt.packed_target.buffers
  opt = jax.jit(lambda o, g: o.apply_gradient(g))(opt, grads_at(0, params))
  for leaf in jax.tree.leaves(opt.packed_target):
    assert leaf.sharding.is_fully_replicated, leaf.sharding


def test_a_replaced_target_of_other_parameters_is_left_to_the_compiler(mesh):
  params = make_params()
  opt = optcore.sgd(0.1).create_sharded(params, AXES, mesh, MODEL_RULES, state_axis="data")
  other = {"w": jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("data", None)))}
  moved = optcore.sgd(0.1).create(other).replace(target_shardings=opt.target_shardings)
  moved = jax.jit(lambda o, g: o.apply_gradient(g))(moved, {"w": jnp.ones((8, 4))})
  np.testing.assert_allclose(moved.target["w"], 0.9)


def test_equinox_and_treex_steps_that_pin_the_parameters_keep_them_replicated(mesh):
  """The faces that hand the parameters back: the pattern the sharding page shows (pin the
  model in the step) holds on the mesh, and without the pin the parameters do drift, which is
  why the page shows it."""
  replicated = NamedSharding(mesh, P())
  model = eqx.filter_shard(eqx.nn.Linear(16, 8, key=jax.random.key(0)), replicated)
  opt = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
  opt = opt.shard(model, mesh=mesh, state_axis="data")
  grads = jax.tree.map(jnp.ones_like, model)

  @eqx.filter_jit
  def pinned(model, opt):
    model, opt = opt.update(grads, model)
    return eqx.filter_shard(model, replicated), opt

  @eqx.filter_jit
  def unpinned(model, opt):
    return opt.update(grads, model)

  assert pinned(model, opt)[0].weight.sharding.is_fully_replicated
  assert not unpinned(model, opt)[0].weight.sharding.is_fully_replicated

  params = jax.device_put({"w": jnp.ones((16, 8))}, replicated)
  tx = optcore_treex.Optimizer(optcore.adam(1e-2)).init(params)
  tx = tx.shard(params, mesh=mesh, state_axis="data")
  step = jax.jit(lambda tx, p: (tx.update({"w": jnp.ones((16, 8))}, p), tx))
  pinned_step = jax.jit(step, out_shardings=(replicated, None))
  assert pinned_step(tx, params)[0]["w"].sharding.is_fully_replicated
  assert not step(tx, params)[0]["w"].sharding.is_fully_replicated
