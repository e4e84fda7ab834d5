"""The definition, state and Optimizer container: flax.optim's semantics."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optcore


class HeavyBall(optcore.OptimizerDef):
  """A per-parameter definition, written the flax.optim way."""

  def __init__(self, learning_rate=0.1, beta=0.5):
    super().__init__(optcore.HyperParams(learning_rate=learning_rate, beta=beta))

  def init_param_state(self, param):
    return {"momentum": jnp.zeros_like(param)}

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    momentum = hyper_params.beta * state["momentum"] + grad
    return param - hyper_params.learning_rate * momentum, {"momentum": momentum}


def test_per_parameter_definition_steps_like_flax_optim():
  seen_steps = []

  class Recording(HeavyBall):
    def apply_param_gradient(self, step, hyper_params, param, state, grad):
      seen_steps.append(int(step))
      return super().apply_param_gradient(step, hyper_params, param, state, grad)

  opt = Recording().create({"w": jnp.array([1.0, 2.0])})
  g = {"w": jnp.array([1.0, -1.0])}
  opt = opt.apply_gradient(g)
  opt = opt.apply_gradient(g, learning_rate=1.0)
  # by hand: m1 = g, w1 = w - 0.1 g; m2 = 0.5 g + g = 1.5 g, w2 = w1 - 1.0 * 1.5 g
  np.testing.assert_allclose(opt.target["w"], [1.0 - 0.1 - 1.5, 2.0 + 0.1 + 1.5], rtol=1e-6)
  np.testing.assert_allclose(opt.state.param_states["w"]["momentum"], [1.5, -1.5])
  assert seen_steps == [0, 1] and int(opt.state.step) == 2


def test_hyper_params_keyword_replaces_all():
  d = HeavyBall()
  hp = d.update_hyper_params(hyper_params=d.hyper_params.replace(beta=0.0), learning_rate=0.3)
  assert (hp.learning_rate, hp.beta) == (0.3, 0.0)
  assert d.hyper_params.learning_rate == 0.1  # overrides last one call


def test_unknown_override_is_a_type_error():
  with pytest.raises(
    TypeError, match=r"HeavyBall\(learning_rate=0.1, beta=0.5\): unknown hyper-parameter 'lr'"
  ):
    HeavyBall().update_hyper_params(lr=0.1)


def test_extra_args_are_refused_by_per_parameter_definitions():
  opt = HeavyBall().create({"w": jnp.ones(2)})
  with pytest.raises(
    TypeError, match=r"HeavyBall takes no extra update arguments; got \['value'\]"
  ):
    opt.apply_gradient({"w": jnp.ones(2)}, extra_args={"value": 1.0})


def test_optimizer_is_a_pytree_with_a_static_definition():
  opt = optcore.adam(1e-3).create({"w": jnp.ones(2)})
  leaves = jax.tree.leaves(opt)
  # step, adam's count, mu, nu, and the target.
  assert len(leaves) == 5
  same = optcore.adam(1e-3).create({"w": jnp.zeros(2)})
  assert jax.tree.structure(opt) == jax.tree.structure(same)
  other = optcore.adam(2e-3).create({"w": jnp.zeros(2)})
  assert jax.tree.structure(opt) != jax.tree.structure(other)
  rebuilt = jax.tree.unflatten(jax.tree.structure(opt), leaves)
  assert rebuilt.optimizer_def == opt.optimizer_def


def test_definitions_with_array_hyper_params_are_hashable():
  a = optcore.sgd(jnp.float32(0.1))
  b = optcore.sgd(np.float32(0.1))
  c = optcore.sgd(jnp.float32(0.2))
  assert a == b and hash(a) == hash(b) and a != c


def test_schedules_are_hyper_params_compared_by_identity():
  schedule = lambda count: 0.1 / (1 + count)
  assert optcore.sgd(schedule) == optcore.sgd(schedule)
  assert optcore.sgd(schedule) != optcore.sgd(lambda count: 0.1)


def test_hyper_params_pass_through_jit_with_static_non_numbers():
  hp = optcore.HyperParams(learning_rate=0.1, nesterov=True, mask=None)
  out = jax.jit(lambda h: h.replace(learning_rate=h.learning_rate * 2))(hp)
  assert out.nesterov is True and out.mask is None
  np.testing.assert_allclose(out.learning_rate, 0.2)
  assert jax.tree.leaves(hp) == [0.1]


def test_hyper_params_are_immutable():
  hp = optcore.HyperParams(learning_rate=0.1)
  with pytest.raises(AttributeError, match="immutable"):
    hp.learning_rate = 0.2
  with pytest.raises(
    AttributeError,
    match=r"unknown hyper-parameter 'lr' \(optcore's name is 'learning_rate'\); the valid names",
  ):
    _ = hp.lr


def test_replace_returns_a_new_optimizer():
  opt = optcore.sgd(0.1).create({"w": jnp.ones(2)})
  moved = opt.replace(target={"w": jnp.zeros(2)})
  np.testing.assert_array_equal(opt.target["w"], [1.0, 1.0])
  np.testing.assert_array_equal(moved.target["w"], [0.0, 0.0])


@pytest.mark.parametrize(
  ("grads", "message"),
  [
    ({"a": jnp.ones(2), "b": None}, r"grads has None at '/b', where the parameters have an array"),
    ({"a": jnp.ones(2)}, r"grads has no array at '/b'"),
    ({"a": jnp.ones(2), "b": jnp.ones(3), "c": jnp.ones(1)}, r"extra entries at \['/c'\]"),
  ],
)
def test_grads_that_do_not_fit_the_params_name_the_path(grads, message):
  opt = optcore.adam(1e-3).create({"a": jnp.ones(2), "b": jnp.ones(3)})
  with pytest.raises(optcore.TreeMismatchError, match=message):
    opt.apply_gradient(grads)


# Gradients are checked against the parameters: path, expected and found shapes.


@pytest.mark.parametrize(
  "shape", [(2, 1), (1,), (5,)], ids=["extra-axis", "broadcasting", "longer"]
)
def test_a_gradient_of_the_wrong_shape_names_its_path_eager_and_jitted(shape):
  optimizer = optcore.adam(1e-2).create({"layer": {"b": jnp.zeros(2)}})
  grads = {"layer": {"b": jnp.ones(shape)}}
  message = (
    rf"grads has shape {re.escape(str(shape))} at '/layer/b', where the parameter has shape \(2,\)"
  )
  for step in (lambda o, g: o.apply_gradient(g), jax.jit(lambda o, g: o.apply_gradient(g))):
    with pytest.raises(optcore.TreeMismatchError, match=message):
      step(optimizer, grads)


def test_per_example_gradients_are_checked_on_their_trailing_dimensions():
  params = {"w": jnp.zeros(3)}
  dpsgd = optcore.contrib.dpsgd(0.1, l2_norm_clip=1.0, noise_multiplier=0.0, seed=0)
  assert dpsgd.per_example_gradients and not optcore.sgd(0.1).per_example_gradients
  optimizer = dpsgd.create(params).apply_gradient({"w": jnp.ones((4, 3))})  # 4 examples
  assert optimizer.target["w"].shape == (3,)
  with pytest.raises(
    optcore.TreeMismatchError, match=r"expected a gradient of shape \(examples, 3\)"
  ):
    dpsgd.create(params).apply_gradient({"w": jnp.ones((4, 2))})
