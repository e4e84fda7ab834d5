"""Immutable hyper-parameter records with Flax-struct-style ``replace``."""

from __future__ import annotations

import difflib
import functools
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.core import Tracer


def is_numeric(value: Any) -> bool:
  """True for numbers and arrays: the values an override may trace."""
  if isinstance(value, bool):
    return False
  return isinstance(value, (int, float, complex, np.ndarray, np.generic, jax.Array))


# Hyper-parameters whose functions take something other than the step count: a mask or labels
# of the parameters (adamw's ``mask``, lars' ``trust_ratio_mask``, muon's dimension numbers), a
# line search's value function. They are never evaluated as schedules.
NOT_SCHEDULES = frozenset(
  {
    "mask",
    "weight_decay_mask",
    "trust_ratio_mask",
    "param_labels",
    "weight_dimension_numbers",
    "muon_weight_dimension_numbers",
    "clip_value_fn",
    "value_fn",
    "is_leaf",
    "measure",
    "measures",
    "transform_non_params",
  }
)


def is_schedule(value: Any, name: Any = None) -> bool:
  """A schedule of the step count: a function (``optax.cosine_decay_schedule(...)``,
  a lambda, a partial) or an object that says it is one (`optcore.config.Schedule`);
  never the value of a hyper-parameter named in `NOT_SCHEDULES` (a mask function)."""
  if name in NOT_SCHEDULES:
    return False
  if isinstance(value, (types.FunctionType, functools.partial)):
    return True
  return bool(getattr(value, "is_schedule", False)) and callable(value)


def value_at(value: Any, count: Any) -> Any:
  """A rate given as a number or a schedule, at ``count``: what an optax transformation's
  ``update`` reads (``learning_rate(count)`` where it is callable, else itself).

  Example:
    >>> from optcore._src.ground.hyper_params import value_at
    >>> value_at(0.1, 3), value_at(lambda count: 0.5**count, 3)
    (0.1, 0.125)
  """
  return value(count) if callable(value) else value


def at_step(hyper_params: Any, step: Any) -> Any:
  """``hyper_params`` with each schedule replaced by its value at ``step`` (the
  number of updates before this one, as optax counts): how a per-parameter
  definition, whose algorithm reads numbers, takes a schedule as a hyper-parameter.

  Example:
    >>> import optcore
    >>> from optcore._src.ground.hyper_params import at_step
    >>> hp = optcore.HyperParams(learning_rate=lambda count: 0.5**count, beta=0.9)
    >>> at_step(hp, 3)
    HyperParams(learning_rate=0.125, beta=0.9)
  """
  if not isinstance(hyper_params, HyperParams):
    return hyper_params
  scheduled = {k: v(step) for k, v in hyper_params.items() if is_schedule(v, k)}
  return hyper_params.replace(**scheduled) if scheduled else hyper_params


def current_values(hyper_params: Any, step: Any, prefix: str = "") -> dict[str, jax.Array]:
  """The numeric hyper-parameters of ``hyper_params`` at ``step``, flat, as arrays.

  Schedules are evaluated at ``step``; numbers and scalar arrays are kept;
  flags, None, dtypes and other static settings are left out. Nested records
  are flattened with ``/``: a `MultiOptimizer`'s groups as ``0/learning_rate``,
  a chain's wrapped definitions as ``transformations/1/learning_rate``.

  Example:
    >>> import optcore
    >>> from optcore._src.ground.hyper_params import current_values
    >>> hp = optcore.HyperParams(learning_rate=lambda count: 0.5**count, beta=0.9, nesterov=False)
    >>> {k: round(float(v), 6) for k, v in current_values(hp, 3).items()}
    {'learning_rate': 0.125, 'beta': 0.9}
  """
  if isinstance(hyper_params, Mapping):
    items = hyper_params.items()
  elif type(hyper_params) in (list, tuple):  # not a NamedTuple (an optax transformation)
    items = enumerate(hyper_params)
  elif hasattr(hyper_params, "hyper_params") and hasattr(hyper_params, "init_state"):
    return current_values(hyper_params.hyper_params, step, prefix)  # a wrapped definition
  else:
    return {}
  out: dict[str, jax.Array] = {}
  for key, value in items:
    name = f"{prefix}{key}"
    if is_schedule(value, key):
      value = value(step)
    if is_numeric(value) and np.ndim(value) == 0:
      out[name] = jax.numpy.asarray(value)
    elif not is_numeric(value):
      out.update(current_values(value, step, f"{name}/"))
  return out


