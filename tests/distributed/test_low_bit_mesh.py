"""`low_bit_state` on the 8-device mesh: ZeRO-1 splits codes and scales over whole blocks, the
first moment quantized on the device beside the second in host memory (a memory kind per path
pattern), and the numbers those of one device."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_within_ulps

import optcore

# A matrix whose rows hold whole blocks, one split across its rows' blocks by its axes, and a
# vector cut into blocks of the flattened tensor (4608 values: 18 blocks, no 8-way split).
PARAMS = {
  "w": jnp.linspace(-1.0, 1.0, 64 * 512).reshape(64, 512),
  "v": jnp.linspace(-2.0, 2.0, 4608),
}
AXES = {"w": P(None, "mlp"), "v": P(None)}


def grads(i: int):
  key = jax.random.key(i)
  return {k: jax.random.normal(jax.random.fold_in(key, n), p.shape) for n, (k, p) in
          enumerate(sorted(PARAMS.items()))}  # fmt: skip


@pytest.fixture
def mesh(cpu_devices):
  return Mesh(np.array(cpu_devices).reshape(4, 2), ("data", "model"))


def test_zero1_splits_whole_blocks_and_the_numbers_are_one_devices(mesh):
  opt_def = optcore.low_bit_state(optcore.adam(1e-2), bits=8)
  opt = opt_def.create_sharded(
    PARAMS, AXES, mesh, logical_axis_rules=[("mlp", "model")], state_axis="data"
  )
  mu = opt.state.param_states.inner[0].mu
  # w (64, 512): codes (64, 2, 256); its blocks follow 'mlp' on 'model', ZeRO-1 takes rows.
  assert mu["w"].codes.sharding.spec == P("data", "model", None)
  assert mu["w"].scales.sharding.spec == P("data", "model")
  for leaf in (mu["w"].codes, mu["v"].codes):
    for shard in leaf.addressable_shards:  # every shard holds whole blocks
      assert shard.data.shape[-1] == leaf.shape[-1]
  assert mu["v"].codes.sharding.spec == P(None, None)  # 18 blocks: no 4-way split
  reference = opt_def.create(PARAMS)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3):
    opt, reference = step(opt, grads(i)), step(reference, grads(i))
  assert_trees_within_ulps(opt.target, reference.target)
  for ours, theirs in zip(
    jax.tree.leaves(optcore.dequantize_state(opt.state)),
    jax.tree.leaves(optcore.dequantize_state(reference.state)),
    strict=True,
  ):
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=0, atol=1e-2 * float(
      np.max(np.abs(np.asarray(theirs))) or 1.0))  # fmt: skip


def test_the_first_moment_in_8_bits_on_the_device_the_second_in_host_memory(mesh):
  opt_def = optcore.low_bit_state(optcore.adam(1e-2), states="/mu/")
  opt = opt_def.create_sharded(
    PARAMS, None, mesh, state_axis="data", state_memory_kind={"/nu/": "pinned_host"}
  )
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  reference = opt_def.create(PARAMS)
  for i in range(3):
    opt, reference = step(opt, grads(i)), step(reference, grads(i))
    adam = opt.state.param_states.inner[0]
    for name in PARAMS:
      assert isinstance(adam.mu[name], optcore.QuantizedArray)
      assert adam.mu[name].codes.sharding.memory_kind == "device"
      assert adam.nu[name].dtype == jnp.float32
      assert adam.nu[name].sharding.memory_kind == "pinned_host"
    assert opt.state.step.sharding.memory_kind == "device"
  assert_trees_within_ulps(opt.target, reference.target)


def test_a_memory_kind_per_pattern_is_checked_and_named(mesh):
  with pytest.raises(ValueError, match=r"state_memory_kind: '/nu\(' is not a regular expression"):
    optcore.Placement(mesh, state_memory_kind={"/nu(": "pinned_host"})
  with pytest.raises(ValueError, match="state_memory_kind='pinned_hots'"):
    optcore.Placement(mesh, state_memory_kind={"/nu/": "pinned_hots"})
  with pytest.raises(TypeError, match=r"a mapping from a regular expression .* got \{'/nu/': 1\}"):
    optcore.Placement(mesh, state_memory_kind={"/nu/": 1})
  where = optcore.Placement(mesh, state_memory_kind={"/nu/": "pinned_host"})
  assert hash(where) == hash(optcore.Placement(mesh, state_memory_kind={"/nu/": "pinned_host"}))
  # The paths are the state's own: here 'mu/w' and 'nu/w'.
  shardings = optcore.Placement(mesh, state_memory_kind={"^nu/": "pinned_host"}).state_shardings(
    {"mu": {"w": jnp.zeros(8)}, "nu": {"w": jnp.zeros(8)}},
    {"mu": {"w": P(None)}, "nu": {"w": P(None)}},
  )
  assert isinstance(shardings["nu"]["w"], NamedSharding)
  assert shardings["nu"]["w"].memory_kind == "pinned_host"
  assert shardings["mu"]["w"].memory_kind in (None, "device")


def test_read_outs_of_quantized_state_in_host_memory_come_back_on_the_device(mesh):
  """dequantize_state and ema_params of low-bit state kept in pinned host memory ended in a bare
  JAX error (the gather of codes in host memory from a map on the device); they read it on the
  device and give the values of the same state kept on the device."""
  opt_def = optcore.low_bit_state(optcore.ema(optcore.adam(1e-2), 0.9))
  on_host = opt_def.create_sharded(PARAMS, None, mesh, state_memory_kind="pinned_host")
  on_device = opt_def.create_sharded(PARAMS, None, mesh)
  codes = jax.tree.leaves(on_host.state, is_leaf=lambda x: isinstance(x, optcore.QuantizedArray))
  assert any(getattr(x, "codes", x).sharding.memory_kind == "pinned_host" for x in codes)
  for got, want in zip(
    jax.tree.leaves(optcore.dequantize_state(on_host.state)),
    jax.tree.leaves(optcore.dequantize_state(on_device.state)),
    strict=True,
  ):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  average = on_host.ema_params
  for name in PARAMS:
    assert average[name].sharding.memory_kind == "device"
    np.testing.assert_array_equal(np.asarray(average[name]), np.asarray(on_device.ema_params[name]))


def test_blocks_the_mesh_cannot_split_whole_are_replicated(mesh):
  """A sharded vector of 72 values is one block of 256 codes at min_size=0: no device can hold
  half a block, so its codes and scales are replicated (once a PartitionRuleError: 'dimension
  0 of shape (1, 256) has size 1'), and the numbers are one device's."""
  params = {"w": PARAMS["w"], "b": jnp.linspace(-0.5, 0.5, 72)}
  axes = {"w": P(None, "mlp"), "b": P("mlp")}
  opt_def = optcore.low_bit_state(optcore.adam(1e-2), bits=8, min_size=0)
  opt = opt_def.create_sharded(
    params, axes, mesh, logical_axis_rules=[("mlp", "model")], state_axis="data",
    state_memory_kind="pinned_host",
  )  # fmt: skip
  mu = opt.state.param_states.inner[0].mu
  assert mu["b"].codes.shape == (1, 256) and mu["b"].codes.sharding.spec == P(None, None)
  assert mu["w"].codes.sharding.spec == P("data", "model", None)  # whole blocks still split
  reference = opt_def.create(params)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  grad = jax.tree.map(jnp.ones_like, params)
  for _ in range(3):
    opt, reference = step(opt, grad), step(reference, grad)
  assert_trees_within_ulps(opt.target, reference.target)
