"""optcore_treex.Optimizer: Treex's API and behaviour, against raw optax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import treeo as to
from tree_testing import assert_trees_equal

import optcore
import optcore_treex
from optcore_treex import Optimizer


class Parameter(to.KindMixin):
  """A Treex-style kind: the leaves an optimizer should see."""


class BatchStat(to.KindMixin):
  """Another kind, never optimised."""


class Dense(to.Tree):
  """A Treex-style module on treeo: parameters and a running statistic."""

  kernel: jnp.ndarray = to.field(node=True, kind=Parameter)
  bias: jnp.ndarray = to.field(node=True, kind=Parameter)
  mean: jnp.ndarray = to.field(node=True, kind=BatchStat)

  def __init__(self, key=0):
    rng = np.random.default_rng(key)
    self.kernel = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
    self.bias = jnp.asarray(rng.normal(size=(4,)), jnp.float32)
    self.mean = jnp.zeros(4)

  def __call__(self, x):
    return x @ self.kernel + self.bias - self.mean


X = jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)


def loss(params):
  leaves = jax.tree.leaves(params)
  return sum(jnp.sum((x - 0.1 * i) ** 2) for i, x in enumerate(leaves))


def dict_params():
  rng = np.random.default_rng(1)
  return {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "b": jnp.zeros(4)}


def raw_optax(tx, params, steps=20):
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state

  for _ in range(steps):
    params, state = step(params, state)
  return params


def treex_usage(tx, params, steps=20):
  """Treex's documented loop: init returns the optimizer, the step returns it."""
  optimizer = Optimizer(tx).init(params)

  @jax.jit
  def train_step(params, optimizer):
    grads = jax.grad(loss)(params)
    params = optimizer.update(grads, params)
    return params, optimizer

  for _ in range(steps):
    params, optimizer = train_step(params, optimizer)
  return params, optimizer


@pytest.mark.parametrize(
  "params",
  [dict_params(), Dense(), to.filter(Dense(), Parameter)],
  ids=["dict", "tree", "params-of-module"],
)
def test_documented_usage_equals_raw_optax_bitwise(params):
  ours, optimizer = treex_usage(optax.adam(1e-2), params)
  assert_trees_equal(ours, raw_optax(optax.adam(1e-2), params))
  assert int(optimizer.state.step) == 20 and type(ours) is type(params)


@pytest.mark.parametrize(
  "make_tx",
  [lambda: optax.adam(0.1), lambda: optax.sgd(0.1, momentum=0.9), lambda: optax.sgd(0.1)],
  ids=["adam", "momentum", "sgd"],
)
def test_the_optimizers_leaves_are_optax_states_leaves_as_in_treex(make_tx):
  params = Dense()
  tx = make_tx()
  optimizer = Optimizer(tx).init(params)
  opt_state = tx.init(params)
  assert_trees_equal(jax.tree_util.tree_leaves(optimizer), jax.tree_util.tree_leaves(opt_state))
  grads = jax.grad(loss)(params)
  new_params = optimizer.update(grads, params)
  updates, opt_state = tx.update(grads, opt_state, params)
  assert_trees_equal(new_params, optax.apply_updates(params, updates))
  assert_trees_equal(jax.tree_util.tree_leaves(optimizer), jax.tree_util.tree_leaves(opt_state))


def test_a_checkpoint_carries_the_step_where_it_is_known():
  params = dict_params()
  grads = jax.grad(loss)(params)
  adam = Optimizer(optax.adam(0.1)).init(params)
  adam.update(grads, params)
  # adam counts its steps: the checkpoint has the core's layout, step included.
  state_dict = adam.state_dict()
  assert int(state_dict["state"]["step"]) == 1
  core = optcore.OptaxWrapper(optax.adam(0.1)).create(params)
  core = core.restore_state({"target": core.state_dict()["target"], **state_dict})
  assert int(core.state.step) == 1
  # plain sgd keeps no count: the checkpoint has the optax state only, and restores here.
  sgd = Optimizer(optax.sgd(0.1, momentum=0.9)).init(params)
  sgd.update(grads, params)
  assert set(sgd.state_dict()["state"]) == {"param_states"}
  restored = Optimizer(optax.sgd(0.1, momentum=0.9)).init(params).restore_state(sgd.state_dict())
  assert_trees_equal(restored.opt_state, sgd.opt_state)
  # a definition that needs the step keeps it as one more leaf, after optax's.
  legacy = Optimizer(optcore.legacy.Adam(0.1)).init(params)
  assert len(jax.tree_util.tree_leaves(legacy)) == 2 * len(jax.tree.leaves(params)) + 1
  legacy.update(grads, params)
  assert int(legacy.state_dict()["state"]["step"]) == 1


def test_a_filtered_module_keeps_its_other_kinds_untouched():
  model = Dense()
  params = to.filter(model, Parameter)
  new_params, _ = treex_usage(optax.sgd(0.1), params, steps=3)
  merged = to.merge(model, new_params)
  assert not np.array_equal(merged.kernel, model.kernel)
  np.testing.assert_array_equal(merged.mean, model.mean)


