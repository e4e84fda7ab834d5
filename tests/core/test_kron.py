"""PSGD Kron against its authors' JAX code: the trajectories in
`tests/reference_data/kron_reference.npz` (written by `make_kron_reference.py` from psgd_jax's
``kron``, each step applied by ``optax.apply_updates`` under ``jax.jit``), through the core face
and ``as_optax()``, the reference's own random draws included; its state's declaration, its
factors' axes, scanned layers from logical axes, state dicts and low-bit state. The 8-device mesh:
`tests/distributed/test_field_optimizers_mesh.py`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from reference_runs import as_jax, check_as_optax, check_core_face

import optcore

sys.path.insert(0, str(Path(__file__).parents[1] / "reference_data"))
from kron_inputs import CASES, STEPS, case_inputs, scanned_layers

# nox -s shampoo_reference points this at trajectories its environment's psgd_jax wrote anew
REFERENCE = np.load(
  os.environ.get("OPTCORE_KRON_REFERENCE")
  or Path(__file__).parents[1] / "reference_data" / "kron_reference.npz"
)
# The reference's own float32 spread (its jitted against its eager run, stored beside the data)
# is up to 2.4e-7; optcore's distance from it, both faces, every case: 0 (bit for bit) under
# this CPU's default instruction set on jax 0.12, up to 2.4e-7 under AVX and SSE4_2 and on jax
# 0.10.2. The tolerance is 5 x the spread.
SPREAD = max(float(REFERENCE[f"{name}/spread"]) for name in CASES)
ATOL = 5 * SPREAD


def definition(name: str) -> optcore.OptimizerDef:
  kwargs, scanned = CASES[name]
  return optcore.contrib.kron(**kwargs, scanned_layers=scanned_layers(name) if scanned else None)


@pytest.mark.parametrize("name", sorted(CASES))
def test_create_apply_gradient_matches_the_authors_code(name):
  params, grads = case_inputs(name)
  opt = check_core_face(REFERENCE, ATOL, name, definition(name).create(as_jax(params)), grads)
  assert int(opt.state.param_states[0].count) == STEPS


@pytest.mark.parametrize("name", ["fast", "one_diag", "scanned"])  # the face; the maths above
def test_as_optax_matches_the_authors_code(name):
  params, grads = case_inputs(name)
  params = as_jax(params)
  tx = definition(name).as_optax()
  check_as_optax(REFERENCE, ATOL, name, tx, tx.init(params), params, grads)


def test_scanned_layers_from_logical_axes_are_the_hand_written_ones():
  params, grads = case_inputs("scanned")
  axes = {"w": P("embed", "mlp"), "stack": P("layers", "embed", "mlp"), "v": P("mlp"), "s": P()}
  by_axes = optcore.contrib.kron(learning_rate=0.02, param_logical_axes=axes)
  opt = check_core_face(REFERENCE, ATOL, "scanned", by_axes.create(as_jax(params)), grads)
  factors = opt.state.param_states[0].Qs_preconditioners["stack"]
  assert [q.shape for q in factors] == [(3, 4, 4), (3, 5, 5)]  # one pair a layer


def test_the_state_is_declared_and_its_factors_follow_their_dimensions_axes():
  fields = optcore.declared_fields(optcore.contrib.KronState)
  mars = optcore.declared_fields(optcore.contrib.MarsState)
  assert fields["mu"] == mars["exp_avg"] and fields["count"] == mars["count"]
  params = {"w": jnp.ones((8, 4)), "stack": jnp.ones((2, 4, 8)), "v": jnp.ones(8)}
  axes = {"w": P("embed", "mlp"), "stack": P("layers", "embed", "mlp"), "v": P("mlp")}
  d = optcore.contrib.kron(1e-2)
  state_axes = d.derive_logical_axes(jax.eval_shape(d.create, params), axes)
  factors = state_axes.state.param_states[0].Qs_preconditioners
  assert factors["w"] == [P("embed", None), P("mlp", None)]
  assert factors["v"] == [P("mlp")]  # a vector: one diagonal factor


def test_state_dicts_restore_bit_for_bit_and_low_bit_state_quantizes_the_momentum_alone():
  params, grads = case_inputs("fast")
  opt = definition("fast").create(as_jax(params)).apply_gradient(as_jax(grads[0]))
  restored = definition("fast").create(as_jax(params)).restore_state(opt.state_dict())
  for a, b in zip(jax.tree.leaves(restored.state), jax.tree.leaves(opt.state), strict=True):
    np.testing.assert_array_equal(a, b)
  low = optcore.low_bit_state(definition("fast"), min_size=8).create(as_jax(params))
  low = low.apply_gradient(as_jax(grads[0]))
  inner = low.state.param_states.inner[0]
  assert all(q.dtype == jnp.float32 for q in jax.tree.leaves(inner.Qs_preconditioners))
  quantized = lambda x: type(x).__name__ == "QuantizedArray"
  assert quantized(inner.mu["w"]) and quantized(inner.mu["stack"])  # the first moment, signed
  assert not any(map(quantized, jax.tree.leaves(inner.Qs_preconditioners, is_leaf=quantized)))


@pytest.mark.parametrize(
  ("build", "message"),
  [
    (lambda: optcore.contrib.kron(b1=1.5), r"kron: b1 must be a number in \[0, 1\)"),
    (lambda: optcore.contrib.kron(memory_save_mode="some_diag"), "memory_save_mode must be"),
    (lambda: optcore.contrib.kron(max_size_triangular=2.5), "max_size_triangular"),
    (
      lambda: optcore.contrib.kron(scanned_layers={"w": True}, param_logical_axes={"w": P()}),
      "not both",
    ),
  ],
)
def test_wrong_arguments_are_refused_by_name(build, message):
  with pytest.raises((optcore.ArgumentError, ValueError, TypeError), match=message):
    build()


def test_a_donated_step_runs():
  """The state's two counters are two arrays: a step that donates the optimizer donates each
  buffer once (one zero for both made XLA refuse the donation: found by `nox -s bench`)."""
  params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
  opt = optcore.contrib.kron(1e-2).create(params)
  step = jax.jit(lambda o, g: o.apply_gradient(g), donate_argnums=(0,))
  for _ in range(2):
    opt = step(opt, jax.tree.map(jnp.ones_like, params))
  assert int(opt.state.step) == 2
