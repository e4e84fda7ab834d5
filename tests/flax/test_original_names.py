"""Every public name of the originals' modules is in its face.

The lists are data taken from the originals' source: flax.optim at v0.5.3 (every submodule),
T5X's ``t5x/optimizers.py`` and ``t5x/adafactor.py`` at T5X's head. A public name is one a
module defines or re-exports as its API; what a module only imports for its own use (``jax``,
``jnp``, ``np``/``onp``, ``lax``, ``struct``, ``functools``, typing's names, ``logging``,
``utils``) is not, and the exceptions below say which names are left out, and why.
"""

from __future__ import annotations

import importlib

import pytest

import optcore
import optcore_flax

# flax.optim v0.5.3: flax/optim/__init__.py's __all__ and its submodules.
FLAX_OPTIM = {
  "": (
    "Adam Adadelta Adafactor Adagrad OptimizerState OptimizerDef Optimizer MultiOptimizer "
    "ModelParamTraversal DynamicScale LAMB LARS Momentum RMSProp GradientDescent WeightNorm "
    # the submodules, reachable as attributes once imported
    "adabelief adadelta adafactor adagrad adam base dynamic_scale lamb lars momentum rmsprop "
    "sgd weight_norm"
  ),
  "base": (
    "OptimizerState OptimizerDef Optimizer ReplicatedOptimizer MultiOptimizer ModelParamTraversal"
  ),
  "adabelief": "AdaBelief _AdaBeliefHyperParams _AdaBeliefParamState",
  "adadelta": "Adadelta _AdadeltaHyperParams _AdadeltaParamState",
  "adafactor": "Adafactor _AdafactorHyperParams _AdafactorParamState",
  "adagrad": "Adagrad _AdagradHyperParams _AdagradParamState",
  "adam": "Adam _AdamHyperParams _AdamParamState",
  "dynamic_scale": "DynamicScale DynamicScaleResult",
  "lamb": "LAMB _LAMBHyperParams _LAMBParamState",
  "lars": "LARS _LARSHyperParams _LARSParamState",
  "momentum": "Momentum _MomentumHyperParams _MomentumParamState",
  "rmsprop": "RMSProp _RMSPropHyperParams _RMSPropParamState",
  "sgd": "GradientDescent _GradientDescentHyperParams",
  "weight_norm": "WeightNorm _WeightNormHyperParams _WeightNormParamState",
}
# Left out of flax.optim, and why:
# - base's private helpers (_NoAux, _ShapeDtype, _get_params_dict, _sorted_items): no program
#   of that era imports them;
# - each algorithm module's ``OptimizerDef`` (imported from .base for its own class statement):
#   ``flax.optim.OptimizerDef`` and ``flax.optim.base.OptimizerDef`` are the names programs use.
FLAX_OPTIM_LEFT_OUT = {"base": "_NoAux _ShapeDtype _get_params_dict _sorted_items"}

# t5x/optimizers.py: the definitions, the transitional type names train_state.py annotates
# with, the wrapped factories, and the helpers it defines at module level.
T5X_OPTIMIZERS = (
  "OptimizerState OptimizerDef Optimizer OptimizerType OptimizerStateType OptimizerDefType "
  "OptaxStatePartitionRules OptaxWrapper wrap_optax_optimizer chain MultiOptimizer "
  "adabelief adagrad adam adamw amos fromage lars lamb lion noisy_sgd radam rmsprop sgd yogi "
  "dpsgd freeze unfreeze Dtype"
)
# Left out of t5x.optimizers, and why: the modules it imports (flax, serialization, struct,
# traverse_util, frozen_dict, jax, jnp, optax, functools, amos_helper) and flax's
# from_state_dict / to_state_dict, which it imports for its own methods; its private
# _OptaxWrapperHyperParams, _Marker, _tree_of_paths, _subtree_from_traversal,
# _update_subtree_of_traversal (MultiOptimizer's internals, which optcore does by selector).
T5X_OPTIMIZERS_LEFT_OUT = (
  "_OptaxWrapperHyperParams _Marker _tree_of_paths _subtree_from_traversal "
  "_update_subtree_of_traversal"
)

