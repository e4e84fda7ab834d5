"""One table of overrides through every face of `faces.FACES` (the core, Flax,
Equinox and Treex), and each face's ``apply_updates=False`` path where it has one. Each
row is honoured or refused the same way, with the same error and the same
warnings, because every face takes its step through `optcore.adapter.step`."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from faces import FACES
from tree_testing import assert_trees_equal

import optcore
import optcore_treex

legacy = optcore.legacy
KERNEL, BIAS = r"kernel", r"bias"


def params() -> dict[str, Any]:
  return {"kernel": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "bias": jnp.array([0.5, -0.25, 2.0])}


def grads() -> dict[str, Any]:
  return jax.tree.map(lambda p: jnp.cos(p) + 0.1, params())


# (id, definition, overrides, expected error type or None, a phrase of its message or warning)
ROWS: list[tuple[str, Callable[[], Any], dict[str, Any], type | None, str]] = [
  ("honoured", lambda: optcore.adam(1e-3), {"learning_rate": 0.1}, None, ""),
  (
    "honoured_in_chain",
    lambda: optcore.chain([optax.clip_by_global_norm(1.0), optcore.adamw(1e-3)]),
    {"learning_rate": 0.1, "weight_decay": 0.0},
    None,
    "",
  ),
  ("honoured_legacy", lambda: legacy.Momentum(0.1), {"learning_rate": 0.5, "beta": 0.5}, None, ""),
  (
    "honoured_multi",
    lambda: optcore.MultiOptimizer((KERNEL, legacy.Adam(0.1)), (BIAS, legacy.Momentum(0.1))),
    {"learning_rate": 0.01},
    None,
    "",
  ),
  (
    "init_only",
    lambda: optcore.rprop(0.1),
    {"learning_rate": 1.0},
    ValueError,
    "set the optimizer's initial state",
  ),
  (
    "changes_layout",
    lambda: optcore.sgd(0.1),
    {"momentum": 0.9},
    ValueError,
    "would change the optimizer state's layout",
  ),
  ("unknown_name", lambda: optcore.adam(1e-3), {"betas": 0.9}, TypeError, "betas"),
  (
    "unknown_in_chain",
    lambda: optcore.chain([optax.clip_by_global_norm(1.0), optcore.adamw(1e-3)]),
    {"wd": 0.1},
    TypeError,
    "unknown hyper-parameter 'wd' (optcore's name is 'weight_decay'); the valid names are",
  ),
  ("none", lambda: optcore.adam(1e-3), {"learning_rate": None}, ValueError, "=None is refused"),
  ("string", lambda: optcore.adam(1e-3), {"learning_rate": "0.1"}, TypeError, "is a str"),
  ("nan", lambda: optcore.adam(1e-3), {"learning_rate": float("nan")}, ValueError, "not finite"),
  (
    "vector",
    lambda: optcore.adam(1e-3),
    {"learning_rate": jnp.ones(2)},
    ValueError,
    "has shape (2,)",
  ),
  (
    "flag",
    lambda: optcore.sgd(0.1, momentum=0.9),
    {"nesterov": 1},
    TypeError,
    "is a flag",
  ),
  ("complex", lambda: optcore.adam(1e-3), {"learning_rate": 0.1 + 0.2j}, TypeError, "complex"),
  (
    "schedule_of_vectors",
    lambda: legacy.Adam(1e-3),
    {"learning_rate": lambda count: jnp.full(3, 0.1)},
    ValueError,
    "has shape (3,)",
  ),
  (
    "schedule_of_none",
    lambda: legacy.Adam(1e-3),
    {"learning_rate": lambda count: None},
    TypeError,
    "returns None for a step count",
  ),
  (
    "schedule_honoured_legacy",
    lambda: legacy.Adam(1e-3),
    {"learning_rate": lambda count: 0.1 / (1.0 + count)},
    None,
    "",
  ),
  (
    "none_means_off",
    lambda: optcore.t5x.Adafactor(1e-2),
    {"clipping_threshold": None},
    None,
    "",
  ),
  (
    "ready_transformation",
    lambda: optcore.OptaxWrapper(optax.adam(1e-3)),
    {"learning_rate": 0.1},
    TypeError,
    "ready optax transformation",
  ),
  (
    "no_learning_rate",
    lambda: legacy.Adam(),
    {},
    optcore.MissingHyperParameterError,
    "no learning rate provided",
  ),
  (
    "constructor_only",
    lambda: legacy.Adafactor(0.1),
    {"factored": False},
    None,
    "have no effect",
  ),
]


def _stepped(face):
  def run(opt_def, overrides):
    return face.params(face.step(face.create(opt_def, params()), grads(), overrides))

  return run


def _updated(face):
  def run(opt_def, overrides):
    updates = face.updates(face.create(opt_def, params()), grads(), overrides)
    return optax.apply_updates(params(), updates)

  return run


# Every face of the registry, and each one's apply_updates=False path where it has one.
FACE_RUNS = {face.name: _stepped(face) for face in FACES} | {
  f"{face.name}_apply_updates_false": _updated(face) for face in FACES if face.updates
}


def outcome(face: Callable, opt_def: Any, overrides: dict[str, Any]) -> tuple:
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
      result = face(opt_def, dict(overrides))
    except Exception as e:
      # A message that shows the state's tree structure shows the face's own container
      # (FrozenDict, an Equinox module); the words around it are what must agree.
      message = re.sub(r"PyTreeDef\(.*\)\)", "PyTreeDef(...)", str(e))
      return type(e), message, [str(w.message) for w in caught], None
  return None, "", [str(w.message) for w in caught], result


@pytest.mark.parametrize(
  ("name", "build", "overrides", "error", "phrase"), ROWS, ids=[r[0] for r in ROWS]
)
def test_every_face_honours_or_refuses_an_override_alike(name, build, overrides, error, phrase):
  opt_def = build()
  results = {face: outcome(fn, opt_def, overrides) for face, fn in FACE_RUNS.items()}
  core_error, core_message, core_warnings, core_params = results["core"]
  assert core_error is error, (name, core_message)
  assert phrase in core_message + " ".join(core_warnings)
  for face, (face_error, message, caught, new_params) in results.items():
    assert (face_error, message, caught) == (core_error, core_message, core_warnings), face
    if error is None and not face.endswith("_apply_updates_false"):
      assert_trees_equal(new_params, core_params)
    elif error is None:
      # Updates are new - old for per-parameter definitions: equal up to one rounding.
      for got, want in zip(jax.tree.leaves(new_params), jax.tree.leaves(core_params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_an_override_without_params_is_still_checked_in_the_treex_face():
  optimizer = optcore_treex.Optimizer(optcore.rprop(0.1)).init(params())
  with pytest.raises(ValueError, match="set the optimizer's initial state"):
    optimizer.update(grads(), apply_updates=False, learning_rate=1.0)
  optimizer = optcore_treex.Optimizer(optcore.sgd(0.1)).init(params())
  with pytest.raises(ValueError, match="would change the optimizer state's layout"):
    optimizer.update(grads(), apply_updates=False, momentum=0.9)
  updates = optimizer.update(grads(), apply_updates=False, learning_rate=0.5)
  assert_trees_equal(updates, jax.tree.map(lambda g: -0.5 * g, grads()))
