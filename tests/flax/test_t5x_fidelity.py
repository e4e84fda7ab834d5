"""T5X's optimizers and Adafactor through optcore_flax: T5X's names, rules, layout and configs.

Expected values come from T5X's published definitions (shared/REFERENCE.md and
t5x/adafactor.py, t5x/optimizers.py), computed here independently.
"""

from __future__ import annotations

import logging
import pathlib
import warnings

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import t5x_trainer
from flax import traverse_util
from flax.core import FrozenDict
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

from optcore_flax import adafactor, optimizers

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW, COL, BATCH = adafactor.FactorDim.ROW, adafactor.FactorDim.COLUMN, adafactor.FactorDim.BATCH


def shapes(optimizer):
  return jax.tree.map(np.shape, optimizer.state_dict()["state"]["param_states"])


# The modules' names.


def test_the_modules_have_the_names_t5x_users_and_tests_reach_for():
  for name in (
    "Adafactor FactorDim HEURISTIC_RULE HParamMap factor_name_to_factordim "
    "standard_logical_factor_rules _AdafactorHyperParams _AdafactorParamState"
  ).split():
    assert hasattr(adafactor, name), name
  for name in (
    "OptimizerState OptimizerDef Optimizer OptaxStatePartitionRules OptaxWrapper "
    "wrap_optax_optimizer chain MultiOptimizer adabelief adagrad adam adamw fromage lars lamb "
    "lion noisy_sgd radam rmsprop sgd yogi dpsgd"
  ).split():
    assert hasattr(optimizers, name), name


def test_adafactor_hyper_params_and_param_state_are_t5xs_records():
  opt_def = adafactor.Adafactor(
    learning_rate=0.1, decay_rate=0.8, beta1=0.0, min_dim_size_to_factor=32
  )
  # T5X's 11 positional fields; its 6 extras keep their defaults.
  assert opt_def.hyper_params == adafactor._AdafactorHyperParams(
    0.1, True, True, 0.0, 0.8, 0, 1.0, None, 32, 1e-30, 1e-3
  )
  assert len(opt_def.hyper_params) == 17
  state = opt_def.init_state({"x": np.zeros((3, 2))})
  want = adafactor._AdafactorParamState(
    np.zeros(1), np.zeros(1), np.zeros((3, 2)), np.zeros((3, 2))
  )
  assert jax.tree.map(np.shape, state.param_states["x"]) == jax.tree.map(np.shape, want)
  assert adafactor._AdafactorParamState._fields == ("v_row", "v_col", "v", "m")


def t5x_factored_step(param, grad, v_row, v_col, step, lr, decay_rate, rows, cols):
  """T5X's factored update of one parameter (float64, heuristic roles, clipping 1)."""
  decay = 1.0 - (step + 1.0) ** -decay_rate
  grad_sqr = grad * grad + 1e-30
  v_row = decay * v_row + (1 - decay) * grad_sqr.mean(axis=cols)
  v_col = decay * v_col + (1 - decay) * grad_sqr.mean(axis=rows)
  row_factor = (v_row / v_row.mean()) ** -0.5
  y = grad * np.expand_dims(row_factor, cols) * np.expand_dims(v_col**-0.5, rows)
  y = y / max(1.0, np.sqrt(np.mean(y * y)))
  scale = lr * max(np.sqrt(np.mean(param * param)), 1e-3)
  return param - scale * y, v_row, v_col


def test_apply_gradient_from_a_given_state_follows_t5xs_definition():
  opt_def = adafactor.Adafactor(learning_rate=0.1, decay_rate=0.8, min_dim_size_to_factor=0)
  rng = np.random.default_rng(0)
  param, grad = (
    rng.normal(size=(3, 2)).astype(np.float32),
    rng.normal(size=(3, 2)).astype(np.float32),
  )
  v_row, v_col = np.array([0.9, 0.7], np.float32), np.array([0.1, 0.2, 0.3], np.float32)
  state = optimizers.OptimizerState(
    1, {"x": adafactor._AdafactorParamState(v_row, v_col, np.zeros(1), np.zeros(1))}
  )
  new_params, new_state = opt_def.apply_gradient(
    opt_def.hyper_params, {"x": param}, state, {"x": grad}
  )
  # (3, 2): the largest dimension (0) is the column, the second (1) the row.
  want_p, want_row, want_col = t5x_factored_step(
    param.astype(np.float64), grad.astype(np.float64), v_row, v_col, 1, 0.1, 0.8, rows=1, cols=0
  )
  assert int(new_state.step) == 2
  np.testing.assert_allclose(new_params["x"], want_p, rtol=1e-6)
  np.testing.assert_allclose(new_state.param_states["x"].v_row, want_row, rtol=1e-6)
  np.testing.assert_allclose(new_state.param_states["x"].v_col, want_col, rtol=1e-6)


