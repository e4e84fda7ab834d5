"""optcore.contrib.muon on the 8-device CPU mesh, its matrix dimensions from the
logical axes that also shard it: the momentum follows each kernel's sharding
and ZeRO-1's split, and the steps agree with one device."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

import optcore

LAYERS, EMBED, MLP = 2, 16, 32
RULES = [("mlp", "model"), ("embed", None), ("layers", None)]
AXES = {
  "wi": ("layers", "embed", "mlp"),
  "wo": ("layers", "mlp", "embed"),
  "norm": ("layers", "embed"),
}


def params():
  key = jax.random.key(0)
  shapes = {"wi": (LAYERS, EMBED, MLP), "wo": (LAYERS, MLP, EMBED), "norm": (LAYERS, EMBED)}
  return {
    k: 0.1 * jax.random.normal(jax.random.fold_in(key, i), s)
    for i, (k, s) in enumerate(shapes.items())
  }


def grads_at(i):
  key = jax.random.key(10 + i)
  return {
    k: jax.random.normal(jax.random.fold_in(key, j), v.shape)
    for j, (k, v) in enumerate(params().items())
  }


def test_muon_from_axes_on_the_mesh_with_zero1(cpu_devices):
  mesh = Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))
  opt = optcore.contrib.muon(0.02).create_sharded(params(), AXES, mesh, RULES, state_axis="data")
  one = optcore.contrib.muon(0.02, param_logical_axes=AXES).create(params())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3):
    opt, one = step(opt, grads_at(i)), step(one, grads_at(i))
  for got, want in zip(jax.tree.leaves(opt.target), jax.tree.leaves(one.target), strict=True):
    np.testing.assert_allclose(
      got, want, rtol=2e-5, atol=1e-6
    )  # sharded matmuls sum in another order
  mu = opt.state.param_states.inner_states["muon"].inner_state[0].mu["wi"]
  assert "model" in mu.sharding.spec and "data" in mu.sharding.spec
  assert {s.data.size for s in mu.addressable_shards} == {mu.size // 8}
