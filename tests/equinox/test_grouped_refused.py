"""optcore_equinox.Optimizer owns its model's parameters, so it refuses a grouped
definition (see docs/performance.md for the measurement behind the refusal)."""

import equinox as eqx
import jax
import pytest

import optcore
import optcore_equinox


def test_a_grouped_definition_is_refused_with_the_reason_and_the_fix():
  model = eqx.nn.MLP(4, 4, 8, depth=3, key=jax.random.key(0))
  with pytest.raises(TypeError, match=r"owns its parameters.*optcore.grouped\(\.\.\.\)\.create"):
    optcore_equinox.Optimizer(optcore.grouped(optcore.adam(1e-3)), model)
  optcore_equinox.Optimizer(optcore.adam(1e-3), model)  # the ungrouped definition is fine
