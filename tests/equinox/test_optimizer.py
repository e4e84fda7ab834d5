"""optcore_equinox.Optimizer against the hand-written Equinox + optax loop."""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

import optcore
import optcore_equinox

X = jnp.linspace(-1.0, 1.0, 3)


def mlp():
  return eqx.nn.MLP(3, 2, width_size=8, depth=2, key=jax.random.key(0))


def loss(model):
  return jnp.sum((model(X) - 0.5) ** 2)


def assert_same_model(a, b):
  """Bitwise equal arrays, equal everything else."""
  assert_trees_equal(eqx.filter(a, eqx.is_array), eqx.filter(b, eqx.is_array))
  assert eqx.filter(a, eqx.is_array, inverse=True) == eqx.filter(b, eqx.is_array, inverse=True)


def train_ours(optimizer, steps=20, model=None, **update_kwargs):
  model = mlp() if model is None else model
  opt = optcore_equinox.Optimizer(optimizer, model)

  @eqx.filter_jit(donate="all")
  def step(model, opt):
    return opt.update(eqx.filter_grad(loss)(model), model, **update_kwargs)

  for _ in range(steps):
    model, opt = step(model, opt)
  return model, opt


def train_by_hand(tx, steps=20):
  """The loop every Equinox user writes today."""
  model = mlp()
  state = tx.init(eqx.filter(model, eqx.is_inexact_array))

  @eqx.filter_jit(donate="all")
  def step(model, state):
    grads = eqx.filter_grad(loss)(model)
    updates, state = tx.update(grads, state, eqx.filter(model, eqx.is_inexact_array))
    return eqx.apply_updates(model, updates), state

  for _ in range(steps):
    model, state = step(model, state)
  return model


def test_adamw_equals_the_hand_written_loop_bitwise():
  model, opt = train_ours(optcore.adamw(1e-2, weight_decay=0.1))
  assert_same_model(model, train_by_hand(optax.adamw(1e-2, weight_decay=0.1)))
  assert int(opt.state.step) == 20


def test_a_raw_optax_transformation_is_accepted():
  model, _ = train_ours(optax.lion(1e-3))
  assert_same_model(model, train_by_hand(optax.lion(1e-3)))


def _is_weight(path, _):
  return path.endswith("/weight")


def test_multi_optimizer_equals_optax_partition_bitwise():
  ours = optcore.MultiOptimizer((_is_weight, optcore.adam(1e-2)), (r"/bias$", optcore.sgd(0.1)))
  labels = jax.tree_util.tree_map_with_path(
    lambda path, _: "w" if jax.tree_util.keystr(path).endswith(".weight") else "b",
    eqx.filter(mlp(), eqx.is_inexact_array),
  )
  reference = optax.partition({"w": optax.adam(1e-2), "b": optax.sgd(0.1)}, lambda _: labels)
  model, _ = train_ours(ours)
  assert_same_model(model, train_by_hand(reference))


class SignMomentum(optcore.OptimizerDef):
  """A per-parameter definition (flax.optim style): momentum on the sign of the gradient."""

  def __init__(self, learning_rate=0.01, beta=0.9):
    super().__init__(optcore.HyperParams(learning_rate=learning_rate, beta=beta))

  def init_param_state(self, param):
    return jnp.zeros_like(param)

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    momentum = hyper_params.beta * state + jnp.sign(grad)
    return param - hyper_params.learning_rate * momentum, momentum


def test_a_per_parameter_definition_equals_its_formula_written_by_hand():
  model, _ = train_ours(SignMomentum(0.01, 0.9))
  expected = mlp()
  momentum = jax.tree.map(jnp.zeros_like, eqx.filter(expected, eqx.is_inexact_array))

  @eqx.filter_jit
  def step(model, momentum):
    grads = eqx.filter_grad(loss)(model)
    momentum = jax.tree.map(lambda m, g: 0.9 * m + jnp.sign(g), momentum, grads)
    params, static = eqx.partition(model, eqx.is_inexact_array)
    params = jax.tree.map(lambda p, m: p - 0.01 * m, params, momentum)
    return eqx.combine(params, static), momentum

  for _ in range(20):
    expected, momentum = step(expected, momentum)
  assert_same_model(model, expected)


class Tagged(eqx.Module):
  linear: eqx.nn.Linear
  counts: jax.Array  # an int array: never optimised
  activation: callable  # a function leaf
  scale: float = eqx.field(static=True)

  def __call__(self, x):
    return self.scale * self.activation(self.linear(x))


def test_only_selected_leaves_move():
  model = Tagged(eqx.nn.Linear(3, 2, key=jax.random.key(1)), jnp.arange(3), jax.nn.tanh, 2.0)
  inexact = jax.tree.map(eqx.is_inexact_array, model)
  no_bias = eqx.tree_at(lambda t: t.linear.bias, inexact, False)
  opt = optcore_equinox.Optimizer(optcore.sgd(0.1, momentum=0.9), model, wrt=no_bias)
  grads = eqx.filter_grad(lambda m: jnp.sum(m(X)))(model)
  new_model, opt = opt.update(grads, model)
  assert not np.array_equal(new_model.linear.weight, model.linear.weight)
  np.testing.assert_array_equal(new_model.linear.bias, model.linear.bias)
  np.testing.assert_array_equal(new_model.counts, model.counts)
  assert new_model.activation is jax.nn.tanh and new_model.scale == 2.0
  trace = opt.state.param_states[0].trace
  assert trace.linear.bias is None and trace.counts is None
  assert trace.linear.weight.shape == (2, 3)


