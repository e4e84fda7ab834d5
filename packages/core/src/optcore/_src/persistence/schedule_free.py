"""Where a schedule-free run is evaluated: optax's ``schedule_free`` state found by its type
anywhere in an optimizer state (`optcore.eval_params` and the faces' ``eval_params``)."""

from __future__ import annotations

from typing import Any

import jax
from optax import contrib as optax_contrib

from optcore._src.ground import paths, stored
from optcore._src.persistence import placement

PyTree = Any


def found_states(state: Any) -> list[optax_contrib.ScheduleFreeState]:
  """Every ``ScheduleFreeState`` in ``state``, under any wrapper, group or chain."""
  return paths.instances_in(state, optax_contrib.ScheduleFreeState)


def keeps_schedule_free(state: Any) -> bool:
  return bool(found_states(state))


def eval_params(state: Any, params: PyTree) -> PyTree:
  """``params`` with each leaf a schedule-free state trains replaced by its evaluation point,
  ``(y - (1 - b1) * z) / b1`` (optax's ``schedule_free_eval_params``, in its order of
  operations), in the parameter's dtype; the other leaves as they are."""
  treedef = jax.tree.structure(params)
  out = treedef.flatten_up_to(params)
  for found in found_states(state):
    # state_memory_kind="pinned_host": read on the device; low_bit_state(states='z'): values
    z, _ = placement.to_device(stored.values(found.z))
    b1 = found.b1
    for i, z_leaf in enumerate(treedef.flatten_up_to(z)):
      if hasattr(z_leaf, "shape"):  # None or optax's MaskedNode: another group's parameter
        y = out[i]
        out[i] = ((y - (1.0 - b1) * z_leaf) / b1).astype(y.dtype)
  return treedef.unflatten(out)
