"""The optimizers of issue 51, and one written outside optcore whose state only declares its
fields (issue 61: `tests/support/user_optimizer.py`), on the 8-device mesh: their state split by
ZeRO-1 over 'data' beside the parameters' own axes, then all of it in pinned host memory, and the
numbers those of one device.

Tolerance (measured): the sharded runs sum in another order (global norms, per-matrix norms,
the mask's mean, Newton-Schulz and QR products over split rows); the largest distance from one
device after 3 steps is 1.2e-7 (NorMuon), under XLA's default, ``SSE4_2`` and ``AVX``
instruction sets alike (2-core x86 CPU, jax 0.12). ``ATOL`` is eight times that.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from sharding_setup import grads_at
from user_optimizer import SlowAdam

import optcore

PARAMS = {
  "wi": jnp.linspace(-1.0, 1.0, 16 * 32).reshape(16, 32),
  "stack": jnp.linspace(-0.5, 0.5, 2 * 16 * 8).reshape(2, 16, 8),
  "bias": jnp.linspace(-0.1, 0.1, 32),
}
AXES = {"wi": P("embed", "mlp"), "stack": P("layers", "embed", "mlp"), "bias": P("mlp")}
RULES = [("mlp", "model")]

OPTIMIZERS = {
  "mars": lambda axes: optcore.contrib.mars(learning_rate=1e-2, weight_decay=0.1),
  "normuon": lambda axes: optcore.contrib.normuon(learning_rate=0.02, param_logical_axes=axes),
  "dion": lambda axes: optcore.contrib.dion(
    learning_rate=0.02, rank_fraction=0.5, param_logical_axes=axes
  ),
  "cautious": lambda axes: optcore.cautious(optcore.adamw(1e-2, weight_decay=0.1)),
  "zclip": lambda axes: optcore.zclip(optcore.adamw(1e-2), warmup_steps=2),
  "user-slow-adam": lambda axes: SlowAdam(1e-2, every=2),
  "kron": lambda axes: optcore.contrib.kron(learning_rate=1e-2, param_logical_axes=axes),
}
ATOL = 1e-6  # 8 x the largest measured distance (1.2e-7), on every instruction set tried


@pytest.fixture
def mesh(cpu_devices):
  return Mesh(np.array(cpu_devices).reshape(4, 2), ("data", "model"))


@pytest.mark.parametrize("memory_kind", ["device", "pinned_host"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_zero1_and_host_memory_give_one_devices_numbers(mesh, name, memory_kind):
  make = OPTIMIZERS[name]
  opt = make(AXES).create_sharded(
    PARAMS, AXES, mesh, logical_axis_rules=RULES, state_axis="data",
    state_memory_kind=memory_kind,
  )  # fmt: skip
  reference = make(AXES).create(PARAMS)
  arrays = [x for x in jax.tree.leaves(opt.state.param_states) if jnp.ndim(x) >= 2]
  assert arrays and all(x.sharding.memory_kind == memory_kind for x in arrays)
  # ZeRO-1: the parameter-shaped state of the matrix is split over 'data' as well as 'model'
  split = [x for x in arrays if x.shape == PARAMS["wi"].shape]
  assert split and all("data" in str(x.sharding.spec) for x in split), [x.sharding for x in split]
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3):
    opt, reference = step(opt, grads_at(i, PARAMS)), step(reference, grads_at(i, PARAMS))
  for key in PARAMS:
    np.testing.assert_allclose(
      np.asarray(opt.target[key]), np.asarray(reference.target[key]), rtol=0, atol=ATOL,
      err_msg=f"{name}, state in {memory_kind}, leaf {key!r}",
    )  # fmt: skip
  restored = make(AXES).create_sharded(
    PARAMS, AXES, mesh, logical_axis_rules=RULES, state_axis="data",
    state_memory_kind=memory_kind,
  ).restore_state(opt.state_dict())  # fmt: skip
  a, b = step(opt, grads_at(3, PARAMS)), step(restored, grads_at(3, PARAMS))
  for x, y in zip(jax.tree.leaves(a.target), jax.tree.leaves(b.target), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
