"""optcore.contrib.muon's Polar Express coefficients against their authors' function: the
directions in `tests/reference_data/polar_express_reference.npz` (written by
`make_polar_express_reference.py` from the paper's ``PolarExpress``, in float32, with the
function's own float32 spread beside each), through the core face and ``as_optax()``; their
table, their normalisation, and what Polar Express refuses. Owners on a mesh:
`tests/distributed/test_muon_mesh.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optcore

sys.path.insert(0, str(Path(__file__).parents[1] / "reference_data"))
from polar_express_inputs import CASES, case_gradient

REFERENCE = np.load(Path(__file__).parents[1] / "reference_data" / "polar_express_reference.npz")
# Each case's tolerance is a multiple of the reference's own float32 spread on it (its float32
# direction against its float64 one, 2.4e-7 to 6.3e-6): optcore's distance from the reference
# is at most 1.92 x that spread (jax 0.12, both faces; the stack under this CPU's default
# instruction set; 1.75 x under SSE4_2, 1.9 x under AVX). The tolerance is 3 x the spread.
RATIO = 3.0


def direction_step(name: str) -> tuple[optcore.OptimizerDef, jax.Array, float]:
  """Muon with the case's steps and no momentum (``beta=0``: the direction of the gradient
  itself) at rate 1, the case's gradient, and optax's width scale of its matrices."""
  shape, steps = CASES[name]
  dims = optax.contrib.MuonDimensionNumbers(len(shape) - 2, len(shape) - 1)
  definition = optcore.contrib.muon(
    1.0, ns_coeffs="polar_express", ns_steps=steps, beta=0.0,
    muon_weight_dimension_numbers={"w": dims},
  )  # fmt: skip
  return definition, jnp.asarray(case_gradient(name)), float(np.sqrt(max(1, shape[-1] / shape[-2])))


def check_direction(name: str, new_params: jax.Array, scale: float) -> None:
  tolerance = RATIO * float(REFERENCE[f"{name}/spread"])
  np.testing.assert_allclose(
    -np.asarray(new_params) / scale, REFERENCE[f"{name}/direction"], rtol=0, atol=tolerance,
    err_msg=f"Polar Express direction of case {name!r}",
  )  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_polar_express_directions_match_the_authors_function(name):
  definition, grad, scale = direction_step(name)
  opt = definition.create({"w": jnp.zeros_like(grad)})
  opt = jax.jit(lambda o, g: o.apply_gradient(g))(opt, {"w": grad})
  check_direction(name, opt.target["w"], scale)


@pytest.mark.parametrize("name", ["square_5", "stack_5", "wide_10"])
def test_polar_express_through_as_optax_matches_the_authors_function(name):
  definition, grad, scale = direction_step(name)
  tx = definition.as_optax()
  params = {"w": jnp.zeros_like(grad)}
  updates, _ = jax.jit(tx.update)({"w": grad}, tx.init(params), params)
  check_direction(name, updates["w"], scale)


def test_the_table_is_the_papers_first_rows_its_last_repeated():
  from optcore._src.optimizers.muon import polar_express_coefficients

  rows = polar_express_coefficients(10)
  # the paper's first row, divided by its safety factor (a / 1.01, b / 1.01^3, c / 1.01^5)
  np.testing.assert_allclose(
    rows[0], (8.28721201814563 / 1.01, -23.595886519098837 / 1.01**3, 17.300387312530933 / 1.01**5)
  )
  assert rows[7:] == ((1.875, -1.25, 0.375),) * 3  # their last row, as it is, repeated
  assert polar_express_coefficients(3) == rows[:3]
  state = optcore.contrib.muon(0.1, ns_coeffs="polar_express", ns_steps=4).create(
    {"w": jnp.ones((3, 4))}
  )
  table = state.state.param_states.inner_states["muon"].inner_state[0].ns_coeffs
  assert table.shape == (4, 3)


def test_polar_express_normalises_as_its_authors_not_as_optax():
  # a matrix whose norm is 1: optax's normalisation leaves it as it is, the authors' divides
  # it by 1.01 + 1e-7; one step of the quintic p(x) = a x + b x^3 + c x^5 on singular value
  # s shows which (a 1x1 matrix is its own singular value)
  g = jnp.array([[1.0]])
  dims = {"w": optax.contrib.MuonDimensionNumbers(0, 1)}
  opt = optcore.contrib.muon(
    1.0, ns_coeffs="polar_express", ns_steps=1, beta=0.0, muon_weight_dimension_numbers=dims
  ).create({"w": jnp.zeros((1, 1))})
  got = -float(opt.apply_gradient({"w": g}).target["w"][0, 0])
  a, b, c = 8.28721201814563 / 1.01, -23.595886519098837 / 1.01**3, 17.300387312530933 / 1.01**5
  s = 1.0 / (1.01 + 1e-7)
  assert got == pytest.approx(a * s + b * s**3 + c * s**5, rel=1e-6)
  assert got != pytest.approx(a + b + c, rel=1e-3)


def test_what_polar_express_and_owners_refuse():
  with pytest.raises(ValueError, match="brings its authors' normalisation"):
    optcore.contrib.muon(0.1, ns_coeffs="polar_express", preconditioning="aol")
  with pytest.raises(TypeError, match="names no devices"):
    optcore.contrib.muon(0.1, ns_sharding=True)
  with pytest.raises(TypeError, match="must be a NamedSharding"):
    optcore.contrib.muon(0.1, ns_sharding="data")
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  owners = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  with pytest.raises(ValueError, match="optax's own first step"):
    optcore.contrib.muon(0.1, ns_sharding=owners, preconditioning="schatten")


def test_owners_on_one_device_keep_optaxs_numbers_to_an_ulp():
  # the owners' program stacks the matrices of one shape into one batch: XLA rounds a batched
  # product of eight matrices as it rounds eight single ones, or an ulp apart (measured: 2.4e-7
  # on parameters of size ~1 over three steps, every option below; jax 0.12)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  owners = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  key = jax.random.key(0)
  params = {
    f"w{i}": jax.random.normal(jax.random.fold_in(key, i), (16, 8 + 4 * (i % 2))) for i in range(4)
  }
  params["b"] = jnp.ones(5)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for options in ({}, {"nesterov": False, "weight_decay": 0.1}, {"ns_coeffs": "dion"}):
    ours = optcore.contrib.muon(0.02, ns_sharding=owners, **options).create(params)
    theirs = optcore.contrib.muon(0.02, **options).create(params)
    for i in range(3):
      g = jax.tree.map(
        lambda p, i=i: jax.random.normal(jax.random.fold_in(key, 9 + i), p.shape), params
      )
      ours, theirs = step(ours, g), step(theirs, g)
    for a, b in zip(jax.tree.leaves(ours.target), jax.tree.leaves(theirs.target), strict=True):
      np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=str(options))