def test_no_recompile_over_100_steps_with_a_changing_learning_rate():
  model = mlp()
  opt = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
  traces = []

  @eqx.filter_jit(donate="all")
  def step(model, opt, lr):
    traces.append(1)
    return opt.update(eqx.filter_grad(loss)(model), model, learning_rate=lr)

  for i in range(100):
    model, opt = step(model, opt, jnp.asarray(1e-2 / (1 + i)))
  assert len(traces) == 1
  # A freshly built optimizer with the same configuration reuses the compiled step.
  step(model, optcore_equinox.Optimizer(optcore.adam(1e-2), model), jnp.asarray(0.1))
  assert len(traces) == 1


def test_an_override_takes_effect():
  model = mlp()
  opt = optcore_equinox.Optimizer(optcore.sgd(0.1), model)
  grads = eqx.filter_grad(loss)(model)
  frozen, _ = opt.update(grads, model, learning_rate=0.0)
  assert_same_model(frozen, model)


def test_a_none_gradient_names_its_path():
  model = mlp()
  opt = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
  grads = eqx.tree_at(lambda m: m.layers[1].weight, eqx.filter_grad(loss)(model), None)
  with pytest.raises(optcore.TreeMismatchError, match=r"None at '/layers/1/weight'"):
    opt.update(grads, model)


def test_gradients_of_another_structure_name_the_path():
  model = mlp()
  opt = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
  other = eqx.nn.MLP(3, 2, width_size=8, depth=1, key=jax.random.key(0))
  with pytest.raises(optcore.TreeMismatchError, match=r"'/layers/2/weight'"):
    opt.update(eqx.filter_grad(loss)(other), model)


@pytest.mark.parametrize(
  "shape", [(5,), (1,), (2, 1)], ids=["longer", "broadcasting", "extra-axis"]
)
def test_a_gradient_of_the_wrong_shape_names_its_path_and_changes_nothing(shape):
  model = mlp()
  opt = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
  bias = model.layers[1].bias
  grads = eqx.tree_at(lambda m: m.layers[1].bias, eqx.filter_grad(loss)(model), jnp.ones(shape))
  before = jax.tree.map(np.asarray, eqx.filter(opt, eqx.is_array))
  found, want = re.escape(str(shape)), re.escape(str(bias.shape))
  message = rf"grads has shape {found} at '/layers/1/bias', where the parameter has shape {want}"
  for update in (opt.update, eqx.filter_jit(opt.update)):
    with pytest.raises(optcore.TreeMismatchError, match=message):
      update(grads, model)
  after = jax.tree.leaves(eqx.filter(opt, eqx.is_array))
  for got, want in zip(after, jax.tree.leaves(before), strict=True):
    np.testing.assert_array_equal(got, want)


def test_state_dict_round_trips_and_moves_to_the_core():
  model, opt = train_ours(optcore.adam(1e-2), steps=3)
  state_dict = opt.state_dict()
  assert set(state_dict) == {"state"} and int(state_dict["state"]["step"]) == 3
  fresh = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
  assert_trees_equal(fresh.restore_state(state_dict), opt)
  # The core optimizer over the same leaves reads it, and writes one this adapter reads.
  core = optcore.adam(1e-2).create(eqx.filter(model, eqx.is_inexact_array))
  core = core.restore_state({"target": core.state_dict()["target"], **state_dict})
  assert_trees_equal(core.state, opt.state)
  assert_trees_equal(fresh.restore_state(core.state_dict()), opt)


def test_a_failed_restore_changes_nothing():
  _, opt = train_ours(optcore.adam(1e-2), steps=2)
  bad = opt.state_dict()
  bad["state"]["param_states"]["0"]["mu"]["layers"]["0"]["weight"] = np.zeros((1, 1), np.float32)
  before = jax.tree.map(np.array, opt)
  with pytest.raises(optcore.StateDictError, match="/layers/0/weight"):
    opt.restore_state(bad)
  assert_trees_equal(opt, before)


def test_a_restore_with_an_int_key_says_what_it_found_and_changes_nothing():
  _, opt = train_ours(optcore.adam(1e-2), steps=1)
  bad = opt.state_dict()
  layers = bad["state"]["param_states"]["0"]["mu"]["layers"]
  bad["state"]["param_states"]["0"]["mu"]["layers"] = {int(k): v for k, v in layers.items()}
  before = jax.tree.map(np.array, opt)
  with pytest.raises(optcore.StateDictError, match=r"mu/layers': found the key 0 \(int\)"):
    opt.restore_state(bad)
  assert_trees_equal(opt, before)


