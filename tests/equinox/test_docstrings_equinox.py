"""Every example in optcore_equinox's docstrings runs and prints what it says."""

from __future__ import annotations

from package_docs import docstring_examples, entry_point_sections

import optcore_equinox

test_docstring_examples_run = docstring_examples(optcore_equinox)

# The methods a user calls, with whether each raises on bad input (issue 30).
test_entry_points_document_args_returns_raises_and_an_example = entry_point_sections(
  optcore_equinox,
  raises="""
  Optimizer.update Optimizer.restore_state Optimizer.transplant Optimizer.shardings
  Optimizer.shard
  """,
  quiet="""
  Optimizer.state_dict Optimizer.current_hyper_params
  """,
)