# Factor rules, parsed as T5X parses them.


def test_a_none_rule_means_not_factored():
  rules = adafactor.HParamMap([("relpos", None), (".*", adafactor.HEURISTIC_RULE)])
  opt = adafactor.Adafactor(0.1, factor_map=rules, min_dim_size_to_factor=2).create(
    {"relpos": jnp.ones((4, 8)), "kernel": jnp.ones((4, 8))}
  )
  assert shapes(opt)["relpos"] == {"m": (1,), "v": (4, 8), "v_col": (1,), "v_row": (1,)}
  assert shapes(opt)["kernel"] == {"m": (1,), "v": (1,), "v_col": (8,), "v_row": (4,)}


@pytest.mark.parametrize("rule", [(ROW, COL), (COL, ROW)])
def test_an_explicit_rule_on_a_matrix_is_ignored_for_the_heuristic_and_logged(rule, caplog):
  rules = adafactor.HParamMap([("a", rule)])
  with caplog.at_level(logging.WARNING):
    opt = adafactor.Adafactor(min_dim_size_to_factor=8, factor_map=rules).create(
      {"a": jnp.ones((24, 16))}
    )
  # The heuristic: v_row keeps the smaller dimension, v_col the larger.
  assert shapes(opt)["a"] == {"m": (1,), "v": (1,), "v_col": (24,), "v_row": (16,)}
  assert any("falls back to heuristics" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
  ("rule", "v_row", "v_col"),
  [
    ((COL, BATCH, ROW), (4, 16), (24, 4)),
    ((ROW, BATCH, COL), (24, 4), (4, 16)),
    ((COL, ROW, ROW), (4, 16), (24,)),
  ],
)
def test_explicit_rules_on_higher_ranks_factor_as_given(rule, v_row, v_col):
  rules = adafactor.HParamMap([("a", rule)])
  opt = adafactor.Adafactor(min_dim_size_to_factor=8, factor_map=rules).create(
    {"a": jnp.ones((24, 4, 16))}
  )
  assert shapes(opt)["a"] == {"m": (1,), "v": (1,), "v_col": v_col, "v_row": v_row}


def test_a_rank_three_parameter_without_a_rule_raises_t5xs_value_error():
  for opt_def in (
    adafactor.Adafactor(factor_map=None),
    adafactor.Adafactor(factor_map=adafactor.HParamMap([(".*", adafactor.HEURISTIC_RULE)])),
  ):
    with pytest.raises(
      ValueError, match=r"must have an explicit factorization rule: a, \(24, 4, 16\)"
    ):
      opt_def.create({"a": jnp.ones((24, 4, 16))})
  with pytest.raises(ValueError, match="factored is False but factorization rules"):
    adafactor.Adafactor(factored=False, factor_map=adafactor.HParamMap([(".*", None)]))


# MultiOptimizer: T5X's form, one state tree, set_param_axes.


def test_multi_optimizer_in_t5xs_form_equals_one_adafactor_with_a_scale_map():
  rng = np.random.default_rng(0)
  p = {"a": rng.normal(size=(64, 64)) * 100, "b": rng.normal(size=(64, 64)) * 100}
  g = {"a": rng.normal(size=(64, 64)), "b": rng.normal(size=(64, 64))}
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # today's Flax, on its traversals
    scaled = traverse_util.ModelParamTraversal(lambda path, _: "a" not in path)
    unscaled = traverse_util.ModelParamTraversal(lambda path, _: "a" in path)
  multi = optimizers.MultiOptimizer(
    (
      (scaled, adafactor.Adafactor(3.0, decay_rate=0.8)),
      (unscaled, adafactor.Adafactor(3.0, decay_rate=0.8, multiply_by_parameter_scale=False)),
    )
  ).create(p)
  scale_map = adafactor.HParamMap([("a", False), (".*", True)])
  single = adafactor.Adafactor(3.0, multiply_by_parameter_scale=scale_map).create(p)
  assert_trees_equal(multi.state_dict(), single.state_dict())
  assert_trees_equal(multi.apply_gradient(g).state_dict(), single.apply_gradient(g).state_dict())


