"""Every example in optcore_equinox's docstrings runs and prints what it says."""

from __future__ import annotations

import pytest
from doctests import failures_in, missing_sections, modules_of

import optcore_equinox


@pytest.mark.parametrize("module", modules_of(optcore_equinox), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
  failures = failures_in(module, optcore_equinox)
  assert failures == 0, f"{failures} docstring example(s) failed in {module.__name__}"


# The methods a user calls, with whether each raises on bad input (issue 30).
ENTRY_POINTS = {
  "Optimizer.update": (optcore_equinox.Optimizer.update, True),
  "Optimizer.state_dict": (optcore_equinox.Optimizer.state_dict, False),
  "Optimizer.restore_state": (optcore_equinox.Optimizer.restore_state, True),
  "Optimizer.transplant": (optcore_equinox.Optimizer.transplant, True),
  "Optimizer.current_hyper_params": (optcore_equinox.Optimizer.current_hyper_params, False),
  "Optimizer.shardings": (optcore_equinox.Optimizer.shardings, True),
  "Optimizer.shard": (optcore_equinox.Optimizer.shard, True),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_entry_points_document_args_returns_raises_and_an_example(name):
  obj, raises = ENTRY_POINTS[name]
  assert missing_sections(obj, raises) == [], name
