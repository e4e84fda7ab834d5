"""optcore.qk_clip on the 8-device CPU mesh: the attention weights' heads split over a model
axis, ZeRO-1 over the data axis, the per-head maxima a replicated array: MuonClip's steps end
at the one-device run's parameters (within the ulps a split step rounds differently), and the
parameters and state keep their shardings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_within_ulps

import optcore

AXES = {
  "attn": {
    "query": {"kernel": P("embed", "heads", "kv")},
    "key": {"kernel": P("embed", "heads", "kv")},
    "value": {"kernel": P("embed", "heads", "kv")},
  }
}
RULES = [("heads", "model"), ("embed", None), ("kv", None)]


def params():
  k = jax.random.split(jax.random.key(0), 3)
  names = ("query", "key", "value")
  return {"attn": {n: {"kernel": jax.random.normal(k[i], (16, 4, 8))} for i, n in enumerate(names)}}


def test_muon_clip_on_the_mesh_is_the_one_device_run(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))
  opt_def = optcore.qk_clip(optcore.contrib.muon(0.05), 8.0)
  opt = opt_def.create_sharded(params(), AXES, mesh, RULES, state_axis="data")
  one = opt_def.with_param_logical_axes(AXES).create(params())
  step = jax.jit(lambda o, g, s: o.apply_gradient(g, extra_args={"qk_logits": s}))
  replicated = NamedSharding(mesh, P())
  for i in range(3):
    g = jax.tree.map(lambda p, i=i: jnp.cos(p + i), one.target)
    s = {"attn": jnp.array([40.0, 7.0, 9.0 + i, 30.0])}
    opt = step(opt, g, jax.device_put(s, replicated))
    one = step(one, g, s)
  assert_trees_within_ulps(opt.target, one.target)
  kernel = opt.target["attn"]["query"]["kernel"]
  assert kernel.sharding.spec in (P(None, "model"), P(None, "model", None))
  moments = [x for x in jax.tree.leaves(opt.state.param_states) if x.shape == (16, 4, 8)]
  assert moments and all(x.sharding.spec[0] == "data" for x in moments)  # ZeRO-1 kept