def test_optcore_configs_work_too():
  config = optcore.MultiOptimizer((r"/w$", optcore.adam(1e-2)), (r"/b$", optcore.sgd(0.1)))
  ours, _ = treex_usage(config, dict_params())
  reference = optax.partition(
    {"a": optax.adam(1e-2), "s": optax.sgd(0.1)}, {"w": "a", "b": "s"}
  )  # fmt: skip
  assert_trees_equal(ours, raw_optax(reference, dict_params()))


def test_init_returns_a_new_optimizer_and_leaves_the_original_uninitialised():
  optimizer = Optimizer(optax.adam(1e-2))
  initialised = optimizer.init(dict_params())
  assert initialised is not optimizer
  assert initialised.initialized and not optimizer.initialized


def test_update_without_init_is_a_runtime_error():
  with pytest.raises(RuntimeError, match="not initialized"):
    Optimizer(optax.adam(1e-2)).update(dict_params(), dict_params())


def test_apply_updates_needs_params():
  optimizer = Optimizer(optax.adam(1e-2)).init(dict_params())
  with pytest.raises(ValueError, match="params must be provided"):
    optimizer.update(dict_params())


def test_a_changed_number_of_leaves_is_a_value_error_and_changes_nothing():
  params = dict_params()
  optimizer = Optimizer(optax.adam(1e-2)).init(params)
  optimizer.update(jax.grad(loss)(params), params)
  before = jax.tree.map(np.array, optimizer.state)
  more = {**params, "extra": jnp.ones(2)}
  with pytest.raises(ValueError, match="params must have length 2, got 3"):
    optimizer.update(jax.grad(loss)(more), more)
  with pytest.raises(ValueError, match="grads must have length 2, got 3"):
    optimizer.update(jax.grad(loss)(more), apply_updates=False)
  assert_trees_equal(optimizer.state, before)


def test_grads_of_another_structure_name_the_path_and_change_nothing():
  params = dict_params()
  optimizer = Optimizer(optax.adam(1e-2)).init(params)
  before = jax.tree.map(np.array, optimizer.state)
  with pytest.raises(optcore.TreeMismatchError, match="'/w'"):
    optimizer.update({"b": params["b"], "v": params["w"]}, params)
  assert_trees_equal(optimizer.state, before)


def test_apply_updates_false_returns_optax_updates():
  params = dict_params()
  grads = jax.grad(loss)(params)
  tx = optax.adam(1e-2)
  expected, _ = tx.update(grads, tx.init(params), params)
  optimizer = Optimizer(optax.adam(1e-2)).init(params)
  assert_trees_equal(optimizer.update(grads, params, apply_updates=False), expected)
  # Without params too, for transformations that need none.
  optimizer = Optimizer(optax.adam(1e-2)).init(params)
  assert_trees_equal(optimizer.update(grads, apply_updates=False), expected)
  assert int(optimizer.state.step) == 1


def test_no_retrace_when_the_transformation_is_a_fresh_closure_each_step():
  traces = []

  @jax.jit
  def train_step(params, optimizer):
    traces.append(1)
    return optimizer.update(jax.grad(loss)(params), params), optimizer

  params = dict_params()
  optimizer = Optimizer(optax.adam(1e-2)).init(params)
  for _ in range(5):
    params, optimizer = train_step(params, optimizer)
  for _ in range(5):  # rebuilt from a fresh optax.adam each time
    params, _ = train_step(params, Optimizer(optax.adam(1e-2)).init(params))
  assert len(traces) == 1


def test_state_dict_round_trips_in_the_core_layout():
  params = dict_params()
  _, optimizer = treex_usage(optax.adam(1e-2), params, steps=3)
  state_dict = optimizer.state_dict()
  assert set(state_dict) == {"state"} and set(state_dict["state"]["param_states"]["0"]) == {
    "count",
    "mu",
    "nu",
  }
  restored = Optimizer(optax.adam(1e-2)).init(params).restore_state(state_dict)
  assert_trees_equal(restored.state, optimizer.state)
  core = optcore.adam(1e-2).create(params)
  core = core.restore_state({"target": core.state_dict()["target"], **state_dict})
  assert_trees_equal(core.state, optimizer.state)


def test_a_failed_restore_changes_nothing():
  params = dict_params()
  _, optimizer = treex_usage(optax.adam(1e-2), params, steps=2)
  bad = optimizer.state_dict()
  bad["state"]["param_states"]["0"]["mu"]["w"] = np.zeros((1,), np.float32)
  before = jax.tree.map(np.array, optimizer.state)
  with pytest.raises(optcore.StateDictError, match="/w"):
    optimizer.restore_state(bad)
  assert_trees_equal(optimizer.state, before)


def test_a_restore_with_an_int_key_says_what_it_found_and_changes_nothing():
  _, optimizer = treex_usage(optax.adam(1e-2), dict_params(), steps=1)
  bad = optimizer.state_dict()
  bad["state"]["param_states"] = {0: bad["state"]["param_states"]["0"]}
  before = jax.tree.map(np.array, optimizer.state)
  with pytest.raises(
    optcore.StateDictError, match=r"found the key 0 \(int\).*Write the key as '0'"
  ):
    optimizer.restore_state(bad)
  assert_trees_equal(optimizer.state, before)