def static_key(value: Any, _seen: frozenset = frozenset()) -> Any:
  """A hashable stand-in for ``value`` that compares equal for equal configs.

  Definitions are static data of jitted pytrees, so jit compares and hashes
  them: numbers compare by value, concrete arrays by their bytes. Functions
  compare by their code and what they close over, so two calls of
  ``optax.adam(1e-3)`` (fresh closures) are the same configuration; anything
  else that cannot be hashed compares by identity.
  """
  if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
    return (type(value).__name__, value)
  if isinstance(value, Tracer):
    return ("traced", id(value))
  if isinstance(value, np.dtype) or (
    isinstance(value, type) and (issubclass(value, np.generic) or hasattr(value, "dtype"))
  ):  # jnp.float32, np.float32 and dtype('float32') are one dtype
    return ("dtype", np.dtype(value).str)
  if isinstance(value, (np.ndarray, np.generic, jax.Array)):
    a = np.asarray(value)
    return ("array", a.dtype.str, a.shape, a.tobytes())
  if id(value) in _seen:  # a closure that reaches itself
    return ("cycle", id(value))
  seen = _seen | {id(value)}
  if isinstance(value, (list, tuple)):
    return (type(value), tuple(static_key(v, seen) for v in value))
  if isinstance(value, Mapping):
    return ("mapping", tuple(sorted((str(k), static_key(v, seen)) for k, v in value.items())))
  if isinstance(value, types.FunctionType):
    return _function_key(value, seen)
  if isinstance(value, functools.partial):
    return ("partial", static_key((value.func, value.args, value.keywords), seen))
  try:
    hash(value)
  except TypeError:
    return ("id", id(value))
  return value


def _function_key(fn: types.FunctionType, seen: frozenset) -> Any:
  try:
    cells = tuple(cell.cell_contents for cell in fn.__closure__ or ())
  except ValueError:  # an empty cell: the closure is not finished being built
    return ("id", id(fn))
  return (
    "function",
    fn.__code__,
    id(fn.__globals__),
    static_key((fn.__defaults__, fn.__kwdefaults__, cells), seen),
  )


# The extra update arguments optax's own transformations read (lbfgs and its line search,
# polyak_sgd, reduce_on_plateau): passed on to a wrapped optax transformation, ignored by the
# others as optax's ignore them. Every other keyword of ``update`` names a hyper-parameter
# (``nnx.Optimizer.update(model, grads, learning_rate=lr)``), or an extra argument a definition
# declares it reads (`OptimizerDef.extra_arg_names`): honoured for that step, or refused as
# `OptimizerDef.update_hyper_params` refuses it (a typo never passes silently).
OPTAX_EXTRA_ARGS = frozenset({"value", "grad", "value_fn"})

#: Names other libraries give hyper-parameters (PyTorch, Keras, flax.optim) -> optax's names for
#: them; an error naming one of these says which keyword optcore takes instead.
KNOWN_ALIASES: dict[str, tuple[str, ...]] = {
  "lr": ("learning_rate",),
  "learningrate": ("learning_rate",),
  "betas": ("b1", "b2"),
  "beta1": ("b1",),
  "beta2": ("b2",),
  "beta_1": ("b1",),
  "beta_2": ("b2",),
  "momentum": ("b1",),
  "epsilon": ("eps",),
  "eps": ("epsilon",),
  "wd": ("weight_decay",),
  "decay": ("weight_decay",),
}


def is_setting(name: str, value: Any) -> bool:
  """A hyper-parameter that shapes the algorithm rather than a number a step may change: a
  flag, a mask, a dtype, a name (``nesterov``, ``mask``, ``mu_dtype``)."""
  if name in NOT_SCHEDULES or name.endswith("_dtype"):
    return True
  if isinstance(value, (list, tuple)):  # a chain's transformations, not numbers
    return not all(is_numeric(v) for v in value)
  return isinstance(value, (bool, str))


def name_hint(name: str, valid: Iterable[str]) -> str:
  """`` (optcore's name is 'learning_rate')`` for a known alias whose names ``valid`` has,
  else `` (did you mean 'learning_rate'?)`` for a near miss, else nothing."""
  valid = set(valid)
  meant = KNOWN_ALIASES.get(name.lower(), ())
  if meant and set(meant) <= valid:
    names = " and ".join(map(repr, meant))
    return f" (optcore's name{'s are' if len(meant) > 1 else ' is'} {names})"
  close = difflib.get_close_matches(name, sorted(valid), n=1)
  return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_names_message(
  unknown: Iterable[str], valid: Iterable[str], values: Mapping[str, Any] | None = None
) -> str:
  """The one wording for hyper-parameter names a definition does not have:
  ``unknown hyper-parameter 'lr' (optcore's name is 'learning_rate'); the valid names are:
  b1, b2, eps, learning_rate``. With the definition's ``values``, the settings among
  ``valid`` (flags, masks, dtypes: `is_setting`) are named apart from the per-step values."""
  unknown = list(unknown)
  valid = set(valid)
  values = values or {}
  settings = sorted(n for n in valid if n in values and is_setting(n, values[n]))
  noun = "hyper-parameter" if len(unknown) == 1 else "hyper-parameters"
  named = ", ".join(f"{name!r}{name_hint(name, valid)}" for name in unknown)
  names = ", ".join(sorted(valid - set(settings))) or "(none)"
  message = f"unknown {noun} {named}; the valid names are: {names}"
  if settings:
    message += f" (set when the definition is made, not per step: {', '.join(settings)})"
  return message


