"""optcore.config: plain-data configs to definitions and back."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import optax
import pytest
from optimizer_catalogue import CASES, make_params
from tree_testing import assert_trees_equal

import optcore
from optcore.config import ConfigError, Schedule, from_config, to_config


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_wrapped_optimizer_round_trips_through_json(case):
  opt_def = case.optcore_factory()(**case.optcore_kwargs())
  config = json.loads(json.dumps(to_config(opt_def)))
  assert config["name"] == case.name
  assert from_config(config) == opt_def


@pytest.mark.parametrize(
  "opt_def",
  [
    optcore.legacy.Adam(1e-3, weight_decay=0.1),
    optcore.legacy.RMSProp(1e-3, centered=True),
    optcore.legacy.Adafactor(1e-2, beta1=0.9, dtype_momentum=jnp.bfloat16),
    optcore.t5x.Adafactor(1e-2, global_norm_clip_threshold=1.0, skip_nan_updates=True),
    optcore.MultiOptimizer(
      ("kernel$", optcore.adamw(1e-3)), ("bias$", optcore.legacy.Momentum(0.1))
    ),
  ],
  ids=["legacy-adam", "legacy-rmsprop", "legacy-adafactor", "t5x-adafactor", "multi"],
)
def test_legacy_and_multi_round_trip(opt_def):
  config = json.loads(json.dumps(to_config(opt_def)))
  assert from_config(config) == opt_def


def _legacy_definitions() -> list[str]:
  return [
    name
    for name in optcore.legacy.__all__
    if isinstance(getattr(optcore.legacy, name), type)
    and issubclass(getattr(optcore.legacy, name), optcore.OptimizerDef)
    and name != "ReplicatedOptimizer"  # holds devices: opt.replicate() makes one
  ]


@pytest.mark.parametrize("name", _legacy_definitions())
def test_every_definition_of_optcore_legacy_is_named_by_a_config(name):
  cls = getattr(optcore.legacy, name)
  if name == "WeightNorm":
    opt_def = cls(optcore.legacy.Momentum(0.1, beta=0.8), wn_decay=0.1)
  else:
    opt_def = cls(learning_rate=0.1)
  config = json.loads(json.dumps(to_config(opt_def)))
  assert config["name"] == f"legacy.{name}"
  restored = from_config(config)
  assert type(restored) is cls and restored == opt_def


def test_a_new_legacy_algorithm_is_named_by_a_config_with_no_other_edit(monkeypatch):
  # The development page's recipe: a definition exported by optcore.legacy is a config name.
  class Signum(optcore.legacy.Momentum):
    """Momentum on the gradient's sign (a stand-in for a newly added algorithm)."""

    def apply_param_gradient(self, step, hyper_params, param, state, grad):
      return super().apply_param_gradient(step, hyper_params, param, state, jnp.sign(grad))

  with pytest.raises(ConfigError, match=r"unknown optimizer 'legacy\.Signum'"):
    from_config({"name": "legacy.Signum", "learning_rate": 0.1})
  monkeypatch.setattr(optcore.legacy, "Signum", Signum, raising=False)
  monkeypatch.setattr(optcore.legacy, "__all__", [*optcore.legacy.__all__, "Signum"])
  opt_def = from_config({"name": "legacy.Signum", "learning_rate": 0.1, "beta": 0.5})
  assert type(opt_def) is Signum and opt_def.hyper_params.beta == 0.5
  assert to_config(opt_def) == {"name": "legacy.Signum", "learning_rate": 0.1, "beta": 0.5}


def test_a_config_with_a_schedule_and_a_chain_trains_like_the_code_it_describes():
  config = {
    "name": "chain",
    "transformations": [
      {"transform": "clip_by_global_norm", "max_norm": 1.0},
      {
        "name": "adamw",
        "learning_rate": {
          "schedule": "cosine_decay_schedule",
          "init_value": 0.1,
          "decay_steps": 10,
        },
        "weight_decay": 0.01,
      },
    ],
  }
  ours = from_config(config).create(make_params())
  tx = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(optax.cosine_decay_schedule(0.1, 10), weight_decay=0.01),
  )
  params, state = make_params(), tx.init(make_params())
  grads = jax.tree.map(jnp.ones_like, params)
  step = jax.jit(lambda o: o.apply_gradient(grads))

  @jax.jit  # jit against jit: eager and jitted steps may differ by an ulp
  def raw_step(params, state):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(3):
    ours = step(ours)
    params, state = raw_step(params, state)
  assert_trees_equal(ours.target, params)
  assert (
    to_config(from_config(config))["transformations"][1]["learning_rate"]["schedule"]
    == "cosine_decay_schedule"
  )


@pytest.mark.parametrize(
  ("config", "message"),
  [
    ({"learning_rate": 1e-3}, r"at 'config': missing the 'name' key"),
    (
      {"name": "adamw", "learning_rat": 1e-3},
      r"at 'learning_rat': adamw has no argument 'learning_rat'.*learning_rate",
    ),
    ({"name": "adamz"}, r"at 'name': unknown optimizer 'adamz'; known: .*adamw"),
    (
      {
        "name": "multi",
        "groups": [
          {"select": "k", "optimizer": {"name": "sgd", "learning_rate": 0.1, "momentum": [1]}}
        ],
      },
      r"at 'groups\[0\].optimizer.momentum': expected a number, found \[1\]",
    ),
    (
      {"name": "multi", "groups": [{"select": 3, "optimizer": {"name": "sgd"}}]},
      r"at 'groups\[0\].select': expected a regex",
    ),
    (
      {"name": "adam", "learning_rate": {"schedule": "bogus"}},
      r"at 'learning_rate': optax.schedules has no schedule 'bogus'",
    ),
    (
      {"name": "chain", "transformations": [{"transform": "nope"}]},
      r"at 'transformations\[0\].transform': 'nope' is not a public optax transformation",
    ),
    (
      {"name": "adam", "learning_rate": 1e-3, "mu_dtype": "float33"},
      r"at 'mu_dtype': 'float33' is not a dtype name",
    ),
  ],
)
def test_invalid_configs_name_the_bad_field(config, message):
  with pytest.raises(ConfigError, match=message):
    from_config(config)


def test_what_a_config_cannot_express_is_refused():
  with pytest.raises(ConfigError, match="only regex selectors"):
    to_config(optcore.MultiOptimizer((lambda path, _: True, optcore.sgd(0.1))))
  with pytest.raises(ConfigError, match="ready optax transformation"):
    to_config(optcore.OptaxWrapper(optax.sgd(0.1)))


def test_schedules_compare_by_value():
  a = Schedule("linear_schedule", init_value=1.0, end_value=0.0, transition_steps=4)
  assert a == Schedule("linear_schedule", init_value=1.0, end_value=0.0, transition_steps=4)
  assert optcore.adam(a) == optcore.adam(
    Schedule("linear_schedule", init_value=1.0, end_value=0.0, transition_steps=4)
  )
