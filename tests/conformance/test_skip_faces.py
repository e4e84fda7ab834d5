"""optcore.skip_bad_steps in every face of `faces.FACES`: a run through an injected spike and a
NaN gradient skips the same steps and ends at the core face's parameters, bitwise; the skip
count and the window are in every face's state dict, and a state saved mid-window by one face
continues in every other as the uninterrupted run (issue 40)."""

from __future__ import annotations

import face_data
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from face_data import params
from faces import FACES
from tree_testing import assert_trees_equal

import optcore


def grads(i):
  g = face_data.grads(i)
  if i == 9:
    g = jax.tree.map(lambda x: 50 * x, g)  # the spike
  if i == 12:
    g["kernel"] = g["kernel"].at[1, 1].set(jnp.nan)
  return g


OPT_DEF = optcore.skip_bad_steps(optcore.adam(0.05), window=6, sigmas=3.0, warmup=4)


@pytest.fixture(scope="module")
def core():
  return face_data.run_steps(FACES[0], FACES[0].create(OPT_DEF, params()), range(16), grads)


@pytest.mark.parametrize("face", FACES, ids=str)
def test_every_face_skips_the_spike_and_the_nan_as_the_core_does(face, core):
  handle = face_data.run_steps(face, face.create(OPT_DEF, params()), range(16), grads)
  assert_trees_equal(face.params(handle), core.target)
  written = face.state_dict(handle)["state"]
  assert int(np.asarray(written["param_states"]["skipped"])) == 2
  assert int(np.asarray(written["step"])) == 14
  assert_trees_equal(written, core.state_dict()["state"])


@pytest.mark.parametrize("saver", FACES, ids=str)
def test_a_state_saved_mid_window_continues_in_every_face(saver, core):
  halfway = face_data.run_steps(saver, saver.create(OPT_DEF, params()), range(7), grads)
  saved, at = saver.state_dict(halfway)["state"], saver.params(halfway)
  for restorer in FACES:
    base = restorer.create(OPT_DEF, at)
    resumed = restorer.restore(base, {**restorer.state_dict(base), "state": saved})
    resumed = face_data.run_steps(restorer, resumed, range(7, 16), grads)
    assert_trees_equal(restorer.params(resumed), core.target)


def test_every_face_passes_the_loss_as_value():
  """The loss reaches the wrapper through each face's own spelling of optax's extra argument."""
  import equinox as eqx

  import optcore_equinox
  import optcore_treex
  from optcore_flax import nnx

  opt_def = optcore.skip_bad_steps(optcore.sgd(0.1), window=4, warmup=2, watch="loss")
  nan = jnp.float32(jnp.nan)
  model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, opt_def, wrt=nnx.Param)
  g = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 2)))))(model)
  optimizer.update(model, g, value=jnp.float32(1.0))
  optimizer.update(model, g, value=nan)
  assert int(optcore.skipped_steps(optimizer)) == 1

  eqx_model = eqx.nn.Linear(2, 1, key=jax.random.key(0))
  eqx_opt = optcore_equinox.Optimizer(opt_def, eqx_model)
  eqx_grads = jax.tree.map(jnp.ones_like, eqx_model)
  eqx_model, eqx_opt = eqx_opt.update(eqx_grads, eqx_model, extra_args={"value": nan})
  assert int(optcore.skipped_steps(eqx_opt)) == 1

  treex_opt = optcore_treex.Optimizer(opt_def).init(params())
  treex_opt.update(grads(0), params(), extra_args={"value": nan})
  assert int(optcore.skipped_steps(treex_opt)) == 1
