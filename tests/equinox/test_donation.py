"""Donation, as the getting-started page documents it: a donated step deletes the buffers it was
given, so a state dict kept across it must be a copy (`state_dict()` shares the state's arrays),
and what the step returned is what the loop goes on with."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optcore
import optcore_equinox


def make():
  model = eqx.nn.MLP(2, 1, width_size=4, depth=1, key=jax.random.key(0))
  return model, optcore_equinox.Optimizer(optcore.adam(1e-2), model)


@eqx.filter_jit(donate="all-except-first")
def step(x, model, opt):
  grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(model)
  return opt.update(grads, model)


def test_a_state_dict_kept_across_a_donated_step_is_deleted_with_the_state():
  """The hazard the page warns of, so that the page stays true."""
  model, opt = make()
  model, opt = step(jnp.ones(2), model, opt)
  shared = opt.state_dict()
  model, opt = step(jnp.ones(2), model, opt)
  with pytest.raises(RuntimeError, match="deleted"):
    jax.tree.map(np.asarray, shared)


def test_the_documented_copy_survives_and_restores_the_run_exactly():
  model, opt = make()
  model, opt = step(jnp.ones(2), model, opt)
  checkpoint = jax.device_get(opt.state_dict())  # as the page writes it
  kept_model = jax.device_get(eqx.filter(model, eqx.is_array))
  model, opt = step(jnp.ones(2), model, opt)
  after = jax.device_get(opt.state_dict())
  resumed_model = eqx.combine(
    jax.tree.map(jnp.asarray, kept_model), eqx.filter(model, eqx.is_array, inverse=True)
  )
  resumed = optcore_equinox.Optimizer(optcore.adam(1e-2), resumed_model).restore_state(checkpoint)
  _, resumed = step(jnp.ones(2), resumed_model, resumed)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.state_dict()), after)
