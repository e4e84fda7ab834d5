"""Wrong inputs in the core face: a clear error naming the path or field, and nothing changed.

Each case is one a new user hits (issue 16's list); the faces' own files test
the same cases through Equinox, Treex and Flax.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal
from wrong_input_cases import GRADS, PARAMS, snapshot, steps

import optcore
from optcore import config, legacy
from optcore.t5x import Adafactor

# 1-2. Gradients: structure, container, shape.


@pytest.mark.parametrize(
  ("grads", "message"),
  [
    ({"layer": {"b": jnp.ones((2, 1)), "w": GRADS["layer"]["w"]}}, r"shape \(2, 1\) at '/layer/b'"),
    ({"layer": {"b": jnp.ones(1), "w": GRADS["layer"]["w"]}}, r"shape \(1,\) at '/layer/b'"),
    (
      (GRADS["layer"]["b"], GRADS["layer"]["w"]),
      r"a tuple at '/' where the parameters have a dict",
    ),
    ({"layer": [GRADS["layer"]["b"], GRADS["layer"]["w"]]}, r"a list at '/layer' where"),
    ({"layer": {"b": None, "w": GRADS["layer"]["w"]}}, r"None at '/layer/b'"),
  ],
  ids=["extra-axis", "broadcasting", "tuple-for-dict", "list-for-dict", "none"],
)
def test_gradients_that_do_not_fit_name_the_path(grads, message):
  optimizer = optcore.adam(1e-2).create(PARAMS)
  before = snapshot(optimizer)
  for step in steps():
    with pytest.raises(optcore.TreeMismatchError, match=message):
      step(optimizer, grads)
  assert_trees_equal(optimizer, before)


# 3-4. Override values.


@pytest.mark.parametrize(
  ("value", "error", "message"),
  [
    (
      None,
      ValueError,
      r"learning_rate=None is refused: the optimizer was built with learning_rate=0\.01",
    ),
    ("0.1", TypeError, r"learning_rate='0\.1' is a str; learning_rate takes a number"),
    (True, TypeError, r"learning_rate=True is a bool"),
    (
      np.ones(2, np.float32),
      ValueError,
      r"learning_rate has shape \(2,\); learning_rate takes a scalar",
    ),
    (float("nan"), ValueError, r"learning_rate=nan is not finite"),
  ],
  ids=["none", "string", "bool", "vector", "nan"],
)
def test_override_values_are_validated_and_name_the_hyper_parameter(value, error, message):
  for opt_def in (optcore.adam(1e-2), legacy.Adam(1e-2)):
    optimizer = opt_def.create(PARAMS)
    with pytest.raises(error, match=message):
      optimizer.apply_gradient(GRADS, learning_rate=value)
  # traced scalars, numpy scalars and numbers pass
  jitted = jax.jit(lambda opt, lr: opt.apply_gradient(GRADS, learning_rate=lr))
  assert int(jitted(optimizer, 1e-3).state.step) == 1
  assert int(optimizer.apply_gradient(GRADS, learning_rate=np.float32(1e-3)).state.step) == 1


def test_a_flag_takes_a_bool():
  optimizer = legacy.Momentum(0.1, nesterov=False).create(PARAMS)
  with pytest.raises(TypeError, match=r"nesterov=1 is a int; nesterov is a flag"):
    optimizer.apply_gradient(GRADS, nesterov=1)


# 5. Overrides the algorithm ignores: the original's numbers, and a warning.


@pytest.mark.parametrize(
  ("make", "override", "message"),
  [
    (lambda: Adafactor(0.1), {"beta1": 0.9}, r"beta1=0\.9 has no effect: this Adafactor was built"),
    (lambda: Adafactor(0.1), {"factored": False}, r"\['factored'\] have no effect"),
    (lambda: Adafactor(0.1), {"min_dim_size_to_factor": 1}, r"\['min_dim_size_to_factor'\]"),
    (lambda: legacy.RMSProp(0.1), {"centered": True}, r"\['centered'\] have no effect"),
    (lambda: legacy.Adafactor(0.1), {"beta1": 0.5}, r"beta1=0\.5 has no effect"),
  ],
)
def test_ignored_overrides_warn_and_keep_the_originals_numbers(make, override, message):
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)}
  grads = {"w": jnp.full((4, 3), 0.5)}
  plain = make().create(params).apply_gradient(grads)
  with pytest.warns(UserWarning, match=message):
    overridden = make().create(params).apply_gradient(grads, **override)
  assert_trees_equal(overridden.state, plain.state)
  assert_trees_equal(overridden.target, plain.target)


# 7. No learning rate.


@pytest.mark.parametrize("make", [legacy.GradientDescent, legacy.Adam, Adafactor])
def test_a_step_without_a_learning_rate_says_how_to_pass_one(make):
  optimizer = make().create(PARAMS)
  with pytest.raises(
    optcore.MissingHyperParameterError, match=r"no learning rate provided\..*learning_rate="
  ):
    optimizer.apply_gradient(GRADS)
  with pytest.raises(AssertionError):  # flax.optim asserted it
    optimizer.apply_gradient(GRADS)
  assert int(optimizer.apply_gradient(GRADS, learning_rate=0.1).state.step) == 1


# 8. Integer leaves.


@pytest.mark.parametrize(
  "make", [lambda: optcore.adam(1.0), lambda: legacy.Adam(1.0), lambda: Adafactor(1.0)]
)
def test_integer_parameters_are_refused_naming_the_path(make):
  params = {"counter": jnp.asarray(3), "w": jnp.ones(2)}
  with pytest.raises(TypeError, match=r"parameter at '/counter' has dtype int32.*focus="):
    make().create(params)
  # Left unselected, an integer leaf is frozen as it is.
  floats = lambda path, x: jnp.issubdtype(x.dtype, jnp.inexact)
  optimizer = make().create(params, focus=floats)
  new = optimizer.apply_gradient({"counter": jnp.asarray(0), "w": jnp.ones(2)})
  assert new.target["counter"].dtype == jnp.int32 and int(new.target["counter"]) == 3


# 11. Factor rules from logical axes after create (T5X's set_param_axes changed the definition
# an optimizer held; the core's definitions are immutable, and the T5X face refuses it:
# tests/flax/test_t5x_train_state.py).


def test_with_param_axes_after_create_leaves_the_optimizer_and_its_definition_as_they_were():
  opt_def = Adafactor(0.1)
  optimizer = opt_def.create({"w": jnp.ones((4, 3))})
  told = opt_def.with_param_axes({"w": P("embed", "mlp")})
  assert told is not opt_def and told != opt_def
  assert opt_def.hyper_params.factor_map is None and told.hyper_params.factor_map is not None
  assert optimizer.optimizer_def is opt_def
  assert int(optimizer.apply_gradient({"w": jnp.ones((4, 3))}).state.step) == 1
  assert not hasattr(opt_def, "set_param_axes")  # only the T5X face changes one in place


# 12. Restores of values that do not fit.


@pytest.mark.parametrize(
  ("edit", "message"),
  [
    (
      lambda sd: sd["state"].update(step=1.5),
      r"at 'state/step'.*1\.5, which is not a whole number",
    ),
    (
      lambda sd: sd["target"]["layer"].update(b=["a", "b"]),
      r"at 'target/layer/b'.*holding strings",
    ),
  ],
  ids=["fractional-step", "strings"],
)
def test_a_restore_of_values_that_do_not_fit_names_the_path_and_changes_nothing(edit, message):
  optimizer = optcore.adam(1e-2).create(PARAMS).apply_gradient(GRADS)
  state_dict = optimizer.state_dict()
  edit(state_dict)
  before = snapshot(optimizer)
  with pytest.raises(optcore.StateDictError, match=message):
    optimizer.restore_state(state_dict)
  assert_trees_equal(optimizer, before)
  whole = optimizer.state_dict()
  whole["state"]["step"] = 2.0  # a whole number is restored exactly
  assert int(optimizer.restore_state(whole).state.step) == 2


# 6 and 13. Configs.


@pytest.mark.parametrize(
  ("cfg", "message"),
  [
    (
      {"name": "adam", "learning_rate": "1e-3"},
      r"at 'learning_rate'.*refused, not converted.*1\.0e-3",
    ),
    ({"name": "adam", "learning_rate": True}, r"at 'learning_rate': expected a number"),
    ({"name": "adam", "learning_rate": "one"}, r"at 'learning_rate': expected a number"),
    ({"name": "adam", "learning_rate": None}, r"at 'learning_rate'.*empty YAML field"),
    ({"name": "adam"}, r"at 'learning_rate': adam needs 'learning_rate'"),
    ({"name": "legacy.Adam"}, r"at 'learning_rate': legacy.Adam needs 'learning_rate'"),
    ({"name": "sgd", "learning_rate": 0.1, "nesterov": "yes"}, r"at 'nesterov'.*flag"),
    (
      {"name": "chain", "transformations": [{"transform": "__class__"}]},
      r"at 'transformations\[0\]\.transform'.*not a public optax transformation",
    ),
    (
      {"name": "chain", "transformations": [{"transform": "_src"}]},
      r"'_src' is not a public optax transformation",
    ),
    (
      {
        "name": "chain",
        "transformations": [{"transform": "apply_updates", "params": 1, "updates": 1}],
      },
      r"at 'transformations\[0\]\.transform'.*does not build a transformation",
    ),
    ({"name": "adam", "learning_rate": {"schedule": "__init__"}}, r"no schedule '__init__'"),
  ],
)
def test_configs_are_type_checked_with_the_field_path(cfg, message):
  with pytest.raises(config.ConfigError, match=message):
    config.from_config(cfg)


def test_a_t5x_adafactor_config_takes_logical_factor_rules_and_round_trips():
  cfg = {
    "name": "adafactor.Adafactor",
    "learning_rate": 0.01,
    "logical_factor_rules": {"embed": "row", "mlp": "column"},
  }
  opt_def = config.from_config(cfg)
  assert config.to_config(opt_def) == cfg
  assert config.from_config(config.to_config(opt_def)) == opt_def
  opt_def = opt_def.with_param_axes({"w": P("layers", "embed", "mlp")})
  state = opt_def.create({"w": jnp.ones((2, 4, 3))}).state.param_states["w"]
  assert state.v_row.shape == (2, 4) and state.v_col.shape == (2, 3)


# 14. Non-finite updates in Adafactor.


def test_skip_nonfinite_updates_keeps_infinities_out_of_the_state_where_t5xs_flag_does_not():
  params = {"w": jnp.array([1.0, 2.0])}
  grads = {"w": jnp.array([jnp.inf, 1.0])}
  t5x = Adafactor(0.1, skip_nan_updates=True).create(params).apply_gradient(grads)
  assert np.isinf(t5x.state.param_states["w"].v[0])  # T5X's flag checks NaN only
  ours = Adafactor(0.1, skip_nonfinite_updates=True).create(params).apply_gradient(grads)
  assert np.all(np.isfinite(ours.state.param_states["w"].v))
  assert np.all(np.isfinite(ours.target["w"]))
  assert "skip_nonfinite_updates" not in Adafactor(0.1).hyper_params  # T5X's 17 fields kept


def test_messages_name_an_optax_definition_by_its_alias():
  with pytest.raises(TypeError, match=re.escape("adamw: the override weight_decay='0.1'")):
    optcore.adamw(1e-2).create(PARAMS).apply_gradient(GRADS, weight_decay="0.1")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    stepped = optcore.adamw(1e-2).create(PARAMS).apply_gradient(GRADS, weight_decay=np.float32(0.1))
  assert int(stepped.state.step) == 1
