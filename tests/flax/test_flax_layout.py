"""The core's state dicts against Flax's own serialization."""

from __future__ import annotations

import flax
import flax.serialization
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tree_testing import assert_trees_equal

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


def test_state_dict_matches_flax_serialization_and_t5x():
  for opt_def in (
    optcore.adam(1e-3),
    optcore.sgd(0.1, momentum=0.9),
    optcore.adafactor(1e-2),
    optcore.chain([optax.clip_by_global_norm(1.0), optcore.lion(1e-3)]),
  ):
    opt = opt_def.create(params())
    opt = opt.apply_gradient(jax.tree.map(jnp.ones_like, opt.target))
    assert_trees_equal(opt.state_dict(), t5x_state_dict(opt.target, opt.state))


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
  assert_trees_equal(restored.state, opt.state)
  assert_trees_equal(restored.target, opt.target)


def test_traversal_on_a_frozendict_keeps_flax_paths_and_type():
  traversal = optcore.ModelParamTraversal(lambda path, _: path == "/params/Dense_0/kernel")
  assert [x.shape for x in traversal.iterate(params())] == [(2, 3)]
  updated = traversal.update(lambda x: 0 * x, params())
  assert isinstance(updated, flax.core.FrozenDict)
  assert not updated["params"]["Dense_0"]["kernel"].any()
  assert optcore.selector_mask(r"/bias$", params()) == flax.core.freeze(
    {"params": {"Dense_0": {"kernel": False, "bias": True}}}
  )


def _two_groups():
  # Anchored: with optcore_flax imported, an nnx Param reads /kernel, not /kernel/value.
  return optcore.MultiOptimizer((r"/kernel$", optcore.adam(1e-2)), (r"/bias$", optcore.sgd(0.1)))


def _partition(_=None):
  # Labels from whatever tree arrives: nnx gives Variables at init, arrays at update.
  labels = lambda params: jax.tree_util.tree_map_with_path(
    lambda path, _: "k" if "kernel" in jax.tree_util.keystr(path) else "b", params
  )
  return optax.partition({"k": optax.adam(1e-2), "b": optax.sgd(0.1)}, labels)


def test_as_optax_in_a_linen_train_state_equals_optax_partition():
  from flax import linen as nn
  from flax.training import train_state

  model = nn.Dense(3)
  x = jnp.linspace(-1.0, 1.0, 8).reshape(4, 2)
  variables = model.init(jax.random.key(0), x)
  loss = lambda p: jnp.sum(model.apply(p, x) ** 2)

  def train(tx):
    state = train_state.TrainState.create(apply_fn=model.apply, params=variables, tx=tx)
    for _ in range(4):
      state = state.apply_gradients(grads=jax.grad(loss)(state.params))
    return state.params

  ours, reference = train(_two_groups().as_optax()), train(_partition(variables))
  assert_trees_equal(ours, reference)


def test_as_optax_in_an_nnx_optimizer_equals_optax_partition():
  from flax import nnx

  x = jnp.linspace(-1.0, 1.0, 8).reshape(4, 2)

  def train(make_tx):
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, make_tx(), wrt=nnx.Param)
    for _ in range(4):
      grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model)
      optimizer.update(model, grads)
    return nnx.state(model, nnx.Param)

  ours = train(lambda: _two_groups().as_optax())
  reference = train(_partition)
  assert_trees_equal(jax.tree.leaves(ours), jax.tree.leaves(reference))


def test_nnx_variables_read_like_plain_arrays():
  from flax import nnx

  state = nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), nnx.Param)
  seen = []
  optcore.ModelParamTraversal(lambda path, _: seen.append(path) or True).mask(state)
  assert seen == ["/bias", "/kernel"]
  sd = optcore.to_state_dict(state)
  assert set(sd) == {"bias", "kernel"} and sd["kernel"].shape == (2, 3)
  restored = optcore.from_state_dict(
    state, {"bias": np.ones(3, np.float32), "kernel": sd["kernel"]}
  )
  assert isinstance(restored["bias"], nnx.Param)
  np.testing.assert_array_equal(restored["bias"][...], np.ones(3))


def test_a_none_gradient_in_an_nnx_state_names_the_canonical_path():
  from flax import nnx

  params = nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), nnx.Param)
  opt = optcore.sgd(0.1).create(params)
  grads = jax.tree.map(jnp.ones_like, params)
  grads["kernel"] = nnx.Param(None)
  with pytest.raises(optcore.TreeMismatchError, match=r"None at '/kernel'[^/]"):
    opt.apply_gradient(grads)
