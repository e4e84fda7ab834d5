"""optcore.transplant on the 8-device CPU mesh: a one-device checkpoint of adam
moves into a sharded adamw (logical axes, ZeRO-1's split, pinned host memory),
every kept leaf lands in the place create_sharded gave it, and the sharded steps
after it give the one-device numbers."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh
from sharding_setup import AXES, grads_at, make_params
from sharding_setup import MODEL_RULES as RULES
from tree_testing import assert_trees_within_ulps

import optcore


def test_a_checkpoint_transplants_into_a_sharded_optimizer_in_its_layout(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  old = optcore.adam(0.01).create(make_params())
  for i in range(3):
    old = step(old, grads_at(i, old.target))
  saved = jax.tree.map(np.asarray, old.state_dict())  # as a checkpoint reads back: host arrays

  new_def = optcore.adamw(0.01, weight_decay=0.1)
  fresh = new_def.create_sharded(
    make_params(), AXES, mesh, RULES, state_axis="data", state_memory_kind="pinned_host"
  )
  sharded, report = optcore.transplant(fresh, saved)
  assert report.initialised == () and report.dropped == ()
  placed = lambda opt: jax.tree.map(lambda x: (x.sharding.spec, x.sharding.memory_kind), opt)
  assert placed(sharded) == placed(fresh)

  one, _ = optcore.transplant(new_def.create(make_params()), saved)
  shardings = jax.tree.map(lambda x: x.sharding, sharded)
  sharded_step = jax.jit(
    lambda o, g: o.apply_gradient(g), in_shardings=(shardings, None), out_shardings=shardings
  )
  for i in range(3, 6):
    g = grads_at(i, one.target)
    sharded, one = sharded_step(sharded, g), step(one, g)
  assert_trees_within_ulps(sharded, one)
