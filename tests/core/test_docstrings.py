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
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_points_document_args_returns_raises_and_an_example(name):
  obj, raises = ENTRY_POINTS[name]
  assert missing_sections(obj, raises) == [], name
