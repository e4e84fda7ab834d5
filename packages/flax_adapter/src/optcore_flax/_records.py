"""flax.optim's and T5X's hyper-parameter records, as optcore `HyperParams`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import optcore


def hyper_params_record(name: str, *fields: str, **defaults: Any) -> Callable[..., Any]:
  """A constructor named like the original's struct (``_AdamHyperParams``) that
  takes its fields in its order and returns the equal `optcore.HyperParams`,
  so code and tests that build expected hyper-parameters compare equal.

  Example:
    >>> from optcore_flax.optim.adam import _AdamHyperParams
    >>> from optcore_flax import optim
    >>> hp = optim.Adam(0.1, beta1=0.2, beta2=0.9, eps=0.01).hyper_params
    >>> hp == _AdamHyperParams(0.1, 0.2, 0.9, 0.01, 0.0)
    True
  """
  kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
  signature = inspect.Signature(
    [inspect.Parameter(f, kind, default=defaults.get(f, inspect.Parameter.empty)) for f in fields]
  )

  def record(*args: Any, **kwargs: Any) -> optcore.HyperParams:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return optcore.HyperParams(**bound.arguments)

  record.__name__ = record.__qualname__ = name
  record.__signature__ = signature  # type: ignore[attr-defined]
  record.__doc__ = f"The original's {name} ({', '.join(fields)}) as an optcore.HyperParams."
  return record
