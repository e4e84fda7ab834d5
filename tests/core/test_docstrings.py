"""Every example in optcore's docstrings runs and prints what it says."""

from __future__ import annotations

from package_docs import docstring_examples, entry_point_sections

import optcore

test_docstring_examples_run = docstring_examples(optcore)


# The entry points a user calls first, with whether each raises on bad input (issue 30).
test_entry_points_document_args_returns_raises_and_an_example = entry_point_sections(
  optcore,
  raises="""
  OptimizerDef.create OptimizerDef.init_state OptimizerDef.apply_gradient
  OptimizerDef.update_hyper_params OptimizerDef.restore_state OptimizerDef.create_sharded
  OptimizerDef.derive_shardings OptimizerDef.as_optax Optimizer.apply_gradient
  Optimizer.restore_state Optimizer.transplant transplant adapter.step adapter.restore_state
  adapter.transplant_state config.from_config config.to_config accumulate mixed_precision
  ema chain check_gradients from_state_dict selector_mask register_selector_type
  register_hidden_level register_state_rule derive_optax_logical_axes logical_to_mesh_axes
  logical_to_mesh logical_to_mesh_sharding wrap_optax_optimizer
  OptimizerDef.derive_logical_axes OptimizerDef.compute_updates adapter.as_definition
  adapter.state_logical_axes adapter.state_shardings declare_state declared_fields
  """,
  quiet="""
  OptimizerDef.state_dict Optimizer.compute_gradient Optimizer.state_dict adapter.state_dict
  to_state_dict leaves_with_paths OptimizerDef.overridable_names adapter.key_data_for_export
  adapter.warn
  """,
)
