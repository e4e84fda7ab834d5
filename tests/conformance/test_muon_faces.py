"""optcore.contrib.muon with param_logical_axes in every face of `faces.FACES`:
the axes are given in the structure of the parameters the face optimises (a
dict, or the face's own container), and every face takes the core's steps."""

from __future__ import annotations

import faces
import jax
import jax.numpy as jnp
import pytest
from faces import FACES
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

import optcore

AXES = {"kernel": P("layers", "embed", "mlp"), "bias": P("layers", "mlp")}


def params():
  key = jax.random.key(0)
  return {
    "kernel": 0.1 * jax.random.normal(key, (2, 4, 6)),
    "bias": jnp.zeros((2, 6)),
  }


def axes_for(face):
  """The axes in the container the face's definition sees."""
  if face.name == "equinox":
    return faces._eqx_model(AXES)
  if face.name == "treex":
    return faces._treeo_params(AXES)
  if face.name == "flax":
    return faces._freeze(AXES)
  return AXES


@pytest.mark.parametrize("face", FACES, ids=str)
def test_every_face_takes_muon_with_axes_in_its_own_container(face):
  handle = face.create(optcore.contrib.muon(0.02, param_logical_axes=axes_for(face)), params())
  core = optcore.contrib.muon(0.02, param_logical_axes=AXES).create(params())
  step = face.jit(face.step)
  core_step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(2):
    grads = jax.tree.map(lambda p, i=i: jnp.full_like(p, 0.1 * (i + 1)), params())
    handle, core = step(handle, grads, {}), core_step(core, grads)  # jit against jit
  assert_trees_equal(face.params(handle), core.target)
