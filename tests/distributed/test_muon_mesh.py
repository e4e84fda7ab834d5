"""optcore.contrib.muon on the 8-device CPU mesh, its matrix dimensions from the
logical axes that also shard it: the momentum follows each kernel's sharding
and ZeRO-1's split, and the steps agree with one device."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

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


# Owner-compute (issue 63): under ZeRO-1 whole matrices are orthogonalised on owner devices.

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
ITEM_BYTES = {"f64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s8": 1, "u8": 1}


def collective_bytes(text: str) -> tuple[int, int]:
  """The compiled program's collectives and the bytes of their results (per device, the
  shapes XLA's SPMD program gives them; a tuple's every element)."""
  count = total = 0
  for line in text.splitlines():
    found = re.search(r" (" + "|".join(COLLECTIVES) + r")(-start)?\(", line)
    if not found or "=" not in line[: found.start()]:
      continue
    count += 1
    shape = line[line.index("=") + 1 : found.start()]
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
      total += ITEM_BYTES.get(dtype, 0) * math.prod(int(d) for d in dims.split(",") if d)
  return count, total


EIGHT = {
  "stacked": ({"w": (8, 256, 256)}, {"w": ("layers", "embed", "mlp")}),
  "leaves": (
    {f"w{i}": (256, 256) for i in range(8)},
    {f"w{i}": ("embed", "mlp") for i in range(8)},
  ),
}
REPLICATED_RULES = [("layers", None), ("embed", None), ("mlp", None)]


def zero1_step_bytes(definition, shapes, axes, mesh):
  params = {k: jnp.ones(s, jnp.float32) for k, s in shapes.items()}
  opt = definition.create_sharded(params, axes, mesh, REPLICATED_RULES, state_axis="data")
  shardings = jax.tree.map(lambda x: x.sharding, opt)
  step = jax.jit(
    lambda o, g: o.apply_gradient(g), in_shardings=(shardings, None), out_shardings=shardings
  )
  grads = jax.tree.map(lambda p: jnp.full_like(p, 1e-3), params)
  return collective_bytes(step.lower(opt, grads).compile().as_text())


@pytest.mark.parametrize("layout", sorted(EIGHT))
def test_a_zero1_muon_step_moves_at_most_four_times_adamws_bytes(cpu_devices, layout):
  # measured (jax 0.12, 8 CPU devices): AdamW 2.10 MB (its gathered parameters); Muon 2.62 MB
  # (x1.25: the momentum to its owners and back, two all-to-alls of 262 kB, and the same
  # gather), stacked and as eight leaves; 33.6 MB (x16) with Newton-Schulz partitioned
  mesh = Mesh(np.array(cpu_devices), ("data",))
  shapes, axes = EIGHT[layout]
  _, adamw = zero1_step_bytes(optcore.adamw(1e-3), shapes, axes, mesh)
  _, muon = zero1_step_bytes(optcore.contrib.muon(1e-3), shapes, axes, mesh)
  _, partitioned = zero1_step_bytes(
    optcore.contrib.muon(1e-3, ns_sharding=False), shapes, axes, mesh
  )
  assert muon <= 4 * adamw, (layout, muon, adamw)
  assert partitioned > 4 * adamw  # ns_sharding=False: the compiler's partitioning, as before


@pytest.mark.parametrize("coeffs", ["standard", "polar_express"])
def test_owners_give_one_devices_numbers(cpu_devices, coeffs):
  # measured distance from one device over four steps (parameters of size ~1): 2.4e-7 standard,
  # 4.8e-7 Polar Express (jax 0.12, this CPU, AVX and SSE4_2 alike): the stacked batch of
  # matrices is rounded as the single ones within an ulp or two. Tolerance 5 x 4.8e-7.
  mesh = Mesh(np.array(cpu_devices), ("data",))
  key = jax.random.key(3)
  shapes = {"s": (8, 24, 16), "a": (24, 16), "b": (16, 24), "c": (24, 16), "n": (16,)}
  axes = {"s": ("layers", "embed", "mlp"), "a": ("embed", "mlp"), "b": ("mlp", "embed"),
          "c": ("embed", "mlp"), "n": ("embed",)}  # fmt: skip
  params = {
    k: jax.random.normal(jax.random.fold_in(key, i), s) for i, (k, s) in enumerate(shapes.items())
  }
  opt = optcore.contrib.muon(0.05, ns_coeffs=coeffs).create_sharded(
    params, axes, mesh, REPLICATED_RULES, state_axis="data"
  )
  assert "ns_sharding" in opt.optimizer_def.hyper_params
  assert opt.optimizer_def.hyper_params["ns_sharding"].spec == P("data")
  one = optcore.contrib.muon(0.05, ns_coeffs=coeffs, param_logical_axes=axes).create(params)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(4):
    g = {k: jax.random.normal(jax.random.fold_in(key, 50 + i), s) for k, s in shapes.items()}
    opt, one = step(opt, g), step(one, g)
  for k in shapes:
    np.testing.assert_allclose(opt.target[k], one.target[k], rtol=0, atol=5 * 4.8e-7, err_msg=k)
    assert opt.target[k].sharding.is_fully_replicated
