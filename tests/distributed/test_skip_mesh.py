"""optcore.skip_bad_steps on the 8-device CPU mesh with ZeRO-1 and host memory: the norm it
judges is the global one (a spike in one device's shard alone is seen), it skips the steps the
one-device run skips, and the parameters equal that run's to the last bits (sharded code rounds
a shard's adam division in the last place now and then)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec
from sharding_setup import AXES, grads_at, make_params
from sharding_setup import MODEL_RULES as RULES
from tree_testing import assert_trees_within_ulps

import optcore


def grads(i, params):
  g = grads_at(i, params)
  if i == 7:  # a spike in one corner of the kernel: one device's shard
    g["dense"]["kernel"] = g["dense"]["kernel"].at[:2, :4].multiply(200.0)
  return g


def test_the_window_is_global_replicated_and_skips_as_one_device_does(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))
  opt_def = optcore.skip_bad_steps(optcore.adam(0.01), window=5, sigmas=3.0, warmup=3)
  opt = opt_def.create_sharded(
    make_params(), AXES, mesh, RULES, state_axis="data", state_memory_kind="pinned_host"
  )
  one = opt_def.create(make_params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(10):
    g = grads(i, one.target)
    opt, one = step(opt, g), step(one, g)
  assert int(optcore.skipped_steps(opt)) == int(optcore.skipped_steps(one)) == 1
  assert int(opt.state.step) == 9
  assert_trees_within_ulps(opt.target, one.target)
  norms = opt.state.param_states.norms
  assert norms.sharding.is_fully_replicated
  np.testing.assert_allclose(norms, one.state.param_states.norms, rtol=1e-6)
  mu = opt.state.param_states.inner[0].mu["dense"]["kernel"]
  assert mu.sharding.spec == PartitionSpec("data", "model")
  assert mu.sharding.memory_kind == "pinned_host"
