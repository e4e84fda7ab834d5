"""What T5X's ``t5x/train_state.py`` does with the optimizer, on the T5X face.

T5X's ``FlaxOptimTrainState`` holds a ``t5x.optimizers.Optimizer``: it splits frozen model
variables into params, ``params_axes`` and Flax mutables, hands the axis names (a FrozenDict
of PartitionSpecs from ``flax.linen.partitioning.get_axis_names``) to ``set_param_axes``,
writes ``state_dict()`` plus ``'flax_mutables'``, passes that whole dict back to
``restore_state``, and replaces the step by editing ``state_dict['state']['step']``. The
``TrainState`` below makes those calls as T5X's module makes them (written here, not copied),
and the tests compare with what T5X's own ``train_state_test.py`` expects.
"""

from __future__ import annotations

from typing import Any

import flax
import flax.core
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.linen import partitioning as flax_partitioning
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

from optcore_flax import adafactor, optimizers

AxisMetadata = flax_partitioning.AxisMetadata
FactorDim = adafactor.FactorDim
RULES = {"vocab": FactorDim.COLUMN, "embed": FactorDim.ROW}


class TrainState(flax.struct.PyTreeNode):
  """The optimizer calls of T5X's FlaxOptimTrainState, in its order."""

  optimizer: optimizers.OptimizerType
  params_axes: Any = None
  flax_mutables: Any = flax.core.freeze({})

  @classmethod
  def create(cls, optimizer_def: optimizers.OptimizerDefType, variables: Any) -> TrainState:
    others, params = flax.core.frozen_dict.pop(variables, "params")
    params_axes = None
    if "params_axes" in others:
      others, params_axes = flax.core.frozen_dict.pop(others, "params_axes")
    if hasattr(optimizer_def, "set_param_axes"):
      optimizer_def.set_param_axes(flax_partitioning.get_axis_names(params_axes))
    return cls(optimizer_def.create(params), params_axes, flax.core.freeze(others))

  def state_dict(self) -> dict:
    state_dict = self.optimizer.state_dict()
    if self.flax_mutables:
      state_dict["flax_mutables"] = flax.core.unfreeze(self.flax_mutables)
    return state_dict

  def restore_state(self, state_dict: dict) -> TrainState:
    mutables = flax.core.freeze(state_dict.get("flax_mutables", {}))
    return self.replace(optimizer=self.optimizer.restore_state(state_dict), flax_mutables=mutables)

  def replace_step(self, step: Any) -> TrainState:
    state_dict = self.state_dict()
    state_dict["state"]["step"] = step
    return self.restore_state(state_dict)

  def replace_params(self, params: Any) -> TrainState:
    return self.replace(optimizer=self.optimizer.replace(target=params))

  def apply_gradient(self, grads: Any, learning_rate: Any) -> TrainState:
    return self.replace(optimizer=self.optimizer.apply_gradient(grads, learning_rate=learning_rate))

  def as_logical_axes(self) -> Any:
    names = flax_partitioning.get_axis_names(self.params_axes)
    return self.optimizer.optimizer_def.derive_logical_axes(self.optimizer, names)


def variables(**extra: Any) -> Any:
  return flax.core.freeze(
    {
      "params": {"dense": {"bias": np.zeros(4), "kernel": np.zeros((2, 4))}},
      "params_axes": {
        "dense": {
          "bias_axes": AxisMetadata(names=("embed",)),
          "kernel_axes": AxisMetadata(names=("vocab", "embed")),
        }
      },
      **extra,
    }
  )


def test_set_param_axes_stores_t5xs_plain_dict_of_flat_names():
  opt_def = adafactor.Adafactor(0.42, logical_factor_rules=RULES)
  state = TrainState.create(opt_def, variables())
  factor_map = state.optimizer.optimizer_def.hyper_params.factor_map
  assert type(factor_map) is dict
  # T5X: a parameter without both ROW and COLUMN is not factored (NONE), the rest as mapped.
  assert factor_map == {
    "dense/bias": (FactorDim.NONE,),
    "dense/kernel": (FactorDim.COLUMN, FactorDim.ROW),
  }
  assert state.optimizer.optimizer_def is opt_def


