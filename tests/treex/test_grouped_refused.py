"""optcore_treex.Optimizer returns the parameters it updates, so it refuses a grouped
definition (see docs/performance.md for the measurement behind the refusal)."""

import pytest

import optcore
import optcore_treex


def test_a_grouped_definition_is_refused_with_the_reason_and_the_fix():
  with pytest.raises(TypeError, match=r"owns its parameters.*optcore.grouped\(\.\.\.\)\.create"):
    optcore_treex.Optimizer(optcore.grouped(optcore.adam(1e-3)))
  optcore_treex.Optimizer(optcore.adam(1e-3))  # the ungrouped definition is fine
