"""What T5X's optimizers do differently from the core, in one place."""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import PartitionSpec

import optcore


class T5XFace:
  overridable_names: Any  # the OptaxWrapper's it is mixed into
  """Mixed into a core definition (first in the bases), it behaves as T5X's:

  - an override the definition has no hyper-parameter for is ignored with a
    warning, as T5X ignored it (its trainer passes ``learning_rate=`` to
    every definition on every step, ``chain`` of ready optax transformations
    included); overrides the definition has are honoured;
  - `derive_logical_axes` gives None for the step and for scalar state
    leaves (optax's counters), as T5X does; `derive_shardings` (the core's,
    from the partition rules) still gives a `NamedSharding` for every leaf.
  """

  legacy_state_dicts = True  # T5X's train state passes 'flax_mutables' beside them

  def update_hyper_params(self, **hyper_param_overrides: Any) -> Any:
    replaced = hyper_param_overrides.pop("hyper_params", None)
    ignored = sorted(set(hyper_param_overrides) - self.overridable_names())
    if ignored:
      optcore.adapter.warn(
        f"{self!r} has no hyper-parameter {ignored}: ignored, as T5X ignored it (its trainer "
        "passes learning_rate= on every step). To have a learning rate schedule take effect, "
        "build the optimizer from optcore_flax.optimizers' factories, e.g. "
        "optimizers.chain([optax.clip_by_global_norm(1.0), optimizers.adamw(1e-4)]).",
        UserWarning,
      )
    kept = {k: v for k, v in hyper_param_overrides.items() if k not in ignored}
    if replaced is not None:
      kept["hyper_params"] = replaced
    return super().update_hyper_params(**kept)  # type: ignore[misc]

  def derive_logical_axes(self, optimizer: optcore.Optimizer, param_logical_axes: Any) -> Any:
    axes = super().derive_logical_axes(optimizer, param_logical_axes)  # type: ignore[misc]
    scalars_none = lambda spec: None if isinstance(spec, PartitionSpec) and not len(spec) else spec
    param_states = jax.tree.map(scalars_none, axes.state.param_states)
    return axes.replace(state=axes.state.replace(step=None, param_states=param_states))


def set_in_place(definition: Any, told: Any) -> None:
  """T5X's in-place ``set_param_axes`` on top of the core's immutable ``with_param_axes``:
  ``definition`` takes ``told``'s settings; refused once it has made a state whose layout they
  decide."""
  if told is definition:
    return
  if definition.__dict__.get("_made_state"):
    raise RuntimeError(
      "Adafactor.set_param_axes: this definition has already made an optimizer state, and "
      "changing its factor rules now would change the definition that optimizer holds (its "
      "next step would not fit its state). Call set_param_axes before create, or on a new "
      "definition: Adafactor(...) with the same arguments, or copy.copy(opt_def)."
    )
  for cached in [k for k in definition.__dict__ if k.endswith("_cache")]:
    del definition.__dict__[cached]  # the definition changed
  kept = {k: v for k, v in told.__dict__.items() if not k.endswith("_cache") and k != "_made_state"}
  definition.__dict__.update(kept)
