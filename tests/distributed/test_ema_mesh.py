"""optcore.ema on the 8-device CPU mesh: the average gets each parameter's
logical axes and ZeRO-1's split (1/8 per device), may live in pinned host
memory, and equals the one-device average to the last bits (sharded code rounds a
shard's adam division in the last place now and then)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec
from sharding_setup import AXES, grads_at, make_params
from sharding_setup import MODEL_RULES as RULES
from tree_testing import assert_trees_within_ulps

import optcore


def test_ema_is_sharded_like_its_parameters_and_split_by_state_axis(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))
  opt_def = optcore.ema(optcore.adamw(0.01, weight_decay=0.1), decay=0.9)
  opt = opt_def.create_sharded(
    make_params(), AXES, mesh, RULES, state_axis="data", state_memory_kind="pinned_host"
  )
  one = opt_def.create(make_params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(4):
    opt, one = step(opt, grads_at(i, one.target)), step(one, grads_at(i, one.target))
  assert_trees_within_ulps(opt.ema_params, one.ema_params)
  kernel = opt.ema_params["dense"]["kernel"]
  assert kernel.sharding.spec == PartitionSpec("data", "model")
  # Kept in host memory between steps, read out on the device, where the parameters are.
  assert opt.state.param_states.ema["dense"]["kernel"].sharding.memory_kind == "pinned_host"
  assert kernel.sharding.memory_kind == "device"
  assert {s.data.size for s in kernel.addressable_shards} == {kernel.size // 8}
  assert opt.state.param_states.count.sharding.memory_kind in (None, "device")
