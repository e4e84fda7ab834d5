"""Every optax and contrib optimizer, sharded 8 ways: created sharded, stepped
with in and out shardings, equal to the unsharded run."""

from __future__ import annotations

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


def _definition(case: Case) -> optcore.OptimizerDef:
  return case.optcore_factory()(**case.optcore_kwargs())


def _step(case: Case):
  def step(opt):
    grads, extra = grads_and_extra(case, opt.target)
    return opt.apply_gradient(grads, extra_args=extra or None)

  return step


@pytest.fixture(scope="module")
def mesh(cpu_devices):
  return Mesh(np.array(cpu_devices), ("x",))


@pytest.mark.parametrize(
  "case", [*CASES, pytest.param(FACTORED, id="adafactor-factored")], ids=lambda c: c.name
)
def test_sharded_steps_equal_unsharded_steps(case, mesh):
  params = make_params()
  opt_def = _definition(case)
  step = _step(case)

  sharded = opt_def.create_sharded(params, AXES, mesh, RULES)
  shardings = jax.tree.map(lambda x: x.sharding, sharded)
  assert shardings == opt_def.derive_shardings(sharded, AXES, mesh, RULES)
  sharded_step = jax.jit(step, in_shardings=(shardings,), out_shardings=shardings)
  # create_sharded tells a definition that reads them the axes (contrib.muon's matrices):
  # the unsharded run gets the same algorithm.
  plain = opt_def.with_param_logical_axes(AXES).create(params)
  plain_step = jax.jit(step)
  for _ in range(3):
    sharded, plain = sharded_step(sharded), plain_step(plain)

  tol = REORDERED_TOLERANCE.get(case.name, 1e-6)
  for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain), strict=True):
    np.testing.assert_allclose(comparable(a), comparable(b), rtol=tol, atol=tol)
  # Every parameter-shaped state leaf is split 8 ways: each device holds 1/8.
  state_leaves = param_shaped_leaves(sharded.state.param_states, params)
  assert state_leaves or case.name in {
    "fromage",
    "noisy_sgd",
    "polyak_sgd",
    "sign_sgd",
    "contrib.dpsgd",
  }
  for path, leaf in state_leaves:
    per_device = {shard.data.nbytes for shard in leaf.addressable_shards}
    assert per_device == {leaf.nbytes // 8}, (path, leaf.shape, leaf.sharding)


@pytest.mark.parametrize("case", [CASES[[c.name for c in CASES].index("adam")], FACTORED])
def test_no_device_ever_holds_the_whole_state(case, mesh):
  """The compiled sharded create writes 1/8 of the state per device, with no
  temporary buffer the size of the state."""
  params = make_params()
  opt_def = _definition(case)
  abstract = jax.eval_shape(opt_def.create, params)
  shardings = opt_def.derive_shardings(abstract, AXES, mesh, RULES)
  replicated = jax.tree.map(lambda _: NamedSharding(mesh, P()), abstract)
  total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract))
  scalars = sum(x.dtype.itemsize for x in jax.tree.leaves(abstract) if x.ndim == 0)

  def compiled(out_shardings):
    return jax.jit(opt_def.create, out_shardings=out_shardings).lower(params).compile()

  sharded = compiled(shardings).memory_analysis()
  full = compiled(replicated).memory_analysis()
  assert full.output_size_in_bytes >= total
  # Only the parameter-shaped leaves split; v_row/v_col of a factored state
  # keep their unsplit dimension and are accounted for below.
  split = sum(
    leaf.size * leaf.dtype.itemsize // 8
    if any(entry is not None for entry in spec.spec)
    else leaf.size * leaf.dtype.itemsize
    for leaf, spec in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings), strict=True)
  )
  pointer_table = 8 * len(jax.tree.leaves(abstract))  # the output tuple's buffer table
  assert sharded.output_size_in_bytes <= split + scalars + pointer_table
  assert sharded.output_size_in_bytes < total / 4
  assert sharded.temp_size_in_bytes < total / 8


def test_a_dimension_the_mesh_does_not_divide_names_the_leaf(mesh):
  params = {**make_params(), "odd": np.zeros((3, 12), np.float32)}
  axes = {**AXES, "odd": P("mlp", None)}
  with pytest.raises(
    optcore.PartitionRuleError, match=r"'/state/param_states/0/mu/odd'.*size 3.*8 ways"
  ):
    optcore.adam(0.1).create_sharded(params, axes, mesh, RULES)


