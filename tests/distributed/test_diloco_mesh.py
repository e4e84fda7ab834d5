"""optcore.diloco on the 8-device CPU mesh: four replicas on a ``replica`` mesh axis, each
replica's parameters split over a 2-way ``data`` axis. The steps end at the one-device run's
parameters (within the ulps a split step rounds differently); the replicas and their inner
state stay on their devices, the global parameters and the outer state are one replica's
layout; the outer step's mean is the one all-reduce of the program over the replica axis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_within_ulps

import optcore

AXES = {"w": P("replica", "embed", "mlp"), "b": P("replica", "mlp")}
RULES = [("replica", "replica"), ("embed", "data"), ("mlp", None)]


def params():
  k = jax.random.split(jax.random.key(0), 2)
  one = {"w": jax.random.normal(k[0], (8, 6)), "b": jax.random.normal(k[1], (6,))}
  return jax.tree.map(lambda p: jnp.broadcast_to(p, (4, *p.shape)), one)


def grads(i):
  k = jax.random.split(jax.random.key(100 + i), 2)
  return {"w": jax.random.normal(k[0], (4, 8, 6)), "b": jax.random.normal(k[1], (4, 6))}


def test_replicas_on_a_mesh_axis_are_the_one_device_run(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(4, 2), ("replica", "data"))
  opt_def = optcore.diloco(optcore.adamw(0.05, weight_decay=0.01), every=2)
  opt = opt_def.create_sharded(params(), AXES, mesh, RULES)
  one = opt_def.create(params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(5):
    opt, one = step(opt, grads(i)), step(one, grads(i))
  assert_trees_within_ulps(opt.target, one.target)
  assert opt.target["w"].sharding.spec == P("replica", "data")
  own = opt.state.param_states
  assert own.inner[0].mu["w"].sharding.spec == P("replica", "data")
  assert own.anchor["w"].sharding.spec == P("data")
  assert own.outer[0].trace["w"].sharding.spec == P("data")
  hlo = step.lower(opt, grads(0)).compile().as_text()
  assert "all-reduce" in hlo  # the replicas' mean, in the outer step's branch