class HyperParams(Mapping[str, Any]):
  """The hyper-parameters of an optimizer definition, by name.

  Read them as attributes or items; ``replace`` returns a copy with some
  changed, as Flax structs do. Numbers and arrays are pytree leaves, the rest
  (schedules, masks, dtypes, flags) is static.

  Example:
    >>> import optcore
    >>> hp = optcore.HyperParams(learning_rate=0.1, beta=0.9)
    >>> hp.replace(learning_rate=0.2).learning_rate
    0.2
    >>> hp.replace(lr=0.2)
    Traceback (most recent call last):
    ...
    TypeError: unknown hyper-parameter 'lr' (optcore's name is 'learning_rate'); the valid ...
  """

  __slots__ = ("_key_cache", "_values")

  def __init__(self, **values: Any):
    object.__setattr__(self, "_values", dict(values))
    object.__setattr__(self, "_key_cache", None)

  def __getattr__(self, name: str) -> Any:
    try:
      return self._values[name]
    except KeyError:
      raise AttributeError(unknown_names_message([name], self._values, self._values)) from None

  def __setattr__(self, name: str, value: Any) -> None:
    raise AttributeError("HyperParams is immutable; use .replace(**changes)")

  def __getitem__(self, name: str) -> Any:
    return self._values[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._values)

  def __len__(self) -> int:
    return len(self._values)

  @classmethod
  def of_arguments(cls, arguments: Mapping[str, Any], *, leave: Iterable[str] = ()) -> HyperParams:
    """The hyper-parameters a constructor was called with: ``arguments`` is its
    ``locals()``, less ``self``, ``__class__`` and the names in ``leave`` (the
    arguments it keeps as settings of its own), in the signature's order.

    Args:
      arguments: the constructor's ``locals()`` at its first line.
      leave: names that are arguments but not hyper-parameters.

    Returns:
      HyperParams with one entry an argument.

    Example:
      >>> import optcore
      >>> def sgd(learning_rate=0.1, momentum=None):
      ...   return optcore.HyperParams.of_arguments(locals())
      >>> sgd()
      HyperParams(learning_rate=0.1, momentum=None)
    """
    skip = {"self", "__class__", *leave}
    return cls(**{name: value for name, value in arguments.items() if name not in skip})

  def replace(self, **changes: Any) -> HyperParams:
    """A copy with ``changes`` applied; an unknown name raises TypeError."""
    unknown = [name for name in changes if name not in self._values]
    if unknown:
      raise TypeError(unknown_names_message(unknown, self._values, self._values))
    return HyperParams(**{**self._values, **changes})

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, HyperParams):
      return NotImplemented
    return self._key() == other._key()

  def __hash__(self) -> int:
    return hash(self._key())

  def _key(self) -> tuple:
    if self._key_cache is None:
      key = tuple((name, static_key(value)) for name, value in self._values.items())
      object.__setattr__(self, "_key_cache", key)
      return key
    return self._key_cache

  def __repr__(self) -> str:
    inner = ", ".join(f"{name}={value!r}" for name, value in self._values.items())
    return f"HyperParams({inner})"

  def __reduce__(self):
    return (_rebuild, (self._values,))


def _rebuild(values: dict[str, Any]) -> HyperParams:
  return HyperParams(**values)


def _flatten(hp: HyperParams):
  names = tuple(hp._values)
  leaf_names = tuple(n for n in names if is_numeric(hp._values[n]))
  static = tuple((n, hp._values[n]) for n in names if n not in leaf_names)
  children = [(jax.tree_util.GetAttrKey(n), hp._values[n]) for n in leaf_names]
  return children, (names, leaf_names, _StaticItems(static))


def _unflatten(aux, children) -> HyperParams:
  names, leaf_names, static = aux
  values = dict(static.items)
  values.update(zip(leaf_names, children, strict=True))
  return HyperParams(**{n: values[n] for n in names})


class _StaticItems:
  """Static hyper-parameter values, compared by `static_key` so jit can hash them."""

  __slots__ = ("items",)

  def __init__(self, items: tuple[tuple[str, Any], ...]):
    self.items = items

  def __eq__(self, other: object) -> bool:
    return isinstance(other, _StaticItems) and self._key() == other._key()

  def __hash__(self) -> int:
    return hash(self._key())

  def _key(self) -> tuple:
    return tuple((n, static_key(v)) for n, v in self.items)


jax.tree_util.register_pytree_with_keys(HyperParams, _flatten, _unflatten)


class StaticConfig:
  """Equality and hash by configuration (`OptimizerDef`): a definition is static
  data of jitted pytrees, so equal configs are equal definitions and the same
  configuration never retraces. ``_static_key`` says what the configuration is."""

  hyper_params: HyperParams

  def _static_key(self) -> tuple:
    return (type(self), self.hyper_params)

  def _cached_key(self) -> tuple:
    # jit hashes and compares the definition on every call: compute the key once.
    key = self.__dict__.get("_key_cache")
    if key is None:
      key = self.__dict__["_key_cache"] = (self._static_key(), hash(self._static_key()))
    return key

  def __eq__(self, other: object) -> bool:
    if self is other:
      return True
    if not isinstance(other, StaticConfig):
      return NotImplemented
    return self._cached_key() == other._cached_key()

  def __hash__(self) -> int:
    return self._cached_key()[1]