def test_set_param_axes_hands_each_group_its_own_axes():
  params = {"layers": {"kernel": jnp.ones((2, 8, 4))}, "head": jnp.ones((8, 4))}
  axes = {"layers": {"kernel": P("layers", "embed", "mlp")}, "head": P("embed", "vocab")}
  rules = adafactor.standard_logical_factor_rules()
  opt_def = optimizers.MultiOptimizer(
    [
      ("layers", adafactor.Adafactor(0.1, logical_factor_rules=rules)),
      ("head", adafactor.Adafactor(0.1, min_dim_size_to_factor=2)),
    ]
  )
  opt_def.set_param_axes(axes)
  state = shapes(opt_def.create(params))
  # Scanned layers keep their BATCH axis in both accumulators; the head is heuristic.
  assert state["layers"]["kernel"]["v_row"] == (2, 8) and state["layers"]["kernel"]["v_col"] == (
    2,
    4,
  )
  assert state["head"]["v_row"] == (4,) and state["head"]["v_col"] == (8,)


# derive_logical_axes: None for the step and optax's counters.


def test_derive_logical_axes_gives_none_for_the_step_and_counters_and_round_trips():
  params = FrozenDict({"embedding": jnp.zeros((16, 8)), "scale": jnp.zeros(8)})
  axes = FrozenDict({"embedding": P("vocab", "embed"), "scale": P("embed")})
  wrapper = optimizers.OptaxWrapper(optax.adamw(0.001, weight_decay=0.001))
  optimizer = wrapper.create(params)
  got = wrapper.derive_logical_axes(optimizer, axes)
  want = optimizers.Optimizer(
    wrapper,
    optimizers.OptimizerState(
      None,
      (
        optax.ScaleByAdamState(count=None, mu=axes, nu=axes),
        optax.EmptyState(),
        optax.EmptyState(),
      ),
    ),
    axes,
  )
  assert jax.tree.structure(got) == jax.tree.structure(want)
  assert jax.tree.leaves(got) == jax.tree.leaves(want)
  restored = got.restore_state(got.state_dict())
  assert jax.tree.structure(restored) == jax.tree.structure(got)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
  shardings = wrapper.derive_shardings(optimizer, axes, mesh, [("embed", "model")])
  leaves = jax.tree.leaves(shardings)
  assert len(leaves) == len(jax.tree.leaves(optimizer)) and all(
    isinstance(s, NamedSharding) for s in leaves
  )
  assert shardings.state.step.spec == P()


def test_optax_wrapper_state_dict_drops_empty_states_and_restores_them():
  params = {"w": jnp.ones((2, 3))}
  optimizer = optimizers.OptaxWrapper(optax.adamw(0.001, weight_decay=0.001)).create(params)
  state_dict = optimizer.state_dict()
  assert sorted(state_dict["state"]["param_states"]) == ["0"]
  assert_trees_equal(optimizer.restore_state(state_dict), optimizer)


# The learning rate T5X's trainer passes on every step.


def test_chain_of_ready_transformations_ignores_the_trainers_learning_rate_with_a_warning():
  params = {"w": jnp.linspace(-1.0, 1.0, 6)}
  grads = {"w": jnp.linspace(2.0, -3.0, 6)}
  optimizer = optimizers.chain([optax.clip_by_global_norm(1.0), optax.adamw(1e-2)]).create(params)
  with pytest.warns(UserWarning, match=r"\['learning_rate'\]: ignored, as T5X ignored it"):
    got = optimizer.apply_gradient(grads, learning_rate=5.0)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2))
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_array_equal(got.target["w"], optax.apply_updates(params, updates)["w"])


def test_chain_of_wrapped_factories_honours_the_trainers_learning_rate():
  params = {"w": jnp.linspace(-1.0, 1.0, 6)}
  grads = {"w": jnp.linspace(2.0, -3.0, 6)}
  opt_def = optimizers.chain([optax.clip_by_global_norm(1.0), optimizers.adamw(1e-2)])
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = opt_def.create(params).apply_gradient(grads, learning_rate=5e-2)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(5e-2))
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_array_equal(got.target["w"], optax.apply_updates(params, updates)["w"])


# Gin configs of T5X's shape, with `from t5x import` changed to `from optcore_flax import`.


@pytest.fixture
def gin_config():
  gin.clear_config()
  yield
  gin.clear_config()


