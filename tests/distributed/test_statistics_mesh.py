"""optcore.with_statistics on the 8-device CPU mesh with ZeRO-1: the norms are global (the sum
over every shard, not one device's), equal to the one-device run's and to a hand computation
(issue 40)."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh
from sharding_setup import AXES, grads_at, make_params
from sharding_setup import MODEL_RULES as RULES

import optcore


def test_statistics_are_global_under_zero1(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))
  opt_def = optcore.with_statistics(optcore.adam(0.01))
  opt = opt_def.create_sharded(make_params(), AXES, mesh, RULES, state_axis="data")
  one = opt_def.create(make_params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3):
    g = grads_at(i, one.target)
    before = one.target
    opt, one = step(opt, g), step(one, g)
  sharded, single = optcore.statistics(opt), optcore.statistics(one)
  assert sorted(sharded) == sorted(single)
  for name in single:
    np.testing.assert_allclose(float(sharded[name]), float(single[name]), rtol=1e-6, err_msg=name)
  kernel = np.asarray(g["dense"]["kernel"], np.float64)
  np.testing.assert_allclose(
    float(sharded["dense/grad_norm"]),
    np.sqrt(np.sum(kernel**2) + np.sum(np.asarray(g["dense"]["bias"], np.float64) ** 2)),
    rtol=2e-6,
  )
  update = np.asarray(opt.target["attn"], np.float64) - np.asarray(before["attn"], np.float64)
  np.testing.assert_allclose(
    float(sharded["attn/update_norm"]), np.sqrt(np.sum(update**2)), rtol=1e-4
  )
  assert opt.state.param_states.inner[0].mu["dense"]["kernel"].sharding.spec[0] == "data"
