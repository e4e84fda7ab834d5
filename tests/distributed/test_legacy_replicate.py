"""flax.optim's ``Optimizer.replicate()`` on 8 devices: the gradients are averaged.

flax.optim's deprecated ``optimizer.replicate()`` put a ReplicatedOptimizer around the
definition, which averaged the gradients across the ``pmap`` axis (``'batch'``) before each
step, so every replica applied the mean gradient. Programs of that era relied on it instead of
writing ``lax.pmean`` themselves.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tree_testing import assert_trees_equal

import optcore
from optcore import legacy

PARAMS = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.zeros(3)}


def per_device_grads(n):
  return {
    "w": jnp.stack([jnp.full((2, 3), float(i)) for i in range(n)]),
    "b": jnp.stack([jnp.arange(3.0) * i for i in range(n)]),
  }


@pytest.mark.parametrize("make", [lambda: legacy.Momentum(0.1, beta=0.9), lambda: legacy.Adam(0.1)])
def test_replicate_averages_the_gradients_across_the_replicas(cpu_devices, make):
  optimizer = make().create(PARAMS).replicate(devices=cpu_devices)
  assert isinstance(optimizer.optimizer_def, legacy.ReplicatedOptimizer)
  grads = per_device_grads(len(cpu_devices))
  step = jax.pmap(lambda o, g: o.apply_gradient(g), axis_name="batch", devices=cpu_devices)
  replicated = step(step(optimizer, grads), grads)
  # Every replica is the same, and equals one device stepping with the mean gradient.
  for leaf in jax.tree.leaves(replicated):
    np.testing.assert_array_equal(
      np.asarray(leaf), np.broadcast_to(np.asarray(leaf)[0], leaf.shape)
    )
  mean = jax.tree.map(lambda g: jnp.mean(g, axis=0), grads)
  one = make().create(PARAMS)
  one = one.apply_gradient(mean).apply_gradient(mean)
  unreplicated = replicated.unreplicate()
  assert type(unreplicated.optimizer_def) is type(one.optimizer_def)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
    unreplicated.target,
    one.target,
  )


def test_a_replicated_optimizers_state_dict_holds_one_copy_and_restores_replicated(cpu_devices):
  optimizer = legacy.Adam(0.1).create(PARAMS).replicate(devices=cpu_devices)
  step = jax.pmap(lambda o, g: o.apply_gradient(g), axis_name="batch", devices=cpu_devices)
  trained = step(optimizer, per_device_grads(len(cpu_devices)))
  state_dict = trained.state_dict()
  assert np.shape(state_dict["target"]["w"]) == (2, 3)
  assert np.shape(state_dict["state"]["step"]) == ()
  restored = optimizer.restore_state(jax.tree.map(np.asarray, state_dict))
  assert restored.target["w"].shape == (len(cpu_devices), 2, 3)
  assert_trees_equal(jax.tree.map(np.asarray, restored), jax.tree.map(np.asarray, trained))


def test_unreplicate_of_an_optimizer_replicate_did_not_make_is_flax_optims_error():
  with pytest.raises(ValueError, match="Cannot unreplicate an optimizer that is not replicated"):
    optcore.sgd(0.1).create(PARAMS).unreplicate()