def parse_with_trainer(config_file, params, param_axes):
  # The file as T5X's launcher reads it, plus the binding T5X's run configs make.
  trainer = "import t5x_trainer\nt5x_trainer.train.optimizer_def = %OPTIMIZER\n"
  gin.parse_config(config_file.read_text() + trainer)
  return t5x_trainer.train(params=params, param_axes=param_axes)


def test_a_t5x_adafactor_gin_config_builds_t5xs_adafactor(gin_config):
  params = {"layers": {"kernel": jnp.ones((2, 8, 4))}, "embedding": jnp.ones((16, 8))}
  axes = {"layers": {"kernel": P("layers", "embed", "mlp")}, "embedding": P("vocab", "embed")}
  optimizer, logical_axes = parse_with_trainer(
    ROOT / "examples" / "t5x_gin" / "adafactor.gin", params, axes
  )
  opt_def = optimizer.optimizer_def
  assert isinstance(opt_def, adafactor.Adafactor)
  assert opt_def.hyper_params.decay_rate == 0.8
  assert opt_def.hyper_params.logical_factor_rules == adafactor.standard_logical_factor_rules()
  assert int(optimizer.state.step) == 3 and logical_axes.state.step is None
  # set_param_axes factored the scanned kernel per layer.
  kernel_state = optimizer.state.param_states["layers"]["kernel"]
  assert kernel_state.v_row.shape == (2, 8) and kernel_state.v_col.shape == (2, 4)


def test_a_t5x_chain_gin_config_builds_the_chain_and_ignores_the_trainers_rate(gin_config):
  params = {"w": jnp.linspace(-1.0, 1.0, 6)}
  with pytest.warns(UserWarning, match="ignored, as T5X ignored it"):
    optimizer, _ = parse_with_trainer(
      ROOT / "examples" / "t5x_gin" / "chain.gin", params, {"w": P(None)}
    )
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.1))
  raw_params, state = params, tx.init(params)
  for _ in range(3):
    grads = jax.grad(lambda p: jnp.sum(jnp.sin(p["w"]) ** 2))(raw_params)
    updates, state = tx.update(grads, state, raw_params)
    raw_params = optax.apply_updates(raw_params, updates)
  np.testing.assert_allclose(optimizer.target["w"], raw_params["w"], rtol=1e-6)


# Wrong inputs through the T5X face (issue 16): T5X's numbers, a warning, or a named error.


def test_t5x_face_warns_on_overrides_t5x_ignored_and_refuses_wrong_values():
  params = {"w": jnp.ones((4, 4))}
  grads = {"w": jnp.full((4, 4), 0.5)}
  optimizer = adafactor.Adafactor(0.1).create(params)
  plain = optimizer.apply_gradient(grads)
  with pytest.warns(UserWarning, match=r"beta1=0\.9 has no effect"):
    assert_trees_equal(optimizer.apply_gradient(grads, beta1=0.9).target, plain.target)
  with pytest.warns(UserWarning, match=r"\['factored'\] have no effect"):
    assert_trees_equal(optimizer.apply_gradient(grads, factored=False).target, plain.target)
  with pytest.raises(ValueError, match=r"learning_rate=None is refused"):
    optimizer.apply_gradient(grads, learning_rate=None)
  with pytest.raises(TypeError, match=r"learning_rate='0\.1' is a str"):
    optimizers.adamw(1e-3).create(params).apply_gradient(grads, learning_rate="0.1")


def test_the_rate_t5xs_trainer_passes_reaches_chains_in_every_group():
  """T5X's trainer passes ``learning_rate=`` (a scalar array) every step: a MultiOptimizer of
  chains takes it in each group (it raised that no group had it), eager and under jit."""
  params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
  grads = jax.tree.map(lambda x: 0.1 * x, params)
  opt_def = optimizers.MultiOptimizer(
    [
      ("w", optimizers.chain([optax.clip_by_global_norm(1.0), optimizers.adamw(1e-2)])),
      ("b", optimizers.chain([optimizers.sgd(0.1)])),
    ]
  )
  optimizer = opt_def.create(params)
  step = lambda opt, lr: opt.apply_gradient(grads, learning_rate=lr)
  for run in (step, jax.jit(step)):
    assert_trees_equal(run(optimizer, jnp.asarray(0.0)).target, params)
    moved = run(optimizer, jnp.asarray(1e-2)).target
    assert all(bool(jnp.all(moved[k] != params[k])) for k in params)
