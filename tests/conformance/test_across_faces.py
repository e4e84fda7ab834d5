"""Checks every face of `faces.FACES` passes alike: checkpoints that move between
faces, warnings that name the user's line, and wrong inputs refused with the
parameter's path and nothing lost. A face added to the registry joins them all."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from faces import FACES
from tree_testing import assert_trees_equal

import optcore

legacy = optcore.legacy


def params():
  return {"kernel": jnp.arange(6.0).reshape(2, 3) / 6, "bias": jnp.array([0.1, -0.2, 0.3])}


def grads(scale=1.0):
  return {"kernel": jnp.full((2, 3), 0.5 * scale), "bias": jnp.array([1.0, -1.0, 0.5]) * scale}


def test_every_adapter_package_is_a_face_of_the_registry():
  # The development page's checklist for a new face, enforced: its package is in FACES.
  packages = Path(__file__).resolve().parents[2] / "packages"
  modules = {
    module.name
    for source in packages.glob("*/src")
    for module in source.iterdir()
    if (module / "__init__.py").exists()
  }
  assert {"optcore", "optcore_flax", "optcore_equinox", "optcore_treex"} <= modules  # all seen
  missing = modules - {face.module for face in FACES}
  assert not missing, f"add a Face for {sorted(missing)} to tests/support/faces.py"


# Checkpoints.


@pytest.mark.parametrize(("saver", "restorer"), list(itertools.permutations(FACES, 2)), ids=str)
def test_a_state_saved_by_one_face_restores_into_another(saver, restorer):
  opt_def = optcore.adamw(1e-2, weight_decay=0.1)
  saved = saver.create(opt_def, params())
  for i in range(3):
    saved = saver.step(saved, grads(1.0 + i), {})
  written = saver.state_dict(saved)

  fresh = restorer.create(opt_def, restorer.params(restorer.create(opt_def, saver.params(saved))))
  restored = restorer.restore(fresh, {**restorer.state_dict(fresh), "state": written["state"]})
  # The next step agrees with the saver's own next step.
  assert_trees_equal(
    restorer.params(restorer.step(restored, grads(2.0), {})),
    saver.params(saver.step(saved, grads(2.0), {})),
  )


# Warnings point at the line that called the face, not at optcore's files.


def _caught(fn):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    fn()
  assert caught, "no warning"
  return caught


@pytest.mark.parametrize("face", FACES, ids=str)
@pytest.mark.parametrize("jitted", [False, True], ids=["eager", "jit"])
def test_an_override_warning_names_the_line_that_called_the_face(face, jitted):
  import faces

  handle = face.create(legacy.RMSProp(0.1, centered=True), params())
  step = lambda h, g: face.step(h, g, {"centered": False})  # a flag: a Python bool, not traced
  caught = _caught(lambda: (face.jit(step) if jitted else step)(handle, grads()))
  assert [w.filename for w in caught] == [faces.__file__], [str(w.message) for w in caught]


@pytest.mark.parametrize("face", FACES, ids=str)
def test_an_adafactor_and_a_multi_optimizer_warning_name_the_callers_line(face):
  import faces

  handle = face.create(legacy.Adafactor(0.1), params())
  caught = _caught(lambda: face.step(handle, grads(), {"beta1": 0.9}))
  assert {w.filename for w in caught} == {faces.__file__}
  multi = optcore.MultiOptimizer((r"kernel", optcore.sgd(0.1)), (r"nothing", optcore.adam(0.1)))
  caught = _caught(lambda: face.create(multi, params()))
  assert {w.filename for w in caught} == {faces.__file__}, [str(w.message) for w in caught]


def _nothing(leaf):
  return False


def test_the_faces_own_warnings_name_the_users_line():
  import optcore_equinox
  from optcore_flax import optimizers

  caught = _caught(lambda: optcore_equinox.Optimizer(optcore.sgd(0.1), params(), wrt=_nothing))
  assert {w.filename for w in caught} == {__file__}

  chain = optimizers.chain([optcore.sgd(0.1).as_optax()])
  opt = chain.create(params())
  caught = _caught(lambda: opt.apply_gradient(grads(), learning_rate=0.1))
  assert {w.filename for w in caught} == {__file__}

  loss = lambda p: jnp.sum(p["kernel"] ** 2)
  caught = _caught(lambda: optcore.sgd(0.1).create(params()).optimize(loss))
  assert {w.filename for w in caught} == {__file__}


# Wrong inputs: the path named, nothing lost.


WRONG_GRADIENTS = {
  "wrong_shape": lambda g: {**g, "kernel": jnp.ones((3, 2))},
  "none": lambda g: {**g, "kernel": None},
}


@pytest.mark.parametrize("face", FACES, ids=str)
@pytest.mark.parametrize("case", list(WRONG_GRADIENTS))
def test_a_wrong_gradient_is_named_and_the_state_is_kept(face, case):
  handle = face.step(face.create(optcore.adam(0.1), params()), grads(), {})
  before = face.state_dict(handle)
  with pytest.raises(optcore.TreeMismatchError, match="kernel"):
    face.step(handle, WRONG_GRADIENTS[case](grads()), {})
  assert_trees_equal(face.state_dict(handle), before)


def _mu(state_dict):
  return state_dict["state"]["param_states"]["0"]["mu"]


WRONG_STATE_DICTS = {
  "wrong_shape": lambda sd: _mu(sd).update(kernel=np.zeros((5, 5), np.float32)),
  "wrong_dtype": lambda sd: _mu(sd).update(kernel=np.zeros((2, 3), np.int8)),
  "missing_key": lambda sd: _mu(sd).pop("kernel"),
  "extra_key": lambda sd: _mu(sd).update(kernel_2=np.zeros((2, 3), np.float32)),
}


@pytest.mark.parametrize("face", FACES, ids=str)
@pytest.mark.parametrize("case", list(WRONG_STATE_DICTS))
def test_a_wrong_state_dict_is_named_and_the_state_is_kept(face, case):
  handle = face.step(face.create(optcore.adam(0.1), params()), grads(), {})
  before = face.state_dict(handle)
  bad = jax.tree.map(np.asarray, face.state_dict(handle))
  WRONG_STATE_DICTS[case](bad)
  with pytest.raises(optcore.StateDictError, match="state/param_states/0/mu"):
    face.restore(handle, bad)
  assert_trees_equal(face.state_dict(handle), before)
