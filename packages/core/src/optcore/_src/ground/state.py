"""`OptimizerState`: the step count and the per-parameter states, a plain pytree.

Its own module, below everything that reads or writes a state (serialization, transplant, the
`Optimizer` container), so none of them imports another to name it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

PyTree = Any


@dataclasses.dataclass(frozen=True)
class OptimizerState:
  """The state of an optimizer: the step count and the per-parameter states.

  Attributes:
    step: int32 scalar, the number of updates applied so far.
    param_states: for a per-parameter definition, a tree shaped like the
      parameters; for a wrapped optax optimizer, the optax state as optax
      lays it out.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> state = optcore.sgd(0.1, momentum=0.9).init_state({'w': jnp.zeros(2)})
    >>> int(state.step), type(state.param_states[0]).__name__
    (0, 'TraceState')
    >>> state.replace(step=state.step + 1).step
    Array(1, dtype=int32)
  """

  step: jax.Array
  param_states: PyTree

  def replace(self, **changes: Any) -> OptimizerState:
    return dataclasses.replace(self, **changes)


jax.tree_util.register_dataclass(
  OptimizerState, data_fields=["step", "param_states"], meta_fields=[]
)
