"""The declared rates of a definition's step: its learning rates and weight decays, wherever
they are (a group's, a wrapped definition's, a ``chain``'s members', ``schedule_free``'s base),
replaced in one walk. `optcore.cautious` sets the decays to zero; `optcore.multipliers` scales
both per parameter. What is a rate is declared where the definition is defined
(`OptimizerDef.learning_rate_names`, `OptimizerDef.weight_decay_names`), never read from a
name here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from optcore._src.definitions.base import OptimizerDef
from optcore._src.ground.hyper_params import HyperParams, is_schedule, static_key

#: The two kinds of rate a walk is told about.
LEARNING_RATE = "learning_rate"
WEIGHT_DECAY = "weight_decay"

#: ``(kind, value) -> value``: the value itself where it keeps it.
Replace = Callable[[str, Any], Any]


def replace_rates(opt_def: OptimizerDef, hyper_params: Any, replace: Replace) -> tuple[Any, bool]:
  """``hyper_params`` (``opt_def``'s for one step) with every declared learning rate and weight
  decay replaced by ``replace(kind, value)``: each group's of a MultiOptimizer, the wrapped
  definition's of a wrapper, and each definition's among a factory's arguments; and whether
  ``replace`` changed one (returned another object)."""
  if isinstance(hyper_params, (list, tuple)):  # one per group
    pairs = [
      replace_rates(d, h, replace) for d, h in zip(opt_def.children(), hyper_params, strict=True)
    ]
    return type(hyper_params)(h for h, _ in pairs), any(p for _, p in pairs)
  wrapped = getattr(opt_def, "optimizer_def", None)  # a wrapper steps with its child's
  if isinstance(wrapped, OptimizerDef):
    return replace_rates(wrapped, hyper_params, replace)
  if not isinstance(hyper_params, HyperParams):
    return hyper_params, False
  kinds = {n: LEARNING_RATE for n in opt_def.learning_rate_names()}
  kinds.update({n: WEIGHT_DECAY for n in opt_def.weight_decay_names()})
  new = {}
  for name, value in hyper_params.items():
    if name in kinds:
      replaced = replace(kinds[name], value)
      if replaced is not value:
        new[name] = replaced
    else:
      nested, inside = _nested(value, replace)
      if inside:
        new[name] = nested
  return (hyper_params.replace(**new) if new else hyper_params), bool(new)


def _nested(value: Any, replace: Replace) -> tuple[Any, bool]:
  """A definition among a factory's arguments (or a list of them) with its rates replaced."""
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
    pairs = [_nested(v, replace) for v in value]
    return type(value)(v for v, _ in pairs), any(p for _, p in pairs)
  rebuild = getattr(value, "with_hyper_params", None)  # a wrapped optax factory's
  if isinstance(value, OptimizerDef) and rebuild is not None:
    new, changed = replace_rates(value, value.hyper_params, replace)
    return (rebuild(new) if changed else value), changed
  return value, False


@dataclasses.dataclass(frozen=True, eq=False)
class ScaledSchedule:
  """A schedule times a factor: ``schedule(count) * factor``, what a multiplied learning rate
  given as a schedule is. Compared by what it is (the schedule's config and the factor), so a
  definition that holds one keeps jit's cache."""

  schedule: Callable[[Any], Any]
  factor: Any
  is_schedule: ClassVar[bool] = True  # `hyper_params.is_schedule` reads it

  def __call__(self, count: Any) -> Any:
    return self.schedule(count) * self.factor

  def _key(self) -> Any:
    return static_key((self.schedule, self.factor))

  def __eq__(self, other: object) -> bool:
    return isinstance(other, ScaledSchedule) and self._key() == other._key()

  def __hash__(self) -> int:
    return hash(self._key())


def scaled(value: Any, factor: float) -> Any:
  """``value`` times ``factor``: a number or array multiplied, a schedule wrapped, None (off, or
  the definition's own default) and a factor of one kept as they are."""
  if value is None or (isinstance(factor, (int, float)) and factor == 1):
    return value
  if is_schedule(value):
    return ScaledSchedule(value, factor)
  return value * factor
