"""Every example in optcore's docstrings runs and prints what it says."""

from __future__ import annotations

import pytest
from doctests import failures_in, missing_sections, modules_of

import optcore


@pytest.mark.parametrize("module", modules_of(optcore), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
  failures = failures_in(module, optcore)
  assert failures == 0, f"{failures} docstring example(s) failed in {module.__name__}"


# The entry points a user calls first, with whether each raises on bad input (issue 30).
ENTRY_POINTS = {
  "OptimizerDef.create": (optcore.OptimizerDef.create, True),
  "OptimizerDef.init_state": (optcore.OptimizerDef.init_state, True),
  "OptimizerDef.apply_gradient": (optcore.OptimizerDef.apply_gradient, True),
  "OptimizerDef.update_hyper_params": (optcore.OptimizerDef.update_hyper_params, True),
  "OptimizerDef.state_dict": (optcore.OptimizerDef.state_dict, False),
  "OptimizerDef.restore_state": (optcore.OptimizerDef.restore_state, True),
  "OptimizerDef.create_sharded": (optcore.OptimizerDef.create_sharded, True),
  "OptimizerDef.derive_shardings": (optcore.OptimizerDef.derive_shardings, True),
  "OptimizerDef.as_optax": (optcore.OptimizerDef.as_optax, True),
  "Optimizer.apply_gradient": (optcore.Optimizer.apply_gradient, True),
  "Optimizer.compute_gradient": (optcore.Optimizer.compute_gradient, False),
  "Optimizer.state_dict": (optcore.Optimizer.state_dict, False),
  "Optimizer.restore_state": (optcore.Optimizer.restore_state, True),
  "Optimizer.transplant": (optcore.Optimizer.transplant, True),
  "transplant": (optcore.transplant, True),
  "adapter.step": (optcore.adapter.step, True),
  "adapter.state_dict": (optcore.adapter.state_dict, False),
  "adapter.restore_state": (optcore.adapter.restore_state, True),
  "adapter.transplant_state": (optcore.adapter.transplant_state, True),
  "config.from_config": (optcore.config.from_config, True),
  "config.to_config": (optcore.config.to_config, True),
  "accumulate": (optcore.accumulate, True),
  "mixed_precision": (optcore.mixed_precision, True),
  "ema": (optcore.ema, True),
  "chain": (optcore.chain, True),
  "check_gradients": (optcore.check_gradients, True),
  "to_state_dict": (optcore.to_state_dict, False),
  "from_state_dict": (optcore.from_state_dict, True),
  "leaves_with_paths": (optcore.leaves_with_paths, False),
  "selector_mask": (optcore.selector_mask, True),
  "register_selector_type": (optcore.register_selector_type, True),
  "register_hidden_level": (optcore.register_hidden_level, True),
  "register_state_rule": (optcore.register_state_rule, True),
  "derive_optax_logical_axes": (optcore.derive_optax_logical_axes, True),
  "logical_to_mesh_axes": (optcore.logical_to_mesh_axes, True),
  "logical_to_mesh": (optcore.logical_to_mesh, True),
  "logical_to_mesh_sharding": (optcore.logical_to_mesh_sharding, True),
  "wrap_optax_optimizer": (optcore.wrap_optax_optimizer, True),
  "OptimizerDef.derive_logical_axes": (optcore.OptimizerDef.derive_logical_axes, True),
  "OptimizerDef.compute_updates": (optcore.OptimizerDef.compute_updates, True),
  "OptimizerDef.overridable_names": (optcore.OptimizerDef.overridable_names, False),
  "adapter.as_definition": (optcore.adapter.as_definition, True),
  "adapter.key_data_for_export": (optcore.adapter.key_data_for_export, False),
  "adapter.state_logical_axes": (optcore.adapter.state_logical_axes, True),
  "adapter.state_shardings": (optcore.adapter.state_shardings, True),
  "adapter.warn": (optcore.adapter.warn, False),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_points_document_args_returns_raises_and_an_example(name):
  obj, raises = ENTRY_POINTS[name]
  assert missing_sections(obj, raises) == [], name