def test_multi_optimizer_is_created_sharded_through_its_groups(mesh):
  params = make_params()
  opt_def = optcore.MultiOptimizer(
    (r"kernel", optcore.adafactor(0.05, min_dim_size_to_factor=8)),
    (r"bias|attn", optcore.adam(0.05)),
  )
  opt = opt_def.create_sharded(params, AXES, mesh, RULES)
  factored, adam = opt.state.param_states
  assert factored[0].v_col["dense"]["kernel"].sharding.spec == P("x")
  assert adam[0].mu["attn"].sharding.spec == P(None, None, "x")
  assert adam[0].mu["dense"]["kernel"] is None


def test_equinox_optimizer_shards_its_state_from_model_specs(mesh):
  eqx = pytest.importorskip(
    "equinox", reason="needs optcore-equinox (the nox variant all installs it)"
  )
  import optcore_equinox

  model = eqx.nn.MLP(16, 32, width_size=64, depth=1, key=jax.random.key(0))
  specs = jax.tree.map(
    lambda x: P("x", *(None,) * (x.ndim - 1)) if eqx.is_array(x) else None, model
  )
  opt = optcore_equinox.Optimizer(optcore.adam(1e-2), model).shard(model, specs, mesh)
  for leaf in jax.tree.leaves(opt.state.param_states[0].mu):
    assert {s.data.nbytes for s in leaf.addressable_shards} == {leaf.nbytes // 8}
  model = eqx.filter_shard(model, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))

  @eqx.filter_jit
  def step(model, opt):
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(16)) ** 2))(model)
    return opt.update(grads, model)

  _, new_opt = step(model, opt)
  assert new_opt.state.param_states[0].nu.layers[0].weight.sharding.spec == P("x", None)


def test_adafactor_on_a_sharded_nnx_model(mesh):
  """Upstream, nnx.Optimizer copies each param's sharding onto optax's factored
  accumulators and fails on their lower rank; optcore's transformation works."""
  nnx = pytest.importorskip(
    "flax.nnx", reason="needs optcore-flax (the nox variant all installs it)"
  )
  import optcore_flax  # noqa: F401  (registers nnx Variables as boxes)

  def make_model(sharded: bool):
    init = nnx.initializers.lecun_normal()
    if sharded:  # created inside the mesh: flax shards it as it is made
      init = nnx.with_partitioning(init, (None, "x"))
    return nnx.Linear(16, 32, kernel_init=init, rngs=nnx.Rngs(0))

  def train(sharded: bool):
    model = make_model(sharded)
    tx = optcore.adafactor(1e-2, min_dim_size_to_factor=8).as_optax()
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def step(model, opt):
      grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((4, 16))) ** 2))(model)
      opt.update(model, grads)

    for _ in range(3):
      step(model, opt)
    return model

  with jax.set_mesh(mesh):
    sharded = train(True)
  plain = train(False)
  assert sharded.kernel[...].sharding.spec == P(None, "x")
  np.testing.assert_allclose(sharded.kernel[...], plain.kernel[...], rtol=1e-6, atol=1e-6)


def test_derive_shardings_names_the_leaf_a_mesh_axis_does_not_divide():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("model",))
  opt_def = optcore.adam(1e-2)
  optimizer = opt_def.create({"w": jnp.ones((4, 3))})
  with pytest.raises(
    optcore.PartitionRuleError, match=r"/w': dimension 1 of shape \(4, 3\) has size 3"
  ):
    opt_def.derive_shardings(optimizer, {"w": P(None, "model")}, mesh)


def test_equinox_shard_names_the_leaf_a_mesh_axis_does_not_divide():
  eqx = pytest.importorskip("equinox", reason="the Equinox face is tested in the 'all' variant")
  import optcore_equinox

  model = eqx.nn.Linear(4, 3, key=jax.random.key(0))  # weight (3, 4), bias (3,)
  opt = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("model",))
  specs = eqx.tree_at(lambda m: (m.weight, m.bias), model, (P("model", None), P(None)))
  with pytest.raises(optcore.PartitionRuleError, match=r"dimension 0 of shape \(3, 4\) has size 3"):
    opt.shard(model, specs, mesh)
