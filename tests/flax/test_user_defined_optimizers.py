"""Optimizers users wrote themselves against flax.optim's OptimizerDef, run unchanged.

Programs of the flax.optim era often subclassed ``flax.optim.OptimizerDef``: hyper-parameters
in a ``flax.struct.dataclass``, ``init_param_state`` and ``apply_param_gradient`` per
parameter, or ``init_state`` and ``apply_gradient`` over the whole tree. The two subclasses
below are written in that style, as such a program would have them; they run through the
flax.optim face (after ``install_legacy_namespace``) with overrides, ``jit``, ``pmap`` with
``jax_utils.replicate``, state dicts, ``flax.serialization``, ``flax.training.checkpoints``,
MultiOptimizer groups, ``focus=`` and ``as_optax()``. Expected numbers come from the same
algorithm written in float64 NumPy.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import jax_utils, serialization, struct
from flax.training import checkpoints
from tree_testing import assert_trees_equal

import optcore_flax

optcore_flax.install_legacy_namespace()
from flax import optim  # noqa: E402  (the line a legacy program has)


@struct.dataclass
class _ClippedMomentumHyperParams:
  learning_rate: np.ndarray
  beta: np.ndarray
  clip: np.ndarray


@struct.dataclass
class _ClippedMomentumParamState:
  momentum: np.ndarray


class ClippedMomentum(optim.OptimizerDef):
  """Momentum on element-wise clipped gradients (a per-parameter flax.optim definition)."""

  def __init__(self, learning_rate=None, beta=0.9, clip=1.0):
    super().__init__(_ClippedMomentumHyperParams(learning_rate, beta, clip))

  def init_param_state(self, param):
    return _ClippedMomentumParamState(jnp.zeros_like(param))

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    assert hyper_params.learning_rate is not None, "no learning rate provided."
    grad = jnp.clip(grad, -hyper_params.clip, hyper_params.clip)
    momentum = hyper_params.beta * state.momentum + grad
    new_param = param - hyper_params.learning_rate * momentum
    return new_param, _ClippedMomentumParamState(momentum)


@struct.dataclass
class _NormalizedSGDHyperParams:
  learning_rate: float


class NormalizedSGD(optim.OptimizerDef):
  """SGD on the gradient divided by its global norm (a whole-tree flax.optim definition)."""

  def __init__(self, learning_rate=None):
    super().__init__(_NormalizedSGDHyperParams(learning_rate))

  def init_state(self, params):
    return optim.OptimizerState(jnp.asarray(0, jnp.int32), jax.tree.map(lambda _: (), params))

  def apply_gradient(self, hyper_params, params, state, grads):
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    new_params = jax.tree.map(lambda p, g: p - hyper_params.learning_rate * g / norm, params, grads)
    return new_params, state.replace(step=state.step + 1)


PARAMS = {
  "Dense_0": {"kernel": jnp.linspace(-1.0, 1.0, 6).reshape(3, 2), "bias": jnp.zeros(2)},
  "Dense_1": {"kernel": jnp.linspace(0.5, 1.5, 4).reshape(2, 2), "bias": jnp.ones(2)},
}


def grads_at(step):
  return jax.tree.map(lambda p: jnp.sin(p * (step + 1.0)) * 3.0, PARAMS)


def clipped_momentum_reference(steps, learning_rates, beta=0.9, clip=1.0):
  """The algorithm in float64 NumPy: the numbers the subclass must give."""
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), PARAMS)
  momentum = jax.tree.map(np.zeros_like, params)
  for step, lr in zip(range(steps), learning_rates, strict=True):
    grads = jax.tree.map(lambda g: np.clip(np.asarray(g, np.float64), -clip, clip), grads_at(step))
    momentum = jax.tree.map(lambda m, g: beta * m + g, momentum, grads)
    params = jax.tree.map(lambda p, m: p - lr * m, params, momentum)  # noqa: B023
  return params, momentum


def assert_close(tree, reference, rtol=1e-6):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6), tree, reference)


def train(optimizer, steps, **overrides):
  step = jax.jit(lambda opt, g, lr: opt.apply_gradient(g, learning_rate=lr))
  for i in range(steps):
    optimizer = step(optimizer, grads_at(i), overrides.get("lr", [0.1] * steps)[i])
  return optimizer


def test_a_per_parameter_subclass_trains_with_overrides_as_its_algorithm_says():
  lrs = [0.1, 0.05, 0.02]
  optimizer = train(ClippedMomentum(0.1).create(PARAMS), 3, lr=lrs)
  params, momentum = clipped_momentum_reference(3, lrs)
  assert_close(optimizer.target, params)
  is_state = lambda s: isinstance(s, _ClippedMomentumParamState)
  states = jax.tree.map(lambda s: s.momentum, optimizer.state.param_states, is_leaf=is_state)
  assert_close(states, momentum)
  assert int(optimizer.state.step) == 3
  # hyper_params=...: the struct's own replace, as flax.optim's docs show.
  hp = ClippedMomentum(0.1).hyper_params
  one = ClippedMomentum(0.1).create(PARAMS).apply_gradient(grads_at(0), hyper_params=hp)
  assert_close(one.target, clipped_momentum_reference(1, [0.1])[0])
  # ... or an instance of the program's own struct, as it would have built one.
  own = _ClippedMomentumHyperParams(0.05, 0.9, 1.0)
  two = ClippedMomentum(0.1).create(PARAMS).apply_gradient(grads_at(0), hyper_params=own)
  assert_close(two.target, clipped_momentum_reference(1, [0.05])[0])


def test_a_whole_tree_subclass_trains_and_keeps_its_own_state():
  optimizer = NormalizedSGD(0.5).create(PARAMS)
  new = optimizer.apply_gradient(grads_at(0), learning_rate=0.25)
  g = jax.tree.map(lambda x: np.asarray(x, np.float64), grads_at(0))
  norm = np.sqrt(sum(np.sum(x * x) for x in jax.tree.leaves(g)))
  assert_close(new.target, jax.tree.map(lambda p, x: np.asarray(p) - 0.25 * x / norm, PARAMS, g))
  assert int(new.state.step) == 1 and optimizer.state.step == 0


def test_a_subclass_replicated_under_pmap_trains_as_on_one_device():
  devices = jax.local_devices()
  optimizer = jax_utils.replicate(ClippedMomentum(0.1).create(PARAMS))

  def step(optimizer, grads):
    return optimizer.apply_gradient(jax.lax.pmean(grads, "batch"), learning_rate=0.1)

  replicated_grads = jax_utils.replicate(grads_at(0))
  optimizer = jax.pmap(step, axis_name="batch")(optimizer, replicated_grads)
  assert jax.tree.leaves(optimizer.target)[0].shape[0] == len(devices)
  assert_close(jax_utils.unreplicate(optimizer).target, clipped_momentum_reference(1, [0.1])[0])


def test_a_subclass_checkpoints_through_state_dicts_bytes_and_flax_checkpoints(tmp_path):
  trained = train(ClippedMomentum(0.1).create(PARAMS), 2)
  state_dict = serialization.to_state_dict(trained)
  assert sorted(state_dict["state"]["param_states"]["Dense_0"]["kernel"]) == ["momentum"]
  fresh = ClippedMomentum(0.1).create(PARAMS)
  assert_trees_equal(fresh.restore_state(trained.state_dict()), trained)
  assert_trees_equal(serialization.from_bytes(fresh, serialization.to_bytes(trained)), trained)
  checkpoints.save_checkpoint(tmp_path, trained, step=2)
  restored = checkpoints.restore_checkpoint(tmp_path, fresh)
  assert_trees_equal(jax.tree.map(np.asarray, restored), jax.tree.map(np.asarray, trained))
  # Training resumes bitwise from the restored checkpoint.
  step = jax.jit(lambda opt, g: opt.apply_gradient(g, learning_rate=0.1))
  assert_trees_equal(step(restored, grads_at(2)), step(trained, grads_at(2)))


def test_a_subclass_is_a_multi_optimizer_group_and_a_focus():
  kernels = optim.ModelParamTraversal(lambda path, _: path.endswith("/kernel"))
  biases = optim.ModelParamTraversal(lambda path, _: path.endswith("/bias"))
  multi = optim.MultiOptimizer((kernels, ClippedMomentum(0.1)), (biases, NormalizedSGD(0.5)))
  optimizer = multi.create(PARAMS).apply_gradient(grads_at(0))
  expected = clipped_momentum_reference(1, [0.1])[0]
  for layer in PARAMS:
    assert_close(optimizer.target[layer]["kernel"], expected[layer]["kernel"])
    state = optimizer.state.param_states[layer]
    assert isinstance(state["kernel"], _ClippedMomentumParamState) and state["bias"] == ()
  focused = ClippedMomentum(0.1).create(PARAMS, focus=kernels).apply_gradient(grads_at(0))
  assert_trees_equal(focused.target["Dense_1"]["bias"], PARAMS["Dense_1"]["bias"])
  assert focused.state.param_states["Dense_1"]["bias"] is None
  assert_close(focused.target["Dense_1"]["kernel"], expected["Dense_1"]["kernel"])


def test_a_subclass_exported_as_optax_lands_on_the_same_parameters():
  tx = ClippedMomentum(0.1).as_optax()
  params, state = PARAMS, tx.init(PARAMS)
  for i in range(2):
    updates, state = tx.update(grads_at(i), state, params)
    params = optax.apply_updates(params, updates)
  assert_close(params, clipped_momentum_reference(2, [0.1, 0.1])[0], rtol=1e-5)


def test_frozen_params_with_dict_grads_and_the_other_way_round():
  frozen = flax.core.freeze(PARAMS)
  for params, grads in ((frozen, grads_at(0)), (PARAMS, flax.core.freeze(grads_at(0)))):
    for opt_def in (ClippedMomentum(0.1), optim.Adam(0.1), optcore_flax.optimizers.adamw(0.1)):
      new = opt_def.create(params).apply_gradient(grads)
      assert type(new.target) is type(params)  # the params' own container
      if opt_def.per_parameter_state:
        assert type(new.state.param_states) is type(params)
  expected = clipped_momentum_reference(1, [0.1])[0]
  new = ClippedMomentum(0.1).create(frozen).apply_gradient(grads_at(0))
  assert_close(flax.core.unfreeze(new.target), expected)


def test_adafactors_none_overrides_switch_off_what_the_original_switched_off():
  params = {"w": jnp.linspace(-2.0, 2.0, 12).reshape(3, 4)}
  grads = {"w": jnp.linspace(5.0, -5.0, 12).reshape(3, 4)}
  for adafactor in (optim.Adafactor, optcore_flax.adafactor.Adafactor):
    clipped = adafactor(0.1, weight_decay_rate=0.1).create(params)
    unclipped = adafactor(0.1, clipping_threshold=None, weight_decay_rate=None).create(params)
    overridden = clipped.apply_gradient(grads, clipping_threshold=None, weight_decay_rate=None)
    assert_trees_equal(overridden.target, unclipped.apply_gradient(grads).target)
    assert not np.allclose(overridden.target["w"], clipped.apply_gradient(grads).target["w"])
  t5x = optcore_flax.adafactor.Adafactor(
    0.1, max_parameter_scale=0.5, global_norm_clip_threshold=1.0
  )
  off = optcore_flax.adafactor.Adafactor(0.1).create(params).apply_gradient(grads)
  assert_trees_equal(
    t5x.create(params)
    .apply_gradient(grads, max_parameter_scale=None, global_norm_clip_threshold=None)
    .target,
    off.target,
  )


@pytest.mark.parametrize(
  ("make", "name"),
  [
    (lambda: optim.Adafactor(0.1), "learning_rate"),  # the original asserts a learning rate
    (lambda: optim.Momentum(0.1), "beta"),  # None * momentum: a crash in the original
    (lambda: optim.Adam(0.1), "eps"),
  ],
)
def test_none_overrides_the_original_crashed_on_are_still_refused(make, name):
  optimizer = make().create(PARAMS)
  with pytest.raises(ValueError, match=f"{name}=None"):
    optimizer.apply_gradient(grads_at(0), **{name: None})
