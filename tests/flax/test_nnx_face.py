"""optcore_flax.nnx.Optimizer: Flax's nnx.Optimizer, for any optcore definition, checked against
Flax's own nnx.Optimizer over raw optax (the same numbers, the same nnx.state layout), and with
what optcore adds under every face's names: overrides, ema_params, current_hyper_params, state
dicts every face reads, transplant, and orbax checkpoints of nnx.state (issue 42)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import optcore
from optcore_flax import nnx as ocnnx


class MLP(nnx.Module):
  def __init__(self, rngs):
    self.hidden = nnx.Linear(3, 8, rngs=rngs)
    self.out = nnx.Linear(8, 2, rngs=rngs)

  def __call__(self, x):
    return self.out(nnx.relu(self.hidden(x)))


X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)


def grads_of(model):
  return nnx.grad(lambda m: jnp.mean(m(X) ** 2))(model)


def arrays(model):
  return jax.tree.leaves(nnx.as_pure(nnx.state(model, nnx.Param)))


def train(optimizer_cls, tx, steps=3, **update_kwargs):
  model = MLP(nnx.Rngs(0))
  optimizer = optimizer_cls(model, tx, wrt=nnx.Param)
  step = nnx.jit(lambda m, o: o.update(m, grads_of(m), **update_kwargs))
  for _ in range(steps):
    step(model, optimizer)
  return model, optimizer


@pytest.mark.parametrize(
  "ours,theirs",
  [
    (lambda: optcore.adamw(1e-2, weight_decay=1e-3), lambda: optax.adamw(1e-2, weight_decay=1e-3)),
    (lambda: optcore.sgd(0.1, momentum=0.9), lambda: optax.sgd(0.1, momentum=0.9)),
    (lambda: optax.lion(1e-3), lambda: optax.lion(1e-3)),  # a plain optax transformation
  ],
  ids=["adamw", "sgd-momentum", "optax-lion"],
)
def test_the_same_numbers_and_state_layout_as_flaxs_own_optimizer(ours, theirs):
  model, optimizer = train(ocnnx.Optimizer, ours())
  flax_model, flax_optimizer = train(nnx.Optimizer, theirs())
  for got, want in zip(arrays(model), arrays(flax_model), strict=True):
    np.testing.assert_array_equal(got, want)
  ours_state = nnx.state(optimizer)
  theirs_state = nnx.state(flax_optimizer)
  assert set(ours_state) == set(theirs_state) == {"step", "opt_state"}
  assert jax.tree.structure(ours_state) == jax.tree.structure(theirs_state)
  assert int(optimizer.step[...]) == 3
  assert isinstance(optimizer, nnx.Optimizer)  # code that checks for Flax's class takes it


def test_an_override_takes_effect_for_its_step_and_a_misspelt_one_is_refused():
  model = MLP(nnx.Rngs(0))
  optimizer = ocnnx.Optimizer(model, optcore.adamw(1e-2), wrt=nnx.Param)
  before = arrays(model)
  step = nnx.jit(lambda m, o, lr: o.update(m, grads_of(m), learning_rate=lr))
  step(model, optimizer, 0.0)
  for got, want in zip(arrays(model), before, strict=True):
    np.testing.assert_array_equal(got, want)  # a learning rate of zero moves nothing
  step(model, optimizer, 1e-2)
  assert not np.array_equal(arrays(model)[0], before[0])
  with pytest.raises(TypeError, match="lerning_rate"):
    optimizer.update(model, grads_of(model), lerning_rate=0.1)


def test_the_moving_average_is_an_nnx_state_the_model_takes():
  decay = 0.5
  model = MLP(nnx.Rngs(0))
  start = arrays(model)
  optimizer = ocnnx.Optimizer(model, optcore.ema(optcore.sgd(0.1), decay), wrt=nnx.Param)
  optimizer.update(model, grads_of(model))
  average = optimizer.ema_params(model)
  assert isinstance(average, nnx.State)
  for got, old, new in zip(jax.tree.leaves(average), start, arrays(model), strict=True):
    np.testing.assert_allclose(got, decay * old + (1 - decay) * new, rtol=1e-6)
  assert jax.tree.structure(optcore.ema_params(optimizer, model)) == jax.tree.structure(average)
  nnx.update(model, average)
  for got, want in zip(arrays(model), jax.tree.leaves(average), strict=True):
    np.testing.assert_array_equal(got, want)


def test_a_groups_average_comes_back_with_the_other_variables_as_they_are():
  model = MLP(nnx.Rngs(0))
  multi = optcore.MultiOptimizer(
    (r"hidden", optcore.ema(optcore.sgd(0.1), 0.5)), (r"out", optcore.sgd(0.1))
  )
  optimizer = ocnnx.Optimizer(model, multi, wrt=nnx.Param)
  optimizer.update(model, grads_of(model))
  average = optimizer.ema_params(model)
  np.testing.assert_array_equal(average["out"]["kernel"], model.out.kernel[...])
  assert not np.array_equal(average["hidden"]["kernel"], model.hidden.kernel[...])


def test_current_hyper_params_reads_the_schedule_at_the_step():
  schedule = optax.exponential_decay(1.0, 1, 0.5)
  _, optimizer = train(ocnnx.Optimizer, optcore.sgd(schedule), steps=2)
  assert float(optimizer.current_hyper_params()["learning_rate"]) == float(schedule(2))
  assert float(optcore.current_hyper_params(optimizer)["learning_rate"]) == float(schedule(2))


def test_a_state_dict_moves_to_another_face_and_back():
  model, optimizer = train(ocnnx.Optimizer, optcore.adam(1e-2))
  written = optimizer.state_dict()
  params = nnx.as_pure(nnx.state(model, nnx.Param))
  # The core face reads the same 'state'.
  core = optcore.adam(1e-2).create(params)
  core = core.restore_state({"target": params, **written})
  np.testing.assert_array_equal(
    core.state.param_states[0].mu["hidden"]["kernel"],
    optimizer.state.param_states[0].mu["hidden"]["kernel"],
  )
  fresh = ocnnx.Optimizer(MLP(nnx.Rngs(1)), optcore.adam(1e-2), wrt=nnx.Param)
  fresh.restore_state(core.state_dict())
  for got, want in zip(jax.tree.leaves(fresh.state), jax.tree.leaves(optimizer.state), strict=True):
    np.testing.assert_array_equal(got, want)
  with pytest.raises(optcore.StateDictError):
    fresh.restore_state({"state": {"step": 0, "param_states": {}}})
  for got, want in zip(jax.tree.leaves(fresh.state), jax.tree.leaves(optimizer.state), strict=True):
    np.testing.assert_array_equal(got, want)  # a failed restore changed nothing


def test_transplant_keeps_the_moments_that_still_fit():
  model, optimizer = train(ocnnx.Optimizer, optcore.adam(1e-2))
  target = ocnnx.Optimizer(model, optcore.adamw(1e-2), wrt=nnx.Param)
  report = target.transplant(optimizer.state_dict(), model)
  assert "kept" in str(report)
  np.testing.assert_array_equal(
    target.state.param_states[0].mu["out"]["kernel"],
    optimizer.state.param_states[0].mu["out"]["kernel"],
  )
  with pytest.raises(TypeError, match="needs the model"):
    target.transplant(optimizer.state_dict())


def test_nnx_state_checkpoints_with_orbax_and_resumes_exactly(tmp_path):
  model, optimizer = train(ocnnx.Optimizer, optcore.ema(optcore.adam(1e-2), 0.9))
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "opt", nnx.state(optimizer))
  checkpointer.wait_until_finished()
  fresh_model = MLP(nnx.Rngs(0))
  nnx.update(fresh_model, nnx.state(model))
  resumed = ocnnx.Optimizer(fresh_model, optcore.ema(optcore.adam(1e-2), 0.9), wrt=nnx.Param)
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(resumed))
  nnx.update(resumed, checkpointer.restore(tmp_path / "opt", abstract))
  for o, m in ((optimizer, model), (resumed, fresh_model)):
    o.update(m, grads_of(m))
  for got, want in zip(arrays(fresh_model), arrays(model), strict=True):
    np.testing.assert_array_equal(got, want)


def test_wrt_left_out_is_flaxs_pre_011_optimizer_with_a_deprecation_warning():
  """Flax before 0.11: ``nnx.Optimizer(model, tx)`` trained nnx.Param, held the model and took
  ``update(grads)``; the face still does, warning, with the numbers of the current form."""
  model, current = MLP(nnx.Rngs(0)), MLP(nnx.Rngs(0))
  with pytest.warns(DeprecationWarning, match="pass wrt=nnx.Param"):
    optimizer = ocnnx.Optimizer(model, optcore.adam(1e-2))
  assert optimizer.wrt is nnx.Param and optimizer.model is model
  reference = ocnnx.Optimizer(current, optcore.adam(1e-2), wrt=nnx.Param)
  for _ in range(2):
    optimizer.update(grads_of(model))
    reference.update(current, grads_of(current))
  for got, want in zip(arrays(model), arrays(current), strict=True):
    np.testing.assert_array_equal(got, want)


def test_update_without_grads_on_an_optimizer_that_holds_no_model_says_what_to_pass():
  model = MLP(nnx.Rngs(0))
  optimizer = ocnnx.Optimizer(model, optcore.sgd(0.1), wrt=nnx.Param)
  with pytest.raises(TypeError, match=r"update\(model, grads\).*ModelAndOptimizer"):
    optimizer.update(grads_of(model))


def test_model_and_optimizer_holds_its_model_and_takes_overrides():
  model = MLP(nnx.Rngs(0))
  state = ocnnx.ModelAndOptimizer(model, optcore.sgd(0.1))
  assert isinstance(state, ocnnx.Optimizer) and isinstance(state, nnx.Optimizer)
  before = arrays(model)
  state.update(grads_of(model), learning_rate=0.0)
  for got, want in zip(arrays(model), before, strict=True):
    np.testing.assert_array_equal(got, want)
  state.update(grads_of(model))
  assert int(state.step[...]) == 2 and not np.array_equal(arrays(model)[0], before[0])


def test_the_module_stands_in_for_flax_nnx():
  """``from optcore_flax import nnx`` in place of ``from flax import nnx``: the optimizers are
  the face's, every other name Flax's own object."""
  assert ocnnx.Optimizer is not nnx.Optimizer and issubclass(ocnnx.Optimizer, nnx.Optimizer)
  assert ocnnx.ModelAndOptimizer is not nnx.ModelAndOptimizer
  for name in ("Linear", "jit", "grad", "state", "split", "merge", "Param", "Rngs", "Variable"):
    assert getattr(ocnnx, name) is getattr(nnx, name), name
  assert {"Linear", "Optimizer", "ModelAndOptimizer"} <= set(dir(ocnnx))
  with pytest.raises(AttributeError, match=r"'optcore_flax\.nnx' has no attribute 'Optimiser'"):
    _ = ocnnx.Optimiser


def test_a_grouped_definition_or_a_string_is_refused_with_the_fix():
  model = MLP(nnx.Rngs(0))
  with pytest.raises(TypeError, match=r"optcore_flax\.nnx\.Optimizer"):
    ocnnx.Optimizer(model, "adam", wrt=nnx.Param)
  with pytest.raises(TypeError, match="grouped"):
    ocnnx.Optimizer(model, optcore.grouped(optcore.adam(1e-2)), wrt=nnx.Param)


def test_split_merge_and_jax_jit_keep_it_an_optimizer():
  model = MLP(nnx.Rngs(0))
  optimizer = ocnnx.Optimizer(model, optcore.adam(1e-2), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))

  @jax.jit
  def step(state):
    model, optimizer = nnx.merge(graphdef, state)
    optimizer.update(model, grads_of(model))
    return nnx.state((model, optimizer))

  state = step(step(state))
  model, optimizer = nnx.merge(graphdef, state)
  assert isinstance(optimizer, ocnnx.Optimizer) and int(optimizer.step[...]) == 2


@pytest.mark.parametrize(
  "make",
  [
    lambda: optcore.adam(1e-2),
    lambda: optcore.legacy.Adam(1e-2),
    lambda: optcore.accumulate(optcore.adam(1e-2), every=2),
    lambda: optcore.MultiOptimizer(
      (r"hidden", optcore.ema(optcore.adam(1e-2), 0.9)), (r"out", optcore.legacy.Momentum(0.1))
    ),
    lambda: optcore.MultiOptimizer(  # flax.optim's per-parameter layout; out/bias left alone
      (r"hidden", optcore.legacy.Adam(1e-2)), (r"out/kernel", optcore.legacy.Momentum(0.1))
    ),
  ],
  ids=["optax", "legacy", "wrapper", "multi", "multi_per_parameter"],
)
def test_the_face_steps_as_the_core_face_does_and_its_state_dict_is_the_cores(make):
  """The same definition in the core face (apply_gradient on the same gradients) gives the same
  parameters and the same state dict, bitwise: the nnx face is a translation, not an
  algorithm."""
  model, optimizer = train(ocnnx.Optimizer, make())
  params = nnx.as_pure(nnx.state(MLP(nnx.Rngs(0)), nnx.Param))
  core = make().create(params)
  step = jax.jit(lambda c: c.apply_gradient(nnx.as_pure(grads_of(_with(c.target)))))
  for _ in range(3):  # jitted, as the face's steps are: the same XLA program, the same bits
    core = step(core)
  for got, want in zip(arrays(model), jax.tree.leaves(core.target), strict=True):
    np.testing.assert_array_equal(got, want)
  ours, theirs = optimizer.state_dict()["state"], core.state_dict()["state"]
  assert jax.tree.structure(ours) == jax.tree.structure(theirs)
  jax.tree.map(np.testing.assert_array_equal, ours, theirs)


def _with(params):
  """An MLP holding ``params``, for its gradients."""
  model = MLP(nnx.Rngs(0))
  nnx.update(model, params)
  return model


class WithLoRA(nnx.Module):
  def __init__(self, rngs):
    self.base = nnx.Linear(3, 4, rngs=rngs)
    self.lora = nnx.LoRA(3, 2, 4, rngs=rngs)

  def __call__(self, x):
    return self.base(x) + self.lora(x)


def _lora_run(opt_def):
  model = WithLoRA(nnx.Rngs(0))
  optimizer = ocnnx.Optimizer(model, opt_def, wrt=nnx.Param)
  step = nnx.jit(lambda m, o: o.update(m, nnx.grad(lambda m: jnp.sum(m(jnp.ones((2, 3))) ** 2))(m)))
  for _ in range(3):
    step(model, optimizer)
  return model, optimizer


def test_multi_optimizer_groups_chosen_by_nnx_variable_type_are_the_path_groups():
  """Selectors that are nnx filters (a Variable type, nnx.All/Not/...) pick what the same
  groups by path pick: the same numbers and the same state, bitwise."""
  by_type = optcore.MultiOptimizer(
    (nnx.LoRAParam, optcore.adam(1e-2)),
    (nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)), optcore.legacy.Momentum(0.1)),
  )
  by_path = optcore.MultiOptimizer(
    (r"^/lora/", optcore.adam(1e-2)), (r"^/base/", optcore.legacy.Momentum(0.1))
  )
  (typed, typed_opt), (pathed, pathed_opt) = _lora_run(by_type), _lora_run(by_path)
  for got, want in zip(
    jax.tree.leaves(nnx.state(typed)), jax.tree.leaves(nnx.state(pathed)), strict=True
  ):
    np.testing.assert_array_equal(got, want)
  jax.tree.map(np.testing.assert_array_equal, typed_opt.state_dict(), pathed_opt.state_dict())
  frozen = _lora_run(optcore.MultiOptimizer((nnx.LoRAParam, optcore.adam(1e-2))))[0]
  np.testing.assert_array_equal(frozen.base.kernel[...], WithLoRA(nnx.Rngs(0)).base.kernel[...])


def test_overlapping_variable_type_groups_are_refused_by_path():
  model = WithLoRA(nnx.Rngs(0))
  overlapping = optcore.MultiOptimizer(
    (nnx.Param, optcore.sgd(0.1)), (nnx.LoRAParam, optcore.adam(1e-2))
  )  # a LoRAParam is an nnx.Param too
  with pytest.raises(ValueError, match="lora_a"):
    ocnnx.Optimizer(model, overlapping, wrt=nnx.Param)


def test_every_name_but_the_optimizers_is_flax_nnx_own():
  """The one-line swap: a program that uses nnx.Any(...), nnx.Linear or nnx.jit gets Flax's own
  objects (the module's own imports once shadowed nnx.Any with typing.Any)."""
  own = {"Optimizer", "ModelAndOptimizer"}
  for name in dir(nnx):
    if not name.startswith("_") and name not in own:
      assert getattr(ocnnx, name) is getattr(nnx, name), name
  assert ocnnx.Any is nnx.Any and ocnnx.Optimizer is not nnx.Optimizer


def test_a_checkpoint_of_numpy_arrays_restores_as_jax_arrays_and_the_next_step_runs():
  """orbax and msgpack give NumPy arrays back: the restored state holds JAX arrays, so the next
  eager update (and a jitted one) takes it, and continues the run exactly."""
  model = MLP(nnx.Rngs(0))
  optimizer = ocnnx.Optimizer(model, optcore.ema(optcore.adam(1e-2), 0.9), wrt=nnx.Param)
  optimizer.update(model, grads_of(model))
  twin_model = nnx.clone(model)
  twin = ocnnx.Optimizer(twin_model, optcore.ema(optcore.adam(1e-2), 0.9), wrt=nnx.Param)
  twin.restore_state(jax.tree.map(np.asarray, optimizer.state_dict()))
  leaves = jax.tree.leaves(nnx.as_pure(twin.opt_state))
  assert leaves and all(isinstance(x, jax.Array) for x in leaves)
  optimizer.update(model, grads_of(model))
  twin.update(twin_model, grads_of(twin_model))
  for got, want in zip(arrays(twin_model), arrays(model), strict=True):
    np.testing.assert_array_equal(got, want)


class LoRAModel(nnx.Module):
  def __init__(self, rngs):
    self.base = nnx.Linear(3, 3, rngs=rngs)
    self.lora = nnx.LoRA(3, 2, 3, rngs=rngs)

  def __call__(self, x):
    return self.base(x) + self.lora(x)


@pytest.mark.parametrize(
  "wrap",
  [
    lambda d: optcore.ema(d, 0.9),
    lambda d: optcore.accumulate(d, 2),
    optcore.skip_bad_steps,
    optcore.with_statistics,
    lambda d: optcore.low_bit_state(d, min_size=0),
    lambda d: optcore.mixed_precision(d, state_dtype=jnp.bfloat16),
    optcore.cautious,
    lambda d: optcore.zclip(d, warmup_steps=1),
    optcore.stochastic_rounding,
  ],
  ids=[
    "ema", "accumulate", "skip_bad_steps", "with_statistics", "low_bit_state",
    "mixed_precision", "cautious", "zclip", "stochastic_rounding",
  ],
)  # fmt: skip
def test_a_wrapper_around_groups_chosen_by_nnx_filters_trains_as_groups_chosen_by_path(wrap):
  """ema, accumulate, skip_bad_steps or with_statistics around a MultiOptimizer whose selectors
  are nnx filters crashed inside the face (its walk only entered a bare MultiOptimizer); they,
  and every other wrapper, give the numbers of the same groups chosen by path."""
  trained = nnx.Any(nnx.Param, nnx.LoRAParam)
  by_filter = optcore.MultiOptimizer(
    (nnx.LoRAParam, optcore.adam(1e-2)),
    (nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)), optcore.sgd(0.1)),
  )
  by_path = optcore.MultiOptimizer((r"^/lora/", optcore.adam(1e-2)), (r"^/base/", optcore.sgd(0.1)))
  models = [LoRAModel(nnx.Rngs(0)) for _ in range(2)]
  optimizers = [
    ocnnx.Optimizer(m, wrap(d), wrt=trained)
    for m, d in zip(models, (by_filter, by_path), strict=True)
  ]
  x = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)
  for _ in range(2):
    for model, optimizer in zip(models, optimizers, strict=True):
      grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2), argnums=nnx.DiffState(0, trained))(model)
      optimizer.update(model, grads)
  got, want = (jax.tree.leaves(nnx.as_pure(nnx.state(m, trained))) for m in models)
  for a, b in zip(got, want, strict=True):
    np.testing.assert_array_equal(a, b)
