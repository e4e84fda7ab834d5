"""Every wrapped optax optimizer against raw optax: bitwise, on CPU."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
import types
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
from optimizer_catalogue import CASES, Case, grads_and_extra, loss_fn, make_params
from tree_testing import assert_trees_equal

import optcore

STEPS = 5


def raw_optax_run(case: Case, steps: int):
  tx = case.optax_factory()(**case.optax_kwargs())
  params = make_params()
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    grads, extra = grads_and_extra(case, params)
    t = optax.with_extra_args_support(tx) if extra else tx
    updates, state = t.update(grads, state, params, **extra)
    return optax.apply_updates(params, updates), state

  for _ in range(steps):
    params, state = step(params, state)
  return params, state


def optcore_create(case: Case) -> optcore.Optimizer:
  return case.optcore_factory()(**case.optcore_kwargs()).create(make_params())


def optcore_run(case: Case, steps: int, **overrides):
  opt = optcore_create(case)

  @jax.jit
  def step(opt, overrides):
    grads, extra = grads_and_extra(case, opt.target)
    return opt.apply_gradient(grads, extra_args=extra, **overrides)

  for _ in range(steps):
    opt = step(opt, overrides)
  return opt


def test_catalogue_covers_every_wrapped_optimizer():
  wrapped = set(optcore.OPTAX_ALIASES) | {
    f"contrib.{n}" for n in optcore.contrib.CONTRIB_OPTIMIZERS
  }
  assert {c.name for c in CASES} == wrapped


def _public_optax_functions(module) -> dict[str, object]:
  out = {}
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # optax warns on its deprecated aliases
    for name in getattr(module, "__all__", None) or dir(module):
      obj = getattr(module, name)
      if not name.startswith("_") and callable(obj) and not isinstance(obj, type):
        out[name] = obj
  return out


def _parameters(fn) -> list[str]:
  try:
    return list(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    return []


def test_nothing_optax_exports_is_missing():
  # An independent derivation: any public optax function that takes a
  # learning rate and is not a scale_by_* building block is an optimizer.
  for name, fn in _public_optax_functions(optax).items():
    if "learning_rate" in _parameters(fn) and not name.startswith("scale_by_"):
      if name in ("dpsgd",):  # optax's deprecated alias of optax.contrib.dpsgd
        assert "dpsgd" in optcore.contrib.CONTRIB_OPTIMIZERS
        continue
      assert name in optcore.OPTAX_ALIASES, name
      assert callable(getattr(optcore, name))
  for name, fn in _public_optax_functions(optax.contrib).items():
    if "learning_rate" in _parameters(fn) and not name.startswith("scale_by_"):
      assert name in optcore.contrib.CONTRIB_OPTIMIZERS, name
      assert callable(getattr(optcore.contrib, name))


def test_wrapped_factories_keep_optax_signature_and_docstring():
  for name in optcore.OPTAX_ALIASES:
    original, wrapped = getattr(optax, name), getattr(optcore, name)
    ours, theirs = inspect.signature(wrapped), inspect.signature(original)
    shape = lambda sig: [(p.name, p.kind, p.default) for p in sig.parameters.values()]
    assert shape(ours) == shape(theirs), name  # annotations show optax's aliases by name
    assert ours.return_annotation is optcore.OptaxWrapper, name  # a definition, with .create
    assert wrapped.__doc__ == original.__doc__, name
    assert wrapped.__name__ == name
  assert str(inspect.signature(optcore.adam).parameters["b1"]) == "b1: 'jax.typing.ArrayLike' = 0.9"


def test_optcore_adafactor_is_optax_alias_and_t5x_adafactor_lives_in_optcore_t5x():
  assert isinstance(optcore.adafactor(1e-3), optcore.OptaxWrapper)
  assert not isinstance(optcore.adafactor, types.ModuleType)
  assert optcore.t5x.Adafactor.__module__ == "optcore._src.legacy.adafactor"
  from optcore.t5x import Adafactor, FactorDim  # noqa: F401  (importable by name)

  with pytest.raises(ModuleNotFoundError):
    importlib.import_module("optcore.adafactor")


def test_no_public_module_of_the_core_swaps_its_class():
  for name in ("optcore", *sorted(n for n in sys.modules if n.startswith("optcore."))):
    assert type(sys.modules[name]) is types.ModuleType, name


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_matches_raw_optax_bitwise(case: Case):
  expected_params, expected_state = raw_optax_run(case, STEPS)
  opt = optcore_run(case, STEPS)
  assert_trees_equal(opt.target, expected_params)
  assert_trees_equal(opt.state.param_states, expected_state)
  assert opt.state.step.dtype == jnp.int32 and int(opt.state.step) == STEPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_state_dict_round_trip_is_bitwise(case: Case):
  trained = optcore_run(case, 2)
  state_dict = trained.state_dict()
  assert set(state_dict) == {"target", "state"}
  # T5X drops empty optax states, so an all-empty state writes no param_states.
  has_state = bool(jax.tree.leaves(trained.state.param_states))
  assert set(state_dict["state"]) == ({"step", "param_states"} if has_state else {"step"})
  assert not _has_empty_dict(state_dict["state"]), "T5X drops optax's empty states"
  restored = optcore_create(case).restore_state(state_dict)
  assert_trees_equal(restored.target, trained.target)
  assert_trees_equal(restored.state, trained.state)
  # The restored optimizer keeps training exactly as the original would.
  assert_trees_equal(optcore_run_from(restored, case), optcore_run_from(trained, case))


def optcore_run_from(opt, case):
  grads, extra = grads_and_extra(case, opt.target)
  return jax.jit(lambda o: o.apply_gradient(grads, extra_args=extra))(opt)


def _has_empty_dict(tree) -> bool:
  if isinstance(tree, dict):
    return not tree or any(_has_empty_dict(v) for v in tree.values())
  return False


LR_CASES = [c for c in CASES if c.lr_name is not None]


@pytest.mark.parametrize("case", LR_CASES, ids=lambda c: c.id)
def test_learning_rate_override_takes_effect(case: Case):
  # The override is a traced jit argument, as a trainer's schedule value is;
  # it must give what optax gives when built with that rate.
  zero = jnp.float32(0.0)
  opt = optcore_run(case, 3, **{case.lr_name: zero})
  reference = dataclasses.replace(case, kwargs={**case.kwargs, case.lr_name: 0.0})
  expected_params, expected_state = raw_optax_run(reference, 3)
  assert_trees_equal(opt.target, expected_params)
  assert_trees_equal(opt.state.param_states, expected_state)
  if case.frozen_at_zero_lr:
    assert_trees_equal(opt.target, make_params())
  # Without the override the same optimizer moves the params.
  moved = optcore_run(case, 3)
  assert not np.array_equal(moved.target["scale"], make_params()["scale"])


def test_override_of_twice_the_rate_doubles_an_sgd_step():
  params = make_params()
  grads = jax.grad(loss_fn)(params)
  opt = optcore.sgd(learning_rate=0.01).create(params)
  base = opt.apply_gradient(grads)
  doubled = opt.apply_gradient(grads, learning_rate=0.02)
  for p, b, d in zip(*map(jax.tree.leaves, (params, base.target, doubled.target)), strict=True):
    np.testing.assert_allclose(d - p, 2 * (b - p), rtol=1e-5, atol=1e-7)
  # The override lasts one call: the next step uses the configured rate again.
  again = doubled.apply_gradient(grads)
  for p, d, a in zip(*map(jax.tree.leaves, (params, doubled.target, again.target)), strict=True):
    np.testing.assert_allclose(a - d, (d - p) / 2, rtol=1e-5, atol=1e-7)


def test_overrides_do_not_recompile():
  traces = []

  @jax.jit
  def step(opt, grads, lr):
    traces.append(1)
    return opt.apply_gradient(grads, learning_rate=lr, b1=0.8)

  opt = optcore.adam(1e-3).create(make_params())
  grads = jax.grad(loss_fn)(opt.target)
  for lr in (0.1, 0.01, 0.001, 0.0):
    opt = step(opt, grads, lr)
  assert len(traces) == 1


def test_equal_definitions_do_not_retrace():
  traces = []

  @jax.jit
  def step(opt, grads):
    traces.append(1)
    return opt.apply_gradient(grads)

  params = make_params()
  grads = jax.grad(loss_fn)(params)
  for _ in range(3):
    # A fresh definition each time, as a config-driven loop builds it.
    opt = optcore.adamw(learning_rate=1e-3, weight_decay=1e-4).create(params)
    step(opt, grads)
  assert len(traces) == 1
  step(optcore.adamw(learning_rate=2e-3, weight_decay=1e-4).create(params), grads)
  assert len(traces) == 2


def test_override_matches_a_definition_built_with_that_value():
  params = make_params()
  grads = jax.grad(loss_fn)(params)
  overridden = (
    optcore.adamw(1e-3, weight_decay=0.1)
    .create(params)
    .apply_gradient(grads, learning_rate=0.02, b2=0.99, weight_decay=0.0)
  )
  built = optcore.adamw(0.02, b2=0.99, weight_decay=0.0).create(params).apply_gradient(grads)
  assert_trees_equal(overridden.target, built.target)
  assert_trees_equal(overridden.state, built.state)


def test_unknown_hyper_parameter_is_a_type_error_listing_valid_names():
  opt = optcore.adam(1e-3).create(make_params())
  grads = jax.grad(loss_fn)(opt.target)
  with pytest.raises(
    TypeError, match=r"unknown hyper-parameter 'lr'.*valid names are: b1, b2, eps"
  ):
    opt.apply_gradient(grads, lr=0.1)


def test_override_that_changes_the_state_layout_is_refused():
  opt = optcore.sgd(0.1).create(make_params())
  grads = jax.grad(loss_fn)(opt.target)
  with pytest.raises(
    ValueError, match=r"sgd: overriding \['momentum'\] would change the optimizer state"
  ):
    opt.apply_gradient(grads, momentum=0.9)
  opt = optcore.adam(0.1).create(make_params())
  with pytest.raises(ValueError, match=r"'/0/mu/dense/bias'.*float32.*bfloat16"):
    opt.apply_gradient(grads, mu_dtype=jnp.bfloat16)


def test_override_that_only_sets_the_initial_state_is_refused():
  # rprop builds its per-parameter step sizes from learning_rate at init;
  # an override could never take effect, so it is an error, not a no-op.
  opt = optcore.rprop(0.1).create(make_params())
  grads = jax.grad(loss_fn)(opt.target)
  with pytest.raises(ValueError, match=r"rprop: the hyper-parameter\(s\) \['learning_rate'\] set"):
    opt.apply_gradient(grads, learning_rate=0.0)
  # Its other hyper-parameters act in the update and are honoured.
  opt.apply_gradient(grads, eta_plus=1.5)


def test_traced_override_of_a_python_branching_argument_says_so():
  opt = optcore.adafactor(0.1, min_dim_size_to_factor=2).create(make_params())
  grads = jax.grad(loss_fn)(opt.target)
  step = jax.jit(lambda o, n: o.apply_gradient(grads, min_dim_size_to_factor=n))
  with pytest.raises(
    TypeError, match=r"overriding \['min_dim_size_to_factor'\] with a traced value"
  ):
    step(opt, 1)
  # The same override as a Python constant works (and keeps the layout here).
  opt.apply_gradient(grads, min_dim_size_to_factor=1)


def test_optax_wrapper_takes_any_init_update_object():
  params = make_params()
  grads = jax.grad(loss_fn)(params)
  for tx in (
    optax.adam(1e-2),
    optax.MultiSteps(optax.adam(1e-2), every_k_schedule=2),
    optax.chain(optax.clip(0.5), optax.sgd(0.1)),
  ):
    opt = optcore.OptaxWrapper(tx).create(params)
    state = tx.init(params)
    expected = params
    for _ in range(3):
      opt = opt.apply_gradient(grads)
      updates, state = tx.update(grads, state, expected)
      expected = optax.apply_updates(expected, updates)
    assert_trees_equal(opt.target, expected)
    assert_trees_equal(opt.state.param_states, state)


def test_optax_wrapper_of_a_ready_transformation_refuses_overrides():
  opt = optcore.OptaxWrapper(optax.adam(1e-2)).create(make_params())
  with pytest.raises(TypeError, match=r"no hyper-parameters to override.*optcore.<name>"):
    opt.apply_gradient(jax.grad(loss_fn)(opt.target), learning_rate=0.1)


def test_optax_wrapper_rejects_objects_without_the_protocol():
  with pytest.raises(TypeError, match=r"init/update protocol.*found int"):
    optcore.OptaxWrapper(3)
  with pytest.raises(TypeError, match=r"adam\(\): missing a required argument: 'learning_rate'"):
    optcore.adam()


def test_chain_takes_a_list_like_t5x_and_matches_optax_chain():
  params = make_params()
  grads = jax.grad(loss_fn)(params)
  ours = optcore.chain([optax.clip_by_global_norm(1.0), optcore.adam(1e-2)]).create(params)
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
  updates, state = tx.update(grads, tx.init(params), params)
  ours = ours.apply_gradient(grads)
  assert_trees_equal(ours.target, optax.apply_updates(params, updates))
  assert_trees_equal(ours.state.param_states, state)


def test_wrappers_accept_optcore_definitions_as_base_optimizers():
  params = make_params()
  grads = jax.grad(loss_fn)(params)
  ours = optcore.contrib.mechanize(optcore.adam(1e-2)).create(params).apply_gradient(grads)
  tx = optax.contrib.mechanize(optax.adam(1e-2))
  updates, state = tx.update(grads, tx.init(params), params)
  assert_trees_equal(ours.target, optax.apply_updates(params, updates))
  assert_trees_equal(ours.state.param_states, state)


def test_extra_args_on_a_plain_transformation_are_accepted():
  # optax.sgd's update takes no extras; optax.with_extra_args_support drops them.
  params = make_params()
  grads = jax.grad(loss_fn)(params)
  opt = optcore.sgd(0.1).create(params)
  assert_trees_equal(
    opt.apply_gradient(grads, extra_args={"value": 1.0}).target, opt.apply_gradient(grads).target
  )


def test_names_optcore_does_not_wrap_point_to_the_right_place():
  with pytest.raises(AttributeError, match=r"in optax.contrib, use optcore.contrib.muon"):
    _ = optcore.muon
  with pytest.raises(AttributeError, match=r"optax.clip_by_global_norm is not one.*optcore.chain"):
    _ = optcore.clip_by_global_norm
  with pytest.raises(AttributeError, match=r"has no attribute 'adamm'"):
    _ = optcore.adamm


def test_overrides_on_bfloat16_params_match_optax_built_with_that_value():
  params = make_params(dtype=jnp.bfloat16)
  grads = jax.tree.map(lambda g: g.astype(jnp.bfloat16), jax.grad(loss_fn)(params))
  step = jax.jit(lambda o, lr: o.apply_gradient(grads, learning_rate=lr, b1=0.8))
  opt = step(optcore.adam(1e-3).create(params), 0.02)  # a weakly typed Python float
  tx = optax.adam(0.02, b1=0.8)
  updates, state = tx.update(grads, tx.init(params), params)
  assert_trees_equal(opt.target, optax.apply_updates(params, updates))
  assert_trees_equal(opt.state.param_states, state)


def test_hyper_params_override_passes_through_jit_as_a_pytree():
  opt = optcore.sgd(0.1, momentum=0.9).create(make_params())
  grads = jax.grad(loss_fn)(opt.target)
  traces = []

  @jax.jit
  def step(opt, hyper_params):
    traces.append(1)
    return opt.apply_gradient(grads, hyper_params=hyper_params)

  hp = opt.optimizer_def.hyper_params
  frozen = step(opt, hp.replace(learning_rate=0.0))
  assert_trees_equal(frozen.target, opt.target)
  moved = step(opt, hp.replace(learning_rate=0.2))
  # Jitted too: eager op-by-op and fused XLA code may round differently.
  expected = jax.jit(lambda o: o.apply_gradient(grads))(
    optcore.sgd(0.2, momentum=0.9).create(make_params())
  )
  assert_trees_equal(moved.target, expected.target)
  assert len(traces) == 1


def test_fresh_optax_closures_with_the_same_config_are_one_definition():
  same = [optcore.OptaxWrapper(optax.chain(optax.clip(1.0), optax.adam(1e-3))) for _ in range(2)]
  assert same[0] == same[1] and hash(same[0]) == hash(same[1])
  assert optcore.OptaxWrapper(optax.adam(1e-3)) != optcore.OptaxWrapper(optax.adam(2e-3))
  assert optcore.OptaxWrapper(optax.adam(1e-3)) != optcore.OptaxWrapper(optax.adamw(1e-3))
  traces = []

  @jax.jit
  def step(opt, grads):
    traces.append(1)
    return opt.apply_gradient(grads)

  params = {"w": jnp.ones(3)}
  for _ in range(3):  # a new closure each time, as code that rebuilds its optimizer makes
    opt = optcore.OptaxWrapper(optax.adam(1e-3)).create(params)
    step(opt, params)
  assert len(traces) == 1


def test_overrides_reach_the_wrapped_optimizers_inside_a_chain():
  """T5X's trainer passes learning_rate to a chain of wrapped optimizers every step."""
  opt_def = optcore.chain([optax.clip_by_global_norm(10.0), optcore.sgd(1.0, momentum=0.5)])
  opt = opt_def.create({"w": jnp.zeros(2)})
  step = jax.jit(lambda opt, lr: opt.apply_gradient({"w": jnp.ones(2)}, learning_rate=lr))
  tx = optax.chain(optax.clip_by_global_norm(10.0), optax.sgd(0.25, momentum=0.5))
  updates, _ = tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.zeros(2)}))
  np.testing.assert_array_equal(step(opt, 0.25).target["w"], updates["w"])
  with pytest.raises(
    TypeError,
    match=r"'lr' \(optcore's name is 'learning_rate'\); the valid names are: learning_rate, "
    r"momentum \(set when the definition is made, not per step: accumulator_dtype, nesterov, "
    r"transformations\)",
  ):
    opt.apply_gradient({"w": jnp.ones(2)}, lr=0.1)