def test_a_t5x_multi_optimizer_hands_each_adafactor_only_its_own_names():
  with pytest.warns(DeprecationWarning):  # today's Flax deprecates the traversals T5X used
    kernels = flax.traverse_util.ModelParamTraversal(lambda path, _: "kernel" in path)
    biases = flax.traverse_util.ModelParamTraversal(lambda path, _: "bias" in path)
  first = adafactor.Adafactor(0.1, logical_factor_rules=RULES)
  second = adafactor.Adafactor(0.2, logical_factor_rules=RULES)
  opt_def = optimizers.MultiOptimizer([(kernels, first), (biases, second)])
  TrainState.create(opt_def, variables())
  assert first.hyper_params.factor_map == {"dense/kernel": (FactorDim.COLUMN, FactorDim.ROW)}
  assert second.hyper_params.factor_map == {"dense/bias": (FactorDim.NONE,)}


def test_the_state_dict_with_flax_mutables_round_trips_through_restore_state():
  opt_def = adafactor.Adafactor(0.42, logical_factor_rules=RULES)
  state = TrainState.create(opt_def, variables(mutables=np.ones(3)))
  written = state.state_dict()
  assert sorted(written) == ["flax_mutables", "state", "target"]
  assert sorted(written["state"]["param_states"]["dense"]["kernel"]) == ["m", "v", "v_col", "v_row"]
  edited = jax.tree.map(np.asarray, written)
  edited["state"]["param_states"]["dense"]["kernel"]["v"] = np.ones((2, 4), np.float32)
  edited["flax_mutables"] = {"mutables": np.zeros(3)}
  restored = state.restore_state(edited)
  np.testing.assert_array_equal(restored.optimizer.state.param_states["dense"]["kernel"].v, 1.0)
  np.testing.assert_array_equal(restored.flax_mutables["mutables"], np.zeros(3))
  # The optimizer it came from is untouched.
  np.testing.assert_array_equal(state.optimizer.state.param_states["dense"]["kernel"].v, 0.0)


def test_a_checkpoint_of_numpy_64_bit_values_restores_as_t5xs_restore_state_takes_it():
  # T5X's own test restores np.array(1) (int64) as the step and np.ones (float64) as state.
  state = TrainState.create(adafactor.Adafactor(0.42, logical_factor_rules=RULES), variables())
  kernel_state = {"m": np.ones(1), "v": np.ones((2, 4)), "v_col": np.ones(1), "v_row": np.ones(1)}
  bias_state = {"m": np.ones(1), "v": np.ones(4), "v_col": np.ones(1), "v_row": np.ones(1)}
  restored = state.restore_state(
    {
      "state": {
        "step": np.array(1),
        "param_states": {"dense": {"kernel": kernel_state, "bias": bias_state}},
      },
      "target": {"dense": {"kernel": np.ones((2, 4)), "bias": np.ones(4)}},
      "flax_mutables": {"mutables": np.zeros(3)},
    }
  )
  assert restored.optimizer.state.step == 1 and restored.optimizer.state.step.dtype == np.int32
  v = restored.optimizer.state.param_states["dense"]["kernel"].v
  assert v.dtype == np.float32 and np.all(v == 1.0)
  expected = adafactor._AdafactorParamState(np.ones(1), np.ones(1), np.ones((2, 4)), np.ones(1))
  assert_trees_equal(
    jax.tree.map(np.float32, restored.optimizer.state.param_states["dense"]["kernel"]),
    jax.tree.map(np.float32, expected),
  )
  # Training goes on from there, jitted, with the restored step.
  grads = jax.tree.map(jnp.ones_like, restored.optimizer.target)
  stepped = jax.jit(TrainState.apply_gradient)(restored, grads, 0.1)
  assert int(stepped.optimizer.state.step) == 2


def test_an_int64_step_that_int32_cannot_hold_is_refused_naming_the_path():
  state = TrainState(optimizers.adam(0.1).create({"test": np.ones(10)}))
  with pytest.raises(Exception, match=r"state/step.*range"):
    state.replace_step(np.array(2**40))