def test_a_complex_override_is_refused_in_the_treex_face():
  optimizer = Optimizer(optcore.adam(1e-2)).init(dict_params())
  grads = jax.tree.map(jnp.ones_like, dict_params())
  with pytest.raises(TypeError, match="is complex"):
    optimizer.update(grads, dict_params(), learning_rate=0.1 + 0.1j)


def test_treeo_api_works_on_modern_jax_without_touching_jax():
  assert not hasattr(jax, "tree_map")  # JAX >= 0.6: gone, and optcore_treex does not add it
  assert optcore_treex is not None
  model = Dense()
  copied = to.copy(model)
  assert copied is not model and np.array_equal(copied.kernel, model.kernel)
  params = to.filter(model, Parameter)
  assert isinstance(params.mean, to.Nothing)
  doubled = to.map(lambda x: 2 * x, model, Parameter)
  np.testing.assert_array_equal(doubled.kernel, 2 * model.kernel)
  np.testing.assert_array_equal(doubled.mean, model.mean)
  merged = to.merge(model, doubled)
  np.testing.assert_array_equal(merged.bias, 2 * model.bias)

  def set_mean(m):
    m.mean = jnp.ones(4)

  applied = to.apply(set_mean, model)
  np.testing.assert_array_equal(applied.mean, jnp.ones(4))
  np.testing.assert_array_equal(model.mean, jnp.zeros(4))


def test_a_legacy_definition_equals_the_core_optimizer_bitwise():
  params = dict_params()
  ours, _ = treex_usage(optcore.legacy.LARS(0.1, nesterov=True), params)
  core = optcore.legacy.LARS(0.1, nesterov=True).create(params)
  step = jax.jit(lambda core: core.apply_gradient(jax.grad(loss)(core.target)))
  for _ in range(20):
    core = step(core)
  assert_trees_equal(ours, core.target)


def test_something_that_is_no_optimizer_is_refused_by_name():
  with pytest.raises(TypeError, match=r"optcore_treex.Optimizer takes an optcore definition"):
    Optimizer(0.1)


# Wrong inputs through this face (the core's checks; issue 16).


def test_params_of_other_shapes_than_at_init_are_refused_by_path():
  params = dict_params()
  optimizer = Optimizer(optax.adam(1e-2)).init(params)
  before = jax.tree.map(np.array, optimizer.opt_state)
  other = {"w": jnp.ones((3, 2)), "b": jnp.zeros(4)}
  with pytest.raises(
    ValueError, match=r"params has shape \(3, 2\) at '/w'.*initialised for shape \(3, 4\)"
  ):
    optimizer.update(other, other)
  with pytest.raises(ValueError, match=r"grads has shape \(3, 2\) at '/w'"):
    optimizer.update(other, apply_updates=False)
  assert_trees_equal(optimizer.opt_state, before)


def test_a_none_gradient_names_its_path_not_a_leaf_count():
  params = dict_params()
  optimizer = Optimizer(optax.adam(1e-2)).init(params)
  with pytest.raises(optcore.TreeMismatchError, match=r"None at '/w'"):
    optimizer.update({"w": None, "b": jnp.zeros(4)}, params)


@pytest.mark.parametrize("apply_updates", [True, False])
def test_wrong_override_values_are_refused_by_name(apply_updates):
  params = dict_params()
  optimizer = Optimizer(optcore.adam(1e-2)).init(params)
  grads = jax.grad(loss)(params)
  before = jax.tree.map(np.array, optimizer.opt_state)
  with pytest.raises(ValueError, match=r"learning_rate=None is refused"):
    optimizer.update(grads, params, apply_updates=apply_updates, learning_rate=None)
  with pytest.raises(TypeError, match=r"learning_rate='1e-3' is a str"):
    optimizer.update(grads, params, apply_updates=apply_updates, learning_rate="1e-3")
  assert_trees_equal(optimizer.opt_state, before)


def test_integer_parameters_are_refused_at_init_by_path():
  with pytest.raises(TypeError, match=r"parameter at '/step' has dtype int32"):
    Optimizer(optax.adam(1e-2)).init({"w": jnp.ones(2), "step": jnp.asarray(0)})


def test_the_step_is_the_number_of_updates_whichever_count_comes_first():
  """An optax chain whose first count cycles (apply_every's 0, 1, 0, ...): the face read it as
  the step; the core's one rule (optcore.adapter.step_count) reads adam's."""
  import optax

  params = {"w": jnp.ones(2)}
  optimizer = optcore_treex.Optimizer(optax.chain(optax.apply_every(2), optax.adam(0.1)))
  optimizer = optimizer.init(params)
  for _ in range(3):
    params = optimizer.update({"w": jnp.ones(2)}, params)
  assert int(optimizer.state_dict()["state"]["step"]) == 3
  assert int(optimizer.state.step) == 3