def _assigned_names(module) -> list[str]:
  """The names a module assigns at top level, as a type checker reads them."""
  tree = ast.parse(Path(module.__file__).read_text())
  return [
    target.id
    for node in tree.body
    if isinstance(node, (ast.Assign, ast.AnnAssign))
    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
    if isinstance(target, ast.Name) and not target.id.isupper() and not target.id.startswith("__")
  ]


def test_the_written_out_aliases_are_what_the_installed_optax_offers():
  # The aliases are written one per line (IDEs and type checkers see them);
  # this is what keeps that list from missing an optimizer a new optax adds.
  import optax_names

  from optcore._src.definitions import optax_aliases

  assert list(optcore.OPTAX_ALIASES) == optax_names.optax_alias_names()
  assert _assigned_names(optax_aliases) == list(optcore.OPTAX_ALIASES)
  own = optcore.contrib.OWN_OPTIMIZERS
  wrapped = [n for n in optcore.contrib.CONTRIB_OPTIMIZERS if n not in own]
  assert wrapped == optax_names.optax_contrib_names()
  assert _assigned_names(optcore.contrib) == list(optcore.contrib.CONTRIB_OPTIMIZERS)
  for name in optcore.OPTAX_ALIASES:
    assert name in dir(optcore), name


def test_one_constructor_for_ready_transformations_and_factories():
  by_factory = optcore.OptaxWrapper(optax.sgd, {"learning_rate": 0.1, "momentum": 0.9}, name="sgd")
  assert by_factory == optcore.sgd(0.1, momentum=0.9)
  assert by_factory.factory is optax.sgd and optcore.OptaxWrapper(optax.sgd(0.1)).factory is None
  faster = by_factory.with_hyper_params(by_factory.hyper_params.replace(learning_rate=0.5))
  assert faster == optcore.sgd(0.5, momentum=0.9)
  params = {"w": jnp.array([1.0, -2.0])}
  grads = {"w": jnp.array([0.5, 0.25])}
  tx = by_factory.transformation_for(faster.hyper_params)
  updates, _ = tx.update(grads, tx.init(params))
  raw_updates, _ = optax.sgd(0.5, momentum=0.9).update(grads, tx.init(params))
  assert_trees_equal(updates, raw_updates)
  with pytest.raises(TypeError, match=r"sgd: \['lr'\] are not arguments of the factory"):
    optcore.OptaxWrapper(optax.sgd, {"lr": 0.1})


@pytest.mark.parametrize(
  ("schedule", "error", "match"),
  [
    (lambda count: jnp.full((3,), 0.1), ValueError, r"returns float32\[3\].*broadcast silently"),
    (lambda count: None, TypeError, "returns None for a step count"),
  ],
  ids=["vector", "none"],
)
def test_a_constructor_schedule_that_is_no_scalar_per_step_is_refused(schedule, error, match):
  """A schedule returning a vector was broadcast over every parameter silently, and one
  returning None ended in a bare optax TypeError at the first step (issue 37)."""
  with pytest.raises(error, match=f"sgd: the schedule given for learning_rate {match}"):
    optcore.sgd(schedule)
  optcore.sgd(optax.linear_schedule(1.0, 0.0, 10))  # a real schedule is taken
