"""from_optax_state / to_optax_state: the state of a definition's as_optax() read back in the
definition's own layout (what state dicts, restores and read-outs take) and written again, as
the NNX face keeps it in nnx.Optimizer's opt_state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optcore


def params():
  return {
    "dense": {"kernel": jnp.arange(6.0).reshape(2, 3), "bias": jnp.ones(3)},
    "scale": jnp.ones(()),
  }


def grads():
  return jax.tree.map(lambda p: 0.1 * jnp.ones_like(p) + p / 10, params())


PER_PARAMETER = lambda: optcore.MultiOptimizer(
  (r"kernel", optcore.legacy.Adam(1e-2)), (r"bias", optcore.legacy.Momentum(0.1))
)


@pytest.mark.parametrize(
  "make",
  [
    PER_PARAMETER,
    lambda: optcore.MultiOptimizer((r"kernel", optcore.adam(1e-2)), (r"bias", optcore.sgd(0.1))),
    lambda: optcore.adam(1e-2),
    lambda: optcore.legacy.Adam(1e-2),
  ],
  ids=["multi_per_parameter", "multi_optax", "optax", "legacy"],
)
def test_the_optax_state_reads_back_as_the_definitions_own_and_round_trips(make):
  opt_def = make()
  tx = opt_def.as_optax()
  optax_state = tx.init(params())
  for _ in range(2):
    _, optax_state = tx.update(grads(), optax_state, params())
  read = opt_def.from_optax_state(optax_state, 2)
  # The same two steps through the core: the same state, in the same layout.
  core = opt_def.create(params())
  for _ in range(2):
    core = core.apply_gradient(grads())
  assert jax.tree.structure(read.param_states) == jax.tree.structure(core.state.param_states)
  assert int(read.step) == 2
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
    read.param_states,
    core.state.param_states,
  )
  back = opt_def.to_optax_state(read, like=optax_state)
  assert jax.tree.structure(back) == jax.tree.structure(optax_state)
  jax.tree.map(np.testing.assert_array_equal, back, optax_state)


def test_a_per_parameter_layout_written_back_needs_the_like_state():
  opt_def = PER_PARAMETER()
  state = opt_def.from_optax_state(opt_def.as_optax().init(params()), 0)
  assert state.param_states["scale"] is None  # no group: frozen, as init_state has it
  with pytest.raises(TypeError, match="needs like="):
    opt_def.to_optax_state(state)
