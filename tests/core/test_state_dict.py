"""State dicts in Flax's layout, and restores that check before they build."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tree_testing import Linear

import optcore


def params():
  return {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}, "layers": [jnp.ones(2)]}


def trained_adam():
  opt = optcore.adam(1e-2).create(params())
  grads = jax.tree.map(jnp.ones_like, opt.target)
  return opt.apply_gradient(grads).apply_gradient(grads)


def test_layout_is_flax_and_t5x():
  sd = trained_adam().state_dict()
  assert sd["target"]["dense"]["kernel"].shape == (2, 3)
  assert sd["target"]["layers"]["0"].shape == (2,)  # lists become '0', '1', ...
  assert sd["state"]["step"].dtype == jnp.int32 and int(sd["state"]["step"]) == 2
  # optax.adam is chain(scale_by_adam, scale_by_learning_rate): a 2-tuple whose
  # second member is EmptyState, which T5X leaves out of the state dict.
  adam_state = sd["state"]["param_states"]
  assert list(adam_state) == ["0"]
  assert set(adam_state["0"]) == {"count", "mu", "nu"}
  assert adam_state["0"]["mu"]["layers"]["0"].shape == (2,)
  assert int(adam_state["0"]["count"]) == 2


def test_to_state_dict_of_containers():
  tree = (optax.EmptyState(), {"w": 1.0, "v": [None, 2.0]}, optax.ScaleByScheduleState(count=5))
  assert optcore.to_state_dict(tree) == {
    "0": {},
    "1": {"w": 1.0, "v": {"0": None, "1": 2.0}},
    "2": {"count": 5},
  }
  assert optcore.to_state_dict({3: 1.0, 4: (2.0,)}) == {"3": 1.0, "4": {"0": 2.0}}


def test_attribute_pytrees_use_attribute_names():
  opt = optcore.sgd(0.1, momentum=0.9).create(Linear(jnp.ones((2, 2)), jnp.zeros(2)))
  sd = opt.state_dict()
  assert set(sd["target"]) == {"weight", "bias"}
  assert set(sd["state"]["param_states"]["0"]["trace"]) == {"weight", "bias"}
  restored = opt.restore_state(sd)
  assert isinstance(restored.target, Linear)


def test_empty_states_are_re_inserted_on_restore():
  opt = trained_adam()
  restored = optcore.adam(1e-2).create(params()).restore_state(opt.state_dict())
  assert isinstance(restored.state.param_states[1], optax.EmptyState)
  # A state dict that still carries the empty dict (flax.optim writes them) loads too.
  sd = opt.state_dict()
  sd["state"]["param_states"]["1"] = {}
  assert isinstance(opt.restore_state(sd).state.param_states[1], optax.EmptyState)


def test_python_scalars_take_the_reference_dtype():
  opt = trained_adam()
  sd = opt.state_dict()
  sd["state"]["step"] = 7
  restored = opt.restore_state(sd)
  assert restored.state.step.dtype == jnp.int32 and int(restored.state.step) == 7


def _corrupt(path, fn):
  sd = trained_adam().state_dict()
  node = sd
  for key in path[:-1]:
    node = node[key]
  fn(node, path[-1])
  return sd


@pytest.mark.parametrize(
  ("path", "corruption", "message"),
  [
    (
      ("state", "param_states", "0", "mu", "dense", "kernel"),
      lambda n, k: n.pop(k),
      r"at 'state/param_states/0/mu/dense/kernel': missing from the state dict; expected an "
      r"array of shape \(2, 3\) and dtype float32",
    ),
    (
      ("state", "param_states", "0", "nu", "dense", "extra"),
      lambda n, k: n.update({k: 1.0}),
      r"at 'state/param_states/0/nu/dense': unexpected keys \['extra'\]",
    ),
    (
      ("target", "dense", "bias"),
      lambda n, k: n.update({k: np.zeros(4, np.float32)}),
      r"at 'target/dense/bias': expected an array of shape \(3,\) and dtype float32, found an "
      r"array of shape \(4,\) and dtype float32",
    ),
    (
      ("state", "param_states", "0", "count"),
      lambda n, k: n.update({k: np.int64(2)}),
      r"at 'state/param_states/0/count': expected an array of shape \(\) and dtype int32, found "
      r"an array of shape \(\) and dtype int64\. Cast",
    ),
    (
      ("target", "dense"),
      lambda n, k: n.update({k: np.zeros(3)}),
      r"at 'target/dense': expected a dict with keys \['bias', 'kernel'\]",
    ),
    (
      ("target", "layers", "0"),
      lambda n, k: n.update({k: {"w": 1.0}}),
      r"at 'target/layers/0': expected an array of shape \(2,\) and dtype float32, found a dict",
    ),
  ],
)
def test_bad_state_dicts_name_the_path_and_change_nothing(path, corruption, message):
  opt = trained_adam()
  before = jax.tree.map(np.asarray, opt.state_dict())
  with pytest.raises(optcore.StateDictError, match=message):
    opt.restore_state(_corrupt(path, corruption))
  after = jax.tree.map(np.asarray, opt.state_dict())
  assert jax.tree.structure(before) == jax.tree.structure(after)
  for b, a in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
    np.testing.assert_array_equal(a, b)


def test_a_state_dict_needs_target_and_state():
  with pytest.raises(
    optcore.StateDictError, match=r"exactly the keys \['state', 'target'\], found \['target'\]"
  ):
    trained_adam().restore_state({"target": {}})


def test_restore_from_another_optimizer_names_the_first_difference():
  adam_sd = trained_adam().state_dict()
  sgd = optcore.sgd(0.1, momentum=0.9).create(params())
  with pytest.raises(
    optcore.StateDictError,
    match=r"at 'state/param_states/0': unexpected keys \['count', 'mu', 'nu'\]",
  ):
    sgd.restore_state(adam_sd)


def test_bfloat16_state_round_trips_with_its_dtype():
  opt = optcore.adam(1e-2, mu_dtype=jnp.bfloat16).create(params())
  opt = opt.apply_gradient(jax.tree.map(jnp.ones_like, opt.target))
  restored = (
    optcore.adam(1e-2, mu_dtype=jnp.bfloat16).create(params()).restore_state(opt.state_dict())
  )
  assert restored.state.param_states[0].mu["dense"]["kernel"].dtype == jnp.bfloat16
  np.testing.assert_array_equal(
    np.asarray(restored.state.param_states[0].mu["dense"]["kernel"], np.float32),
    np.asarray(opt.state.param_states[0].mu["dense"]["kernel"], np.float32),
  )
