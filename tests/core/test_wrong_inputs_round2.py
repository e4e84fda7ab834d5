"""Wrong inputs, round 2 (issue 26): what a new user still met with no error and a wrong
result, or with a traceback from deep inside optax, JAX or NumPy naming no field or path.

Each case checks the error type, the field or path it names, the fix it gives, and that
the optimizer is unchanged afterwards; step cases run eagerly and under ``jax.jit``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal
from wrong_input_cases import GRADS, PARAMS, snapshot, steps

import optcore
from optcore import config, legacy
from optcore.t5x import Adafactor


def steps_with(overrides):
  """Eager, and jitted with the overrides closed over (a schedule is no jit argument)."""
  eager = lambda opt, g: opt.apply_gradient(g, **overrides)
  return [eager, jax.jit(eager)]


# 1. Config arguments at every depth are checked before anything is called.


@pytest.mark.parametrize(
  ("cfg", "message"),
  [
    (
      {"name": "chain", "transformations": [{"transform": "clip_by_global_norm", "max_norm": "1"}]},
      r"at 'transformations\[0\]\.max_norm': expected a number, found the string '1'.*Write it",
    ),
    (
      {"name": "chain", "transformations": [{"transform": "clip_by_global_norm", "norm": 1.0}]},
      r"at 'transformations\[0\]\.norm': optax\.clip_by_global_norm has no argument 'norm'.*"
      r"max_norm",
    ),
    (
      {"name": "chain", "transformations": [{"transform": "clip_by_global_norm"}]},
      r"at 'transformations\[0\]\.max_norm': optax\.clip_by_global_norm needs 'max_norm'",
    ),
    (
      {
        "name": "chain",
        "transformations": [
          {"transform": "clip_by_global_norm", "max_norm": {"name": "sgd", "learning_rate": 1.0}}
        ],
      },
      r"at 'transformations\[0\]\.max_norm': expected a number, found \{'name': 'sgd'",
    ),
    (
      {"name": "chain", "transformations": [{"transform": "global_norm", "updates": 1.0}]},
      r"at 'transformations\[0\]\.transform': optax\.global_norm does not build a "
      r"transformation.*not called",
    ),
    (
      {
        "name": "adam",
        "learning_rate": {
          "schedule": "cosine_decay_schedule",
          "init_value": "1e-3",
          "decay_steps": 9,
        },
      },
      r"at 'learning_rate\.init_value': expected a number, found the string '1e-3'",
    ),
    (
      {
        "name": "adam",
        "learning_rate": {
          "schedule": "cosine_decay_schedule",
          "init_value": 1e-3,
          "decay_steps": 0,
        },
      },
      r"at 'learning_rate': schedule 'cosine_decay_schedule': .*positive decay_steps",
    ),
    (
      {"name": "adam", "learning_rate": {"schedule": "cosine_decay_schedule", "init_value": 1e-3}},
      r"at 'learning_rate\.decay_steps': cosine_decay_schedule needs 'decay_steps'",
    ),
  ],
  ids=[
    "transform-string",
    "transform-unknown-argument",
    "transform-missing-argument",
    "transform-optimizer-for-number",
    "not-a-transformation",
    "schedule-string",
    "schedule-zero-steps",
    "schedule-missing-argument",
  ],
)
def test_config_arguments_below_the_top_level_are_checked_naming_the_field(cfg, message):
  with pytest.raises(config.ConfigError, match=message):
    config.from_config(cfg)


def test_a_not_a_transformation_function_is_never_called(monkeypatch):
  calls = []
  monkeypatch.setattr(optax, "global_norm", lambda *a, **k: calls.append(a) or 0.0)
  with pytest.raises(config.ConfigError, match="global_norm"):
    config.from_config(
      {"name": "chain", "transformations": [{"transform": "global_norm", "updates": 1.0}]}
    )
  assert calls == []


def test_an_optimizer_config_where_optax_takes_a_transformation_is_built_into_one():
  cfg = {
    "name": "chain",
    "transformations": [
      {"transform": "masked", "inner": {"name": "sgd", "learning_rate": 0.5}, "mask": {"w": True}}
    ],
  }
  opt_def = config.from_config(cfg)
  new = opt_def.create({"w": jnp.ones(2)}).apply_gradient({"w": jnp.ones(2)})
  expected = optax.masked(optax.sgd(0.5), {"w": True})
  updates, _ = expected.update({"w": jnp.ones(2)}, expected.init({"w": jnp.ones(2)}))
  assert_trees_equal(new.target, optax.apply_updates({"w": jnp.ones(2)}, updates))
  assert config.to_config(opt_def) == cfg
  assert config.from_config(config.to_config(opt_def)) == opt_def


# 2. Config numbers and dtypes: finite, representable numbers; floating dtypes for state.


@pytest.mark.parametrize(
  ("field", "value", "message"),
  [
    ("learning_rate", float("inf"), r"at 'learning_rate': inf is not a finite number"),
    ("learning_rate", float("nan"), r"at 'learning_rate': nan is not a finite number"),
    ("learning_rate", 10**400, r"at 'learning_rate': an integer of 401 digits is not a finite"),
    ("b1", 1e39, r"at 'b1': 1e\+39 is not a finite number that float32 can hold"),
    ("mu_dtype", "int8", r"at 'mu_dtype': 'int8' is not a floating dtype.*'bfloat16'"),
    ("mu_dtype", "object", r"at 'mu_dtype': 'object' is not a floating dtype"),
  ],
)
def test_config_numbers_are_finite_and_state_dtypes_floating(field, value, message):
  cfg = {"name": "adam", "learning_rate": 1e-3, field: value}
  with pytest.raises(config.ConfigError, match=message):
    config.from_config(cfg)


# 3. Legacy and T5X definitions take a schedule: it is read at each step.


@pytest.mark.parametrize("name", ["legacy.Adam", "legacy.Momentum", "adafactor.Adafactor"])
def test_a_legacy_definition_from_a_config_reads_its_schedule_at_each_step(name):
  schedule = {"schedule": "linear_schedule", "init_value": 0.1, "end_value": 0.0}
  opt_def = config.from_config({"name": name, "learning_rate": {**schedule, "transition_steps": 4}})
  fixed = config.from_config({"name": name, "learning_rate": 0.1})
  step = jax.jit(lambda o: o.apply_gradient(GRADS))
  scheduled, by_hand = opt_def.create(PARAMS), fixed.create(PARAMS)
  for i in range(3):
    scheduled = step(scheduled)
    by_hand = jax.jit(lambda o, lr: o.apply_gradient(GRADS, learning_rate=lr))(
      by_hand, 0.1 * (1 - i / 4)
    )
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), scheduled.target, by_hand.target
  )
  assert config.to_config(opt_def)["learning_rate"]["schedule"] == "linear_schedule"


# 4. Override values.


@pytest.mark.parametrize(
  ("make", "overrides", "error", "message"),
  [
    (lambda: optcore.adam(1e-3), {"learning_rate": 1e-3 + 1e-3j}, TypeError, "is complex"),
    (
      lambda: optcore.adam(1e-3),
      {"learning_rate": jnp.asarray(1e-3, jnp.complex64)},
      TypeError,
      "takes a real number",
    ),
    (
      lambda: legacy.Adam(1e-3),
      {"learning_rate": lambda count: jnp.full(3, 1e-3)},
      ValueError,
      r"learning_rate has shape \(3,\)",
    ),
    (
      lambda: legacy.Adam(1e-3),
      {"learning_rate": lambda count: None},
      TypeError,
      r"returns None for a step count.*lambda count",
    ),
    (
      lambda: legacy.Adam(1e-3),
      {"learning_rate": lambda: 1e-3},
      TypeError,
      r"read as a schedule of the step count, but calling it with a step count failed",
    ),
  ],
  ids=["complex", "complex-array", "schedule-vector", "schedule-none", "not-a-schedule"],
)
def test_override_values_that_do_not_fit_are_refused_at_trace_time(make, overrides, error, message):
  optimizer = make().create(PARAMS)
  before = snapshot(optimizer)
  for step in steps_with(overrides):
    with pytest.raises(error, match=message):
      step(optimizer, GRADS)
  assert_trees_equal(optimizer, before)


def test_a_traced_flag_says_that_flags_must_be_static():
  optimizer = optcore.sgd(0.1, momentum=0.9).create(PARAMS)
  step = jax.jit(lambda o, flag: o.apply_gradient(GRADS, nesterov=flag))
  with pytest.raises(TypeError, match=r"nesterov is a traced boolean.*static_argnames='nesterov'"):
    step(optimizer, jnp.asarray(True))
  static = jax.jit(lambda o, flag: o.apply_gradient(GRADS, nesterov=flag), static_argnames="flag")
  eager = optimizer.apply_gradient(GRADS, nesterov=True)
  assert_trees_equal(static(optimizer, flag=True).target, eager.target)


# 5. hyper_params= with a plain dict: the other hyper-parameters keep their values.


@pytest.mark.parametrize("make", [lambda: optcore.adam(0.1, b1=0.5), lambda: legacy.Adam(0.1, 0.5)])
def test_a_partial_hyper_params_dict_keeps_the_definitions_other_values(make):
  optimizer = make().create(PARAMS)
  replaced = optimizer.apply_gradient(GRADS, hyper_params={"learning_rate": 0.2})
  by_keyword = optimizer.apply_gradient(GRADS, learning_rate=0.2)
  assert_trees_equal(replaced, by_keyword)
  with pytest.raises(TypeError, match="unknown hyper-parameter 'lr'"):
    optimizer.apply_gradient(GRADS, hyper_params={"lr": 0.2})
  with pytest.raises(ValueError, match="learning_rate=None is refused"):
    optimizer.apply_gradient(GRADS, hyper_params={"learning_rate": None})


# 6. Restores.


def test_a_string_restored_into_a_python_number_is_refused_naming_the_path():
  class State(dict):
    pass

  opt_def = legacy.Momentum(0.1)
  optimizer = opt_def.create({"w": jnp.ones(2)})
  # A state holding a Python float (no dtype to compare with).
  optimizer = optimizer.replace(state=optimizer.state.replace(step=0.0))
  state_dict = optimizer.state_dict()
  state_dict["state"]["step"] = "3"
  with pytest.raises(optcore.StateDictError, match=r"at 'state/step': expected a number like 0\.0"):
    optimizer.restore_state(state_dict)
  state_dict["state"]["step"] = 3
  assert optimizer.restore_state(state_dict).state.step == 3


def test_an_int_key_where_a_string_key_is_expected_is_said_as_found():
  optimizer = optcore.adam(0.1).create({"layers": [jnp.ones(2)]})
  state_dict = optimizer.state_dict()
  state_dict["target"]["layers"] = {0: np.ones(2, np.float32)}
  with pytest.raises(
    optcore.StateDictError,
    match=r"at 'target/layers': found the key 0 \(int\).*Write the key as '0'",
  ):
    optimizer.restore_state(state_dict)


@pytest.mark.parametrize("make", [lambda: optcore.adam(0.1), lambda: legacy.Adam(0.1)])
def test_state_dicts_of_a_600_deep_tree_round_trip_as_optax_handles_it(make):
  params = jnp.ones(2)
  for _ in range(600):
    params = {"a": params}
  optimizer = make().create(params).apply_gradient(params)
  restored = optimizer.restore_state(optimizer.state_dict())
  assert_trees_equal(restored, optimizer)
  assert optcore.from_state_dict(params, optcore.to_state_dict(params)) is not None


# 7. Parameters and gradients.


def test_a_prng_key_among_the_parameters_is_named_with_its_path():
  with pytest.raises(TypeError, match=r"'/key' has a PRNG key key<fry>.*PRNG keys"):
    optcore.adam(0.1).create({"key": jax.random.key(0), "w": jnp.ones(2)})


def test_a_gradient_where_the_parameter_is_none_names_the_path_and_the_fix():
  optimizer = optcore.adam(0.1).create({"frozen": None, "w": jnp.ones(2)})
  for step in steps():
    with pytest.raises(
      optcore.TreeMismatchError, match=r"an array of shape \(2,\) at '/frozen'.*Give None"
    ):
      step(optimizer, {"frozen": jnp.ones(2), "w": jnp.ones(2)})


# 8. One T5X Adafactor in two groups of a MultiOptimizer.


def test_one_adafactor_in_two_groups_gets_each_groups_factor_rules():
  params = {"enc": {"w": jnp.ones((2, 4, 3))}, "dec": {"w": jnp.ones((2, 3, 4))}}
  axes = {"enc": {"w": P("layers", "embed", "mlp")}, "dec": {"w": P("layers", "mlp", "embed")}}
  shared = Adafactor(0.1)
  multi = optcore.MultiOptimizer((r"enc", shared), (r"dec", shared)).with_param_axes(axes)
  separate = optcore.MultiOptimizer((r"enc", Adafactor(0.1)), (r"dec", Adafactor(0.1)))
  separate = separate.with_param_axes(axes)
  assert shared.hyper_params.factor_map is None  # the shared definition is not changed
  got = multi.create(params).apply_gradient(params)
  assert_trees_equal(
    got, separate.create(params).apply_gradient(params).replace(optimizer_def=multi)
  )
  # dec's own rule (BATCH, COLUMN, ROW) keeps its rows in v_row; enc's would keep (2, 3).
  assert got.state.param_states["dec"]["w"].v_row.shape == (2, 4)


# 9. DynamicScale with has_aux on a function that returns only the loss.


def test_dynamic_scale_has_aux_on_a_scalar_function_says_what_jax_says():
  grad_fn = legacy.DynamicScale().value_and_grad(lambda p: jnp.sum(p**2), has_aux=True)
  with pytest.raises(TypeError, match=r"has_aux=True\) requires fun to return a pair.*an array"):
    grad_fn(jnp.ones(2))


def test_a_partial_hyper_params_record_keeps_the_other_values_too():
  optimizer = optcore.adam(0.1, b1=0.5).create(PARAMS)
  partial = optcore.HyperParams(learning_rate=0.2)
  assert_trees_equal(
    optimizer.apply_gradient(GRADS, hyper_params=partial),
    optimizer.apply_gradient(GRADS, learning_rate=0.2),
  )
  # A whole record replaces them all, as in flax.optim and T5X.
  whole = optimizer.optimizer_def.hyper_params.replace(learning_rate=0.2, b1=0.9)
  assert_trees_equal(
    optimizer.apply_gradient(GRADS, hyper_params=whole),
    optimizer.apply_gradient(GRADS, learning_rate=0.2, b1=0.9),
  )


def test_a_transform_config_where_optax_takes_a_transformation_and_json_schedule_keys():
  cfg = {
    "name": "chain",
    "transformations": [
      {
        "transform": "masked",
        "inner": {"transform": "scale", "step_size": -0.5},
        "mask": {"w": True, "b": False},
      }
    ],
  }
  opt_def = config.from_config(cfg)
  params = {"w": jnp.ones(2), "b": jnp.ones(2)}
  new = opt_def.create(params).apply_gradient(params)
  np.testing.assert_array_equal(new.target["w"], 0.5)
  np.testing.assert_array_equal(new.target["b"], 2.0)  # masked out: the raw gradient, as optax
  assert config.from_config(config.to_config(opt_def)) == opt_def
  # JSON has string keys only; optax's piecewise boundaries are step counts.
  schedule = {"schedule": "piecewise_constant_schedule", "init_value": 0.1}
  lr = config.from_config(
    {"name": "sgd", "learning_rate": {**schedule, "boundaries_and_scales": {"2": 0.5}}}
  ).hyper_params.learning_rate
  assert [float(lr(c)) for c in (0, 2)] == [pytest.approx(0.1), pytest.approx(0.05)]


@pytest.mark.parametrize(
  ("leaf", "message"), [("abc", r"'/s' is of type str \('abc'\)"), (object(), "of type object")]
)
def test_a_parameter_that_is_no_array_is_named_by_path(leaf, message):
  with pytest.raises(TypeError, match=message):
    optcore.adam(0.1).create({"w": jnp.ones(2), "s": leaf})


@pytest.mark.parametrize("given", [[0.2], (0.2,), None])
def test_hyper_params_that_are_no_record_are_refused_naming_the_form(given):
  optimizer = legacy.Adam(0.1).create(PARAMS)
  with pytest.raises(TypeError, match=r"hyper_params= takes the hyper-parameters by name"):
    optimizer.apply_gradient(GRADS, hyper_params=given)