def test_a_partial_hyper_params_dict_and_a_schedule_of_vectors_in_the_equinox_face():
  model = mlp()
  opt = optcore_equinox.Optimizer(optcore.adam(0.1, b1=0.5), model)
  grads = eqx.filter_grad(loss)(model)
  by_dict, _ = opt.update(grads, model, hyper_params={"learning_rate": 0.2})
  by_keyword, _ = opt.update(grads, model, learning_rate=0.2)
  assert_same_model(by_dict, by_keyword)
  step = eqx.filter_jit(lambda m, o: o.update(grads, m, learning_rate=lambda c: jnp.ones(3)))
  with pytest.raises(ValueError, match=r"learning_rate has shape \(3,\)"):
    step(model, opt)


def test_tree_serialise_leaves_round_trips(tmp_path):
  _, opt = train_ours(optcore.adam(1e-2), steps=3)
  eqx.tree_serialise_leaves(tmp_path / "opt.eqx", opt)
  like = optcore_equinox.Optimizer(optcore.adam(1e-2), mlp())
  assert_trees_equal(eqx.tree_deserialise_leaves(tmp_path / "opt.eqx", like), opt)


def test_shard_places_state_by_the_model_specs():
  model = mlp()
  opt = optcore_equinox.Optimizer(optcore.adafactor(1e-2, min_dim_size_to_factor=2), model)
  specs = jax.tree.map(
    lambda x: P(*("model",) + (None,) * (x.ndim - 1)) if eqx.is_array(x) else None, model
  )
  mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
  shardings = opt.shardings(model, specs, mesh)
  factored = shardings.state.param_states[0]
  # layers[0].weight is (8, 3): v_row reduces the largest dimension (8), v_col the other.
  assert factored.v_col.layers[0].weight.spec == P("model")
  assert factored.v_row.layers[0].weight.spec == P(None)
  sharded = opt.shard(model, specs, mesh)
  assert_trees_equal(sharded, opt)


@pytest.mark.parametrize(
  "make",
  [
    lambda: optcore.legacy.Adam(1e-2, weight_decay=1e-3),
    lambda: optcore.legacy.Adafactor(1e-2, min_dim_size_to_factor=4, beta1=0.9),
    lambda: optcore.legacy.WeightNorm(optcore.legacy.Momentum(1e-2)),
  ],
  ids=["adam", "adafactor", "weight-norm"],
)
def test_a_legacy_definition_equals_the_core_loop_bitwise(make):
  """A legacy definition has no optax form: the hand-written loop drives the core
  Optimizer on the filtered module."""
  model, _ = train_ours(make())
  expected = mlp()
  params, static = eqx.partition(expected, eqx.is_inexact_array)
  core = make().create(params)

  @jax.jit
  def step(core):
    grads = eqx.filter(
      eqx.filter_grad(loss)(eqx.combine(core.target, static)), eqx.is_inexact_array
    )
    return core.apply_gradient(grads)

  for _ in range(20):
    core = step(core)
  assert_same_model(model, eqx.combine(core.target, static))


def test_something_that_is_no_optimizer_is_refused_by_name():
  with pytest.raises(TypeError, match=r"optcore_equinox.Optimizer takes an optcore definition"):
    optcore_equinox.Optimizer("adam", mlp())


# Wrong inputs through this face (the core's checks; issue 16).


@pytest.mark.parametrize(
  ("value", "error", "message"),
  [
    (None, ValueError, r"learning_rate=None is refused"),
    ("0.1", TypeError, r"learning_rate='0\.1' is a str"),
    (True, TypeError, r"learning_rate=True is a bool"),
    (jnp.ones(3), ValueError, r"learning_rate has shape \(3,\)"),
  ],
  ids=["none", "string", "bool", "vector"],
)
def test_wrong_override_values_are_refused_by_name_eager_and_under_filter_jit(
  value, error, message
):
  model = mlp()
  opt = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
  grads = eqx.filter_grad(loss)(model)
  before = jax.tree.map(np.asarray, eqx.filter(opt, eqx.is_array))
  update = lambda g, m, o, lr: o.update(g, m, learning_rate=lr)
  for run in (update, eqx.filter_jit(update)):
    with pytest.raises(error, match=message):
      run(grads, model, opt, value)
  after = jax.tree.leaves(eqx.filter(opt, eqx.is_array))
  for got, want in zip(after, jax.tree.leaves(before), strict=True):
    np.testing.assert_array_equal(got, want)


def test_a_filter_that_selects_nothing_warns():
  with pytest.warns(UserWarning, match=r"selects no leaf of the model, so nothing will be trained"):
    optcore_equinox.Optimizer(optcore.adam(1e-2), mlp(), wrt=lambda x: False)


def test_a_step_without_a_learning_rate_names_it():
  model = mlp()
  opt = optcore_equinox.Optimizer(optcore.legacy.Adam(), model)
  with pytest.raises(optcore.MissingHyperParameterError, match="no learning rate provided"):
    opt.update(eqx.filter_grad(loss)(model), model)
