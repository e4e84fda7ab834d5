"""Which optax factories optcore should wrap, read from the installed optax itself.

The reference that the written-out wrappers (`optcore.<name>`, `optcore.contrib`)
are tested against, so a newer optax's new optimizers cannot be missed:
- optax's optimizer aliases: every public name of ``optax`` that optax
  defines in its alias module (adam, sgd, nadam, ...);
- optax.contrib's optimizers: every public function with a ``learning_rate``
  argument (except the ``scale_by_*`` building blocks), and the wrappers that
  take a base optimizer (mechanize, sam, schedule_free,
  split_real_and_imaginary).
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import optax
import optax.contrib

_WRAPPER_ARGUMENTS = frozenset({"base_optimizer", "optimizer", "inner"})


def optax_alias_names() -> list[str]:
  """The optimizer aliases of ``optax``: every public optimizer that optax's
  alias module defines and ``optax`` offers, in optax's order.

  Read from the alias module itself, not only from ``optax.__all__``: optax
  0.2.8 leaves ``optimistic_adam``, ``optimistic_adam_v2`` and
  ``optimistic_gradient_descent`` out of ``__all__`` although ``optax`` offers them.
  """
  try:
    from optax._src import alias
  except ImportError:  # the layout of optax's private modules moved
    return _names_with_learning_rate(optax, optax.__all__)
  defined = [name for name in vars(alias) if not name.startswith("_")]
  ordered = [n for n in optax.__all__ if n in defined]
  ordered += [n for n in defined if n not in ordered]
  out = []
  for name in ordered:
    # Look in the alias module first: touching optax's deprecated names warns.
    fn = getattr(alias, name)
    if not _defined_in(fn, alias.__name__):
      continue
    if getattr(optax, name, None) is fn:
      out.append(name)
  return out


def _defined_in(fn: Any, module: str) -> bool:
  """A function (or a partial of one, like optax's nadam) that ``module`` defines."""
  if isinstance(fn, functools.partial):
    return _defined_in(fn.func, module)
  return isinstance(fn, types.FunctionType) and fn.__module__ == module


def optax_contrib_names() -> list[str]:
  """The optimizers and optimizer wrappers that ``optax.contrib`` exports."""
  public = [n for n in dir(optax.contrib) if not n.startswith("_")]
  out = []
  for name in public:
    obj = getattr(optax.contrib, name)
    if isinstance(obj, type) or not callable(obj) or name.startswith("scale_by_"):
      continue
    params = _parameters(obj)
    if "learning_rate" in params or _WRAPPER_ARGUMENTS & set(params):
      out.append(name)
  return out


def _names_with_learning_rate(module: Any, names: list[str]) -> list[str]:
  return [
    n
    for n in names
    if not n.startswith("scale_by_") and "learning_rate" in _parameters(getattr(module, n))
  ]


def _parameters(obj: Any) -> list[str]:
  try:
    return list(inspect.signature(obj).parameters)
  except (TypeError, ValueError):
    return []
