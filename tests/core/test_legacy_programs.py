"""What programs of the flax.optim / T5X era hand the core, without Flax installed.

A Flax FrozenDict is a Mapping that is no dict; ``FrozenMapping`` below is one too (a
pytree with its own node type), so the core's rule "a dict and another mapping with the
same keys are one container" is tested here without Flax (tests/flax uses the real one).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

import optcore
from optcore import legacy
from optcore.t5x import Adafactor


class FrozenMapping(Mapping):
  """An immutable mapping registered as its own pytree node, as Flax's FrozenDict is."""

  def __init__(self, items: Mapping[str, Any]):
    self._items = {k: FrozenMapping(v) if isinstance(v, dict) else v for k, v in items.items()}

  def __getitem__(self, key: str) -> Any:
    return self._items[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self._items)

  def __len__(self) -> int:
    return len(self._items)


jax.tree_util.register_pytree_with_keys(
  FrozenMapping,
  lambda m: ([(jax.tree_util.DictKey(k), m[k]) for k in sorted(m)], tuple(sorted(m))),
  lambda keys, children: FrozenMapping(dict(zip(keys, children, strict=True))),
)

PARAMS = {"dense": {"kernel": jnp.ones((4, 2)), "bias": jnp.zeros(2)}}
GRADS = {"dense": {"kernel": jnp.full((4, 2), 0.5), "bias": jnp.ones(2)}}
DEFINITIONS = {
  "adam": lambda: optcore.adam(0.1),
  "legacy-adam": lambda: legacy.Adam(0.1),
  "t5x-adafactor": lambda: Adafactor(0.1),
  "multi": lambda: optcore.MultiOptimizer(
    (r"kernel", legacy.Momentum(0.1)), (r"bias", optcore.sgd(0.1))
  ),
}


@pytest.mark.parametrize("make", list(DEFINITIONS.values()), ids=list(DEFINITIONS))
@pytest.mark.parametrize("frozen", ["params", "grads"])
def test_a_dict_and_another_mapping_with_the_same_keys_are_one_container(make, frozen):
  params = FrozenMapping(PARAMS) if frozen == "params" else PARAMS
  grads = FrozenMapping(GRADS) if frozen == "grads" else GRADS
  step = jax.jit(lambda opt, g: opt.apply_gradient(g))
  expected = step(make().create(PARAMS), GRADS)
  new = step(make().create(params), grads)
  assert type(new.target) is type(params) and type(new.target["dense"]) is type(params["dense"])
  for path in (("dense", "kernel"), ("dense", "bias")):
    got, want = new.target[path[0]][path[1]], expected.target[path[0]][path[1]]
    np.testing.assert_array_equal(got, want)


def test_axes_and_masks_in_another_mapping_meet_dict_params():
  axes = FrozenMapping({"dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")}})
  opt = optcore.adam(0.1).create(PARAMS)
  derived = opt.optimizer_def.derive_logical_axes(opt, axes)
  assert derived.state.param_states[0].mu == {
    "dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")}
  }
  mask = FrozenMapping({"dense": {"kernel": True, "bias": False}})
  multi = optcore.MultiOptimizer((mask, optcore.sgd(1.0))).create(PARAMS).apply_gradient(GRADS)
  np.testing.assert_array_equal(multi.target["dense"]["bias"], PARAMS["dense"]["bias"])
  np.testing.assert_array_equal(multi.target["dense"]["kernel"], 0.5)


def test_mappings_with_other_keys_are_still_a_mismatch_named_by_path():
  grads = FrozenMapping({"dense": {"kernel": jnp.ones((4, 2)), "other": jnp.ones(2)}})
  with pytest.raises(optcore.TreeMismatchError):
    optcore.adam(0.1).create(PARAMS).apply_gradient(grads)


def legacy_state_dict_with(**edits: Any) -> tuple[Any, dict]:
  optimizer = legacy.Adam(0.1).create(PARAMS).apply_gradient(GRADS)
  state_dict = jax.tree.map(np.asarray, optimizer.state_dict())
  for key, value in edits.items():
    state_dict[key] = value
  return optimizer, state_dict


def test_a_legacy_definition_reads_target_and_state_and_leaves_the_rest():
  optimizer, state_dict = legacy_state_dict_with(flax_mutables={"batch_stats": np.ones(3)})
  assert_trees_equal(optimizer.restore_state(state_dict), optimizer)
  with pytest.raises(
    optcore.StateDictError, match=r"the keys \['state', 'target'\], found \['flax"
  ):
    optimizer.restore_state({"flax_mutables": {}, "target": state_dict["target"]})


def test_a_legacy_definition_takes_numpy_64_bit_values_in_its_32_bit_dtypes():
  optimizer, state_dict = legacy_state_dict_with()
  state_dict["state"]["step"] = np.int64(5)
  state_dict["target"] = jax.tree.map(lambda x: np.asarray(x, np.float64), state_dict["target"])
  restored = optimizer.restore_state(state_dict)
  assert restored.state.step == 5 and restored.state.step.dtype == np.int32
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(restored.target))
  # A value int32 cannot hold would wrap: refused, and the optimizer is untouched.
  state_dict["state"]["step"] = np.int64(2**33)
  with pytest.raises(optcore.StateDictError, match=r"'state/step'.*outside its range"):
    optimizer.restore_state(state_dict)
  # Other kinds are never cast: a float where the step is an integer.
  state_dict["state"]["step"] = np.float64(5.0)
  with pytest.raises(optcore.StateDictError, match=r"'state/step'"):
    optimizer.restore_state(state_dict)


def test_a_focus_of_a_legacy_definition_reads_as_the_legacy_definition():
  optimizer = legacy.Momentum(0.1).create(PARAMS, focus=r"kernel")
  state_dict = {**optimizer.state_dict(), "flax_mutables": {}}
  assert_trees_equal(optimizer.restore_state(state_dict), optimizer)
  strict = optcore.MultiOptimizer((r"kernel", optcore.sgd(0.1))).create(PARAMS)
  with pytest.raises(optcore.StateDictError, match="exactly the keys"):
    strict.restore_state({**strict.state_dict(), "flax_mutables": {}})


def test_adafactors_none_overrides_match_adafactor_built_with_none():
  params = {"w": jnp.linspace(-2.0, 2.0, 12).reshape(3, 4)}
  grads = {"w": jnp.linspace(5.0, -5.0, 12).reshape(3, 4)}
  for cls in (legacy.Adafactor, Adafactor):
    built = cls(0.1, clipping_threshold=None).create(params).apply_gradient(grads)
    overridden = cls(0.1).create(params).apply_gradient(grads, clipping_threshold=None)
    assert_trees_equal(overridden.target, built.target)
  with pytest.raises(ValueError, match="decay_rate=None"):
    Adafactor(0.1).create(params).apply_gradient(grads, decay_rate=None)


def test_t5x_weight_decay_with_an_lr_exponent_treats_a_zero_rate_as_one():
  # T5X: weight_decay_rate = (weight_decay_rate or 1.0) * lr ** exponent.
  params = {"w": jnp.linspace(-2.0, 2.0, 12).reshape(3, 4)}
  grads = {"w": jnp.zeros((3, 4))}
  for rate in (0.0, None, 1.0):
    opt = Adafactor(0.1, weight_decay_rate=rate, weight_decay_rate_lr_exponent=1.0)
    new = opt.create(params).apply_gradient(grads)
    np.testing.assert_allclose(new.target["w"], 0.9 * params["w"], rtol=1e-6)
