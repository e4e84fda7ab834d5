"""The core's state dicts against Flax's own serialization."""

from __future__ import annotations

import flax
import flax.serialization
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax

import optcore
import optcore_flax


def test_adapter_imports_with_the_core_version():
  assert optcore_flax.__version__ == optcore.__version__


def params():
  return flax.core.freeze(
    {"params": {"Dense_0": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}}}
  )


def t5x_state_dict(target, state):
  """What T5X's OptaxWrapper.state_dict writes, built from Flax's own tools."""
  state_dict = flax.serialization.to_state_dict(
    {"step": state.step, "param_states": state.param_states}
  )
  flat = flax.traverse_util.flatten_dict(state_dict, keep_empty_nodes=True)
  flat = {k: v for k, v in flat.items() if v is not flax.traverse_util.empty_node}
  state_dict = flax.traverse_util.unflatten_dict(flat)
  return {"target": flax.serialization.to_state_dict(target), "state": state_dict}


def assert_same_nested(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_state_dict_matches_flax_serialization_and_t5x():
  for opt_def in (
    optcore.adam(1e-3),
    optcore.sgd(0.1, momentum=0.9),
    optcore.adafactor(1e-2),
    optcore.chain([optax.clip_by_global_norm(1.0), optcore.lion(1e-3)]),
  ):
    opt = opt_def.create(params())
    opt = opt.apply_gradient(jax.tree.map(jnp.ones_like, opt.target))
    assert_same_nested(opt.state_dict(), t5x_state_dict(opt.target, opt.state))


def test_msgpack_round_trip_through_flax_is_bitwise():
  opt = optcore.adamw(1e-3, mu_dtype=jnp.bfloat16).create(params())
  opt = opt.apply_gradient(jax.tree.map(jnp.ones_like, opt.target))
  data = flax.serialization.msgpack_serialize(opt.state_dict())
  restored = (
    optcore.adamw(1e-3, mu_dtype=jnp.bfloat16)
    .create(params())
    .restore_state(flax.serialization.msgpack_restore(data))
  )
  assert isinstance(restored.target, flax.core.FrozenDict)
  assert_same_nested(restored.state, opt.state)
  assert_same_nested(restored.target, opt.target)


def test_traversal_on_a_frozendict_keeps_flax_paths_and_type():
  traversal = optcore.ModelParamTraversal(lambda path, _: path == "/params/Dense_0/kernel")
  assert [x.shape for x in traversal.iterate(params())] == [(2, 3)]
  updated = traversal.update(lambda x: 0 * x, params())
  assert isinstance(updated, flax.core.FrozenDict)
  assert not updated["params"]["Dense_0"]["kernel"].any()
  assert optcore.selector_mask(r"/bias$", params()) == flax.core.freeze(
    {"params": {"Dense_0": {"kernel": False, "bias": True}}}
  )