def test_replace_step_and_replace_params_as_t5x_makes_them():
  state = TrainState(optimizers.adam(0.1).create({"test": np.ones(10)}))
  assert state.replace_step(jnp.array(1)).optimizer.state.step == 1
  assert state.replace_step(np.array(3)).optimizer.state.step == 3
  new = state.replace_params({"test": np.zeros(10)})
  expected = state.state_dict()
  expected["target"] = {"test": np.zeros(10)}
  assert_trees_equal(jax.tree.map(np.asarray, new.state_dict()), jax.tree.map(np.asarray, expected))


def test_as_logical_axes_from_frozen_axis_names_keeps_the_frozen_params():
  state = TrainState.create(adafactor.Adafactor(0.42, logical_factor_rules=RULES), variables())
  axes = state.as_logical_axes()
  assert isinstance(axes.target, flax.core.FrozenDict)
  assert axes.target["dense"]["kernel"] == P("vocab", "embed")
  assert axes.target["dense"]["bias"] == P("embed")
  assert axes.state.step is None


def test_the_core_face_stays_strict_about_extra_keys_and_64_bit_values():
  import optcore

  optimizer = optcore.adam(0.1).create({"test": np.ones(10, np.float32)})
  state_dict = optimizer.state_dict()
  with pytest.raises(optcore.StateDictError, match=r"exactly the keys.*flax_mutables"):
    optimizer.restore_state({**state_dict, "flax_mutables": {}})
  state_dict["state"]["step"] = np.array(1)
  with pytest.raises(optcore.StateDictError, match=r"int64"):
    optimizer.restore_state(state_dict)


def test_one_t5x_adafactor_in_two_groups_keeps_each_groups_factor_map():
  params = {"enc": {"w": np.ones((2, 4, 3))}, "dec": {"w": np.ones((2, 3, 4))}}
  axes = {"enc": {"w": P("layers", "embed", "mlp")}, "dec": {"w": P("layers", "mlp", "embed")}}
  shared = adafactor.Adafactor(0.1, logical_factor_rules=RULES | {"mlp": FactorDim.COLUMN})
  opt_def = optimizers.MultiOptimizer([("enc", shared), ("dec", shared)])
  opt_def.set_param_axes(axes)
  enc, dec = opt_def.sub_optimizers
  assert enc is shared and dec is not shared  # the second group keeps its own copy
  assert enc.hyper_params.factor_map == {
    "enc/w": (FactorDim.BATCH, FactorDim.ROW, FactorDim.COLUMN)
  }
  assert dec.hyper_params.factor_map == {
    "dec/w": (FactorDim.BATCH, FactorDim.COLUMN, FactorDim.ROW)
  }
  state = opt_def.create(params).state.param_states
  assert state["enc"]["w"].v_row.shape == (2, 4) and state["dec"]["w"].v_row.shape == (2, 4)
  assert state["enc"]["w"].v_col.shape == (2, 3) and state["dec"]["w"].v_col.shape == (2, 3)


def test_flax_optims_dynamic_scale_with_has_aux_on_a_scalar_function_says_so():
  from optcore_flax import optim

  grad_fn = optim.DynamicScale().value_and_grad(lambda p: jnp.sum(p**2), has_aux=True)
  with pytest.raises(TypeError, match=r"requires fun to return a pair \(loss, aux\)"):
    jax.jit(grad_fn)(jnp.ones(2))


def test_t5xs_initializer_traces_the_train_state_twice_with_one_definition():
  # T5X's TrainStateInitializer: eval_shape of the whole creation for the axes, then the
  # partitioned creation itself, both calling set_param_axes on the same definition.
  opt_def = adafactor.Adafactor(0.42, logical_factor_rules=RULES)
  shapes = jax.eval_shape(lambda: TrainState.create(opt_def, variables()))
  state = TrainState.create(opt_def, variables())
  assert jax.tree.map(np.shape, state.optimizer.state) == jax.tree.map(
    np.shape, shapes.optimizer.state
  )
  # Other axes after the state exists would change the definition under it: still refused.
  other = {"dense": {"bias": P("embed"), "kernel": P("embed", "vocab")}}
  with pytest.raises(RuntimeError, match="already made an optimizer state"):
    opt_def.set_param_axes(other)