# t5x/adafactor.py.
T5X_ADAFACTOR = (
  "Dtype FactorDim HeuristicRule HEURISTIC_RULE FactorRule standard_logical_factor_rules "
  "factor_name_to_factordim HParamMap _AdafactorHyperParams _AdafactorParamState Adafactor"
)
# Left out of t5x.adafactor: what it imports (enum, re, logging, struct, freeze, FrozenDict,
# unfreeze, flax.optim's OptimizerDef and OptimizerState, from_state_dict, to_state_dict,
# flatten_dict, unflatten_dict, jax, jnp, np, t5x.utils) and its private _restore, _insert.
T5X_ADAFACTOR_LEFT_OUT = "_restore _insert"


@pytest.mark.parametrize("submodule", sorted(FLAX_OPTIM))
def test_every_flax_optim_name_is_in_the_face(submodule):
  module = importlib.import_module("optcore_flax.optim" + (f".{submodule}" if submodule else ""))
  missing = [n for n in FLAX_OPTIM[submodule].split() if not hasattr(module, n)]
  assert not missing, f"flax.optim{'.' + submodule if submodule else ''} lacks {missing}"


def test_every_flax_optim_submodule_is_served_by_the_legacy_namespace():
  optcore_flax.install_legacy_namespace()
  for submodule in FLAX_OPTIM:
    if submodule:
      module = importlib.import_module(f"flax.optim.{submodule}")
      assert module is getattr(optcore_flax.optim, submodule)


def test_every_t5x_optimizers_name_is_in_the_face():
  missing = [n for n in T5X_OPTIMIZERS.split() if not hasattr(optcore_flax.optimizers, n)]
  assert not missing, f"t5x.optimizers names missing: {missing}"


def test_every_t5x_adafactor_name_is_in_the_face():
  missing = [n for n in T5X_ADAFACTOR.split() if not hasattr(optcore_flax.adafactor, n)]
  assert not missing, f"t5x.adafactor names missing: {missing}"


def test_the_left_out_names_are_not_lists_of_names_the_faces_have():
  # An exception that the face does have belongs in the lists above, not here.
  face = {
    "t5x.optimizers": (optcore_flax.optimizers, T5X_OPTIMIZERS_LEFT_OUT),
    "t5x.adafactor": (optcore_flax.adafactor, T5X_ADAFACTOR_LEFT_OUT),
    "flax.optim.base": (optcore_flax.optim.base, FLAX_OPTIM_LEFT_OUT["base"]),
  }
  for original, (module, names) in face.items():
    present = [n for n in names.split() if hasattr(module, n)]
    assert not present, f"{original}: {present} are in the face; list them as names"


def test_t5x_type_names_are_the_types_train_state_annotates_with():
  optimizers = optcore_flax.optimizers
  assert optimizers.OptimizerType is optimizers.Optimizer is optcore.Optimizer
  assert optimizers.OptimizerDefType is optimizers.OptimizerDef
  assert optcore.OptimizerState in optimizers.OptimizerStateType.__args__
  assert optimizers.freeze({"a": 1})["a"] == 1 and type(optimizers.unfreeze({"a": 1})) is dict


def test_t5x_heuristic_rule_is_t5xs_enum_member_and_its_rules_parse():
  adafactor = optcore_flax.adafactor
  assert isinstance(adafactor.HEURISTIC_RULE, adafactor.HeuristicRule)
  assert list(adafactor.HeuristicRule) == [adafactor.HEURISTIC_RULE]
  assert adafactor.FactorDim.NONE.value is None and adafactor.FactorDim.BATCH.value == 1


def test_t5x_hparam_map_called_on_params_maps_each_leaf_by_its_path():
  scale = optcore_flax.adafactor.HParamMap([("embedding", False), (".*", True)])
  params = {"decoder": {"embedding": 0.0, "layers": [{"kernel": 0.0}]}}
  assert scale(params) == {"decoder": {"embedding": False, "layers": [{"kernel": True}]}}
  with pytest.raises(KeyError, match="decoder/x"):
    optcore_flax.adafactor.HParamMap([("embedding", 1)])({"decoder": {"x": 0.0}})


def test_amos_is_there_and_says_why_it_cannot_run_without_a_working_jestimator():
  try:
    import jestimator.amos  # noqa: F401
  except ImportError:
    pass
  else:  # pragma: no cover - jestimator 0.3.3 does not import on today's JAX
    pytest.skip("jestimator imports here: amos is a wrapped factory, as in T5X")
  with pytest.raises(ImportError, match=r"jestimator.*optimizers\.adafactor"):
    optcore_flax.optimizers.amos(0.01, eta_fn=lambda name, shape: 1.0)
