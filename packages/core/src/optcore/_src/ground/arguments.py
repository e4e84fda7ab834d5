"""What a factory's arguments accept, declared once where the factory is defined.

A factory (``mars``, ``ema``, ``warmup_stable_decay``, ...) declares its arguments with
`declare`; the declaration checks every call, and the same declaration is what
`wrap_optax_optimizer` reads to check ``optcore.contrib.mars(...)`` when the definition is
made (not at the first step), and what `optcore.config` reads to name the field. An optax
factory declares nothing of its own: its annotations are its declaration (`from_annotations`:
a number or a schedule, never a string, NaN or infinity).

The rules every declaration keeps:

- a number is a Python number, a NumPy scalar (``np.float32(0.99)``, ``np.int64(4)``, stored as
  the Python number it holds) or a scalar array; never a string, a bool, NaN or infinity;
- a traced value is accepted where only a range check would read it (the range is not known
  until it runs), never where the code branches on it (an integer setting);
- a fixed-length pair (``betas_1d``) takes a list or a tuple and is stored as a tuple, so a
  definition read from a config compiles once.

Every refusal is an `ArgumentError` (a TypeError and a ValueError, as the checks it replaces
raised one or the other), naming the factory, the argument, what it takes and what it got.

Example:
  >>> from optcore._src.ground import arguments
  >>> @arguments.declare(decay=arguments.Number(0, 1, high_open=True))
  ... def my_average(decay=0.9):
  ...   return decay
  >>> import numpy as np
  >>> my_average(np.float32(0.5))
  0.5
  >>> my_average("0.5")
  Traceback (most recent call last):
  ...
  optcore.ArgumentError: my_average: decay must be a number in [0, 1); got the string '0.5'...
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import inspect
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import numpy as np
from jax.core import Tracer

from optcore._src.ground import overrides

F = TypeVar("F", bound=Callable[..., Any])

#: Where `declare` keeps a factory's declaration.
ATTRIBUTE = "__optcore_arguments__"


class ArgumentError(TypeError, ValueError):
  """An argument a factory does not take: its type, its range, NaN or infinity.

  Both a TypeError and a ValueError (the hand-written checks it replaces raised one or the
  other). ``argument`` names the argument, so a config names the field.

  Example:
    >>> import optcore
    >>> try:
    ...   optcore.contrib.mars(1e-3, b1=1.5)
    ... except optcore.ArgumentError as e:
    ...   print(e.argument, '|', e)
    b1 | contrib.mars: b1 must be a number in [0, 1); got 1.5.
  """

  def __init__(self, owner: str, argument: str, message: str):
    super().__init__(f"{owner}: {message}")
    self.owner = owner
    self.argument = argument
    self.message = message  # without the owner's name


ArgumentError.__module__ = "optcore"


def _interval(low: Any, high: Any, low_open: bool, high_open: bool) -> str:
  if low is not None and high is not None:
    return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
  if low is not None:
    return f"{'>' if low_open else '>='} {low:g}"
  if high is not None:
    return f"{'<' if high_open else '<='} {high:g}"
  return ""


def _scalar(value: Any) -> tuple[Any, Any] | None:
  """``(number, stored)`` for a Python number, a NumPy scalar or a concrete scalar array
  (NumPy's stored as the Python number, a JAX array as itself); None for anything else."""
  if isinstance(value, (bool, np.bool_)):
    return None
  if isinstance(value, (int, float)):
    return value, value
  if isinstance(value, np.generic) and np.dtype(value.dtype).kind in "iuf":
    return value.item(), value.item()
  if isinstance(value, (np.ndarray, jax.Array)) and value.shape == ():
    if np.dtype(value.dtype).kind not in "iuf":
      return None
    item = np.asarray(value).item()
    return item, (item if isinstance(value, np.ndarray) else value)
  return None


@dataclasses.dataclass(frozen=True)
class Number:
  """A real number, optionally in a range, an integer, None ("off") or a schedule.

  Args:
    low: the smallest value (None: unbounded).
    high: the largest value (None: unbounded).
    low_open: ``low`` itself is refused.
    high_open: ``high`` itself is refused.
    integer: an integer (Python or NumPy); the code branches on it, so never traced.
    none: None is accepted (it means "off").
    schedule: a schedule of the step count is accepted (checked as a constructor's is).
    arrays: an array of any shape is accepted as it is (optax's ``jax.typing.ArrayLike``).
    convert: a NumPy scalar is stored as the Python number it holds (optax's own arguments
      keep NumPy's, so the program is optax's own).
    weight_decay: the argument is a weight decay: `optcore.cautious` masks the step without
      it and adds the decay's part after, unmasked; `optcore.multipliers` scales it by a
      leaf's weight-decay multiplier.
    learning_rate: the argument is a learning rate: `optcore.multipliers` scales it by a
      leaf's learning-rate multiplier.
  """

  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  integer: bool = False
  none: bool = False
  schedule: bool = False
  arrays: bool = False
  convert: bool = True
  weight_decay: bool = False
  learning_rate: bool = False

  def expected(self) -> str:
    """What it takes, in words: ``'a number in [0, 1)'``, ``'an integer >= 1 or None'``."""
    words = "an integer" if self.integer else "a number"
    interval = _interval(self.low, self.high, self.low_open, self.high_open)
    words += f" {interval}" if interval else ""
    if self.schedule:
      words += " or a schedule"
    if self.none:
      words += " or None"
    return words

  def check(self, owner: str, name: str, value: Any) -> Any:
    """``value`` as stored, or `ArgumentError` naming ``name``."""
    expected = self.expected()

    def refuse(found: str, fix: str = "") -> ArgumentError:
      return ArgumentError(owner, name, f"{name} must be {expected}; got {found}.{fix}")

    if value is None:
      if self.none:
        return None
      raise refuse("None", " Leave it out to keep its default.")
    if isinstance(value, str):
      try:
        as_number: Any = float(value)
      except ValueError:
        raise refuse(f"the string {value!r}") from None
      if self.integer and as_number.is_integer():
        as_number = int(as_number)
      raise refuse(
        f"the string {value!r}",
        f" Strings are not converted: write {name}={as_number!r} (in YAML 1.1, 1e-3 is a "
        "string: write 1.0e-3).",
      )
    if callable(value) and not hasattr(value, "shape"):
      if self.schedule:
        overrides.check_schedule(owner, name, value)
        return value
      raise refuse(f"a callable ({value!r:.60})", f" {name} takes one value, not a schedule.")
    if isinstance(value, (Tracer, jax.ShapeDtypeStruct)):
      if self.integer:
        raise refuse(
          "a traced value",
          f" The step's code branches on {name}: pass a Python int (mark it static under jit).",
        )
      if value.shape != () and not self.arrays:
        raise refuse(f"a traced array of shape {value.shape}")
      return value
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if self.arrays and shape is not None and dtype is not None:
      number_like = shape == () and jax.numpy.issubdtype(dtype, jax.numpy.number)
      if not number_like:  # an array, or a PRNG key, where optax's annotation admits one
        return value
    scalar = _scalar(value)
    if scalar is None:
      shape = getattr(value, "shape", None)
      found = f"{type(value).__name__}" + (f" of shape {shape}" if shape else "")
      found += f" {value!r:.60}" if shape is None else ""
      raise refuse(found)
    number, stored = scalar
    if not self.convert and isinstance(value, np.generic):
      stored = value
    if isinstance(number, complex) or not math.isfinite(number):
      raise refuse(
        repr(value), " Every value it touches would become NaN or infinite: give a finite one."
      )
    if self.integer:
      if not isinstance(number, int):
        fix = f" It counts something: write a whole number ({name}={round(number)})."
        raise refuse(repr(value), fix)
      stored = int(number)
    low, high = self.low, self.high
    if (low is not None and (number < low or (self.low_open and number == low))) or (
      high is not None and (number > high or (self.high_open and number == high))
    ):
      raise refuse(repr(value))
    return stored


@dataclasses.dataclass(frozen=True)
class Numbers:
  """A fixed number of numbers (``betas_1d=(0.9, 0.95)``), each checked by ``item``; a list
  is stored as a tuple."""

  item: Number
  length: int

  def expected(self) -> str:
    return f"{self.length} numbers, each {self.item.expected()[2:]}".replace("number ", "", 1)

  def check(self, owner: str, name: str, value: Any) -> Any:
    if isinstance(value, str) or not isinstance(value, collections.abc.Sequence):
      raise ArgumentError(
        owner, name, f"{name} must be a tuple of {self.expected()}; got {value!r:.60}."
      )
    if len(value) != self.length:
      raise ArgumentError(
        owner,
        name,
        f"{name} must be a tuple of {self.expected()}; got {len(value)}: {tuple(value)!r}.",
      )
    return tuple(self.item.check(owner, f"{name}[{i}]", v) for i, v in enumerate(value))


@dataclasses.dataclass(frozen=True)
class OneOf:
  """One of a few values (``mode='zscore'``); a string case-insensitively (stored as the
  option it names). ``hint``: what each option means, for the message."""

  options: tuple[Any, ...]
  hint: str = ""

  def expected(self) -> str:
    return f"one of {', '.join(map(repr, self.options))}" + (f" ({self.hint})" if self.hint else "")

  def check(self, owner: str, name: str, value: Any) -> Any:
    found = value.lower() if isinstance(value, str) else value
    try:
      ok = found in self.options and not isinstance(found, bool)
    except TypeError:  # an unhashable or array value
      ok = False
    if not ok:
      raise ArgumentError(owner, name, f"{name} must be {self.expected()}; got {value!r:.60}.")
    return found


@dataclasses.dataclass(frozen=True)
class Flag:
  """True or False (a NumPy bool is stored as Python's)."""

  def expected(self) -> str:
    return "True or False"

  def check(self, owner: str, name: str, value: Any) -> Any:
    if isinstance(value, (bool, np.bool_)):
      return bool(value)
    raise ArgumentError(owner, name, f"{name} must be True or False; got {value!r:.60}.")


@dataclasses.dataclass(frozen=True)
class Regex:
  """A regular expression, matched against a parameter's whole ``/``-joined path
  (``'.*/query/kernel'``)."""

  def expected(self) -> str:
    return "a regular expression over a parameter's path, matched whole ('(.*/)?query/kernel')"

  def check(self, owner: str, name: str, value: Any) -> Any:
    if not isinstance(value, str):
      raise ArgumentError(owner, name, f"{name} must be {self.expected()}; got {value!r:.60}.")
    try:
      re.compile(value)
    except re.error as e:
      raise ArgumentError(
        owner, name, f"{name}: {value!r} is not a regular expression ({e})."
      ) from None
    return value


@dataclasses.dataclass(frozen=True)
class AxisNames:
  """Logical axis names (``('layers', 'heads')``), at least one, none twice; a single name is
  one name's tuple, a list is stored as a tuple. ``one``: exactly one name, stored as it is."""

  one: bool = False

  def expected(self) -> str:
    if self.one:
      return "one logical axis name ('kv_heads')"
    return "logical axis names, at least one and none twice (('heads',))"

  def check(self, owner: str, name: str, value: Any) -> Any:
    names = (value,) if isinstance(value, str) else value
    ok = (
      isinstance(names, collections.abc.Sequence)
      and len(names) > 0
      and all(isinstance(n, str) and n for n in names)
      and len(set(names)) == len(names)
      and (len(names) == 1 or not self.one)
    )
    if not ok:
      raise ArgumentError(owner, name, f"{name} must be {self.expected()}; got {value!r:.60}.")
    return names[0] if self.one else tuple(names)


Spec = Number | Numbers | OneOf | Flag | Regex | AxisNames

#: The declarations used most, by what they mean.
DECAY = Number(0, 1, high_open=True)  # a moment's or an average's decay: [0, 1)
NONNEGATIVE = Number(0)
POSITIVE = Number(0, low_open=True)
RATE = Number(schedule=True, learning_rate=True)  # a learning rate: a real number, a schedule
WEIGHT_DECAY = Number(0, weight_decay=True)  # a weight decay, never masked by cautious
#: An optax factory's weight decay: the number its annotations declare (no range; None only
#: where they admit it, as adafactor's weight_decay_rate), said to be a weight decay.
OPTAX_WEIGHT_DECAY = Number(none=True, arrays=True, convert=False, weight_decay=True)

#: Declarations made for functions optcore does not own (optax's), by `declare_for`.
_FOR: dict[Any, Mapping[str, Spec]] = {}
COUNT = Number(1, integer=True)  # a positive number of steps or items


def check(owner: str, specs: Mapping[str, Spec], arguments: Mapping[str, Any]) -> dict[str, Any]:
  """``arguments`` with each declared one checked and stored as its spec stores it."""
  out = dict(arguments)
  for name, spec in specs.items():
    if name in out:
      out[name] = spec.check(owner, name, out[name])
  return out


def declare(**specs: Spec) -> Callable[[F], F]:
  """Declares what each named argument of the decorated function accepts; every call is
  checked (the defaults once, when the function is declared), and the declaration is kept for
  `declared`.

  A method's ``self`` is skipped; its owner in messages is the class's ``name`` attribute,
  or the function's name. A function that takes ``**settings`` may declare names it finds
  there (a wrapper's constructor whose public function carries the typed signature).
  """

  def decorate(fn: F) -> F:
    signature = inspect.signature(fn)
    keywords = next((k for k, p in signature.parameters.items() if p.kind is p.VAR_KEYWORD), None)
    unknown = set(specs) - set(signature.parameters)
    if unknown and keywords is None:
      raise TypeError(f"declare: {fn.__name__} has no argument(s) {sorted(unknown)}")
    for name, spec in specs.items():  # the defaults, once: a call leaves them as they are
      default = signature.parameters[name].default if name in signature.parameters else None
      if name in signature.parameters and default is not inspect.Parameter.empty:
        spec.check(fn.__name__, name, default)

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
      try:
        bound = signature.bind(*args, **kwargs)
      except TypeError:
        return fn(*args, **kwargs)  # the function's own error, as Python words it
      owner = getattr(bound.arguments.get("self"), "name", None) or fn.__name__
      given = bound.arguments.get(keywords, {}) if keywords else {}
      for name, spec in specs.items():
        if name in bound.arguments:
          bound.arguments[name] = spec.check(owner, name, bound.arguments[name])
        elif name in given:
          given[name] = spec.check(owner, name, given[name])
      return fn(*bound.args, **bound.kwargs)

    setattr(checked, ATTRIBUTE, types.MappingProxyType(dict(specs)))
    return typing.cast(F, checked)

  return decorate


def declare_for(fn: Any, /, **specs: Spec) -> None:
  """Declares arguments of a function you cannot decorate (optax's factories), as
  `declarations.declare_state` does for a state type: read by `declared` and `from_annotations`
  as a `declare` on the function would be, but calls of ``fn`` itself are not checked (a
  definition made from it is).

  Raises:
    TypeError: a name ``fn`` does not take.
  """
  parameters = inspect.signature(fn).parameters
  unknown = sorted(set(specs) - set(parameters))
  if unknown:
    raise TypeError(f"declare_for: {getattr(fn, '__name__', fn)} has no argument(s) {unknown}")
  _FOR[fn] = types.MappingProxyType({**_FOR.get(fn, {}), **specs})
  from_annotations.cache_clear()


def declared(fn: Any) -> Mapping[str, Spec]:
  """The declaration `declare` kept on ``fn`` (or on a function it wraps), or `declare_for`
  made for it; empty if none."""
  for _ in range(4):
    found = getattr(fn, ATTRIBUTE, None)
    if found is None:
      try:
        found = _FOR.get(fn)
      except TypeError:  # an unhashable callable
        found = None
    if found is not None:
      return found
    fn = getattr(fn, "__wrapped__", None)
    if fn is None:
      break
  return types.MappingProxyType({})


def weight_decays(fn: Any) -> tuple[str, ...]:
  """The arguments of ``fn`` declared weight decays (`Number.weight_decay`)."""
  return tuple(
    name
    for name, spec in from_annotations(fn).items()
    if isinstance(spec, Number) and spec.weight_decay
  )


def learning_rates(fn: Any) -> tuple[str, ...]:
  """The arguments of ``fn`` declared learning rates (`Number.learning_rate`)."""
  return tuple(
    name
    for name, spec in from_annotations(fn).items()
    if isinstance(spec, Number) and spec.learning_rate
  )


def annotation_args(p: inspect.Parameter) -> tuple[Any, ...]:
  """The types an argument's annotation admits (one, or a Union's members)."""
  annotation = p.annotation
  if annotation is inspect.Parameter.empty or isinstance(annotation, str):
    return ()
  if typing.get_origin(annotation) in (typing.Union, types.UnionType):
    return typing.get_args(annotation)
  return (annotation,)


def takes_numbers(p: inspect.Parameter) -> bool:
  """An argument annotated with numbers (float, int, optax's Numeric or Optional[float])."""
  admitted = annotation_args(p)
  return any(a in (int, float) for a in admitted) and not any(
    a is str or a is typing.Any for a in admitted
  )


#: What a number's annotation may admit besides int and float: jax.typing.ArrayLike's members,
#: None, and a schedule (a Callable).
_NUMBER_LIKE = (bool, complex, np.ndarray, np.bool_, np.number, jax.Array, type(None))


def _only_numbers(p: inspect.Parameter) -> bool:
  """An argument whose annotation admits numbers and nothing else (arrays, None and a schedule
  aside): not a tuple, a mapping or a class of its own (muon's dimension numbers)."""
  return all(
    a in (int, float)
    or a in _NUMBER_LIKE
    or (typing.get_origin(a) or a) in (collections.abc.Callable, typing.Callable)
    for a in annotation_args(p)
  )


def _takes_callables(p: inspect.Parameter) -> bool:
  return any(
    (typing.get_origin(a) or a) in (collections.abc.Callable, typing.Callable)
    for a in annotation_args(p)
  )


@functools.cache
def from_annotations(fn: Any) -> Mapping[str, Spec]:
  """The declaration an optax factory's signature makes: a number-annotated argument (or one
  whose default is a number) takes a number, an array, or where annotated so a schedule;
  None where its default or annotation admits it. No ranges: optax declares none.
  A declaration `declare` kept wins, argument by argument."""
  out: dict[str, Spec] = {}
  try:
    try:  # a module with `from __future__ import annotations` keeps them as strings
      parameters = inspect.signature(fn, eval_str=True).parameters
    except NameError:  # an annotation naming what its module does not bind at run time
      parameters = inspect.signature(fn).parameters
  except (TypeError, ValueError):
    return declared(fn)
  for name, p in parameters.items():
    default_number = isinstance(p.default, (int, float)) and not isinstance(p.default, bool)
    if isinstance(p.default, bool):
      if p.annotation in (bool, "bool") or bool in annotation_args(p):
        out[name] = Flag()
      continue
    # jax.typing.ArrayLike (optax's newer annotations) admits bools too: a number default says
    if not (takes_numbers(p) or (default_number and p.annotation is inspect.Parameter.empty)):
      continue
    if not _only_numbers(p):  # a union with tuples, mappings or a class: not a number's
      continue
    admitted = annotation_args(p)
    if any(a is bool for a in admitted) and not any(a in (int, float) for a in admitted):
      continue
    none = p.default is None or type(None) in annotation_args(p)
    # optax's convention: a rate is named so (muon's adam_learning_rate, its other branch's)
    rate = name.endswith("learning_rate")
    schedule = _takes_callables(p) or rate
    out[name] = Number(none=none, schedule=schedule, arrays=True, convert=False, learning_rate=rate)
  for name, spec in declared(fn).items():
    derived = out.get(name)
    if spec is OPTAX_WEIGHT_DECAY and isinstance(derived, Number):  # the annotations' number,
      out[name] = dataclasses.replace(derived, weight_decay=True)  # said to be a weight decay
    else:
      out[name] = spec
  return types.MappingProxyType(out)


__all__ = [
  "COUNT",
  "DECAY",
  "NONNEGATIVE",
  "OPTAX_WEIGHT_DECAY",
  "POSITIVE",
  "RATE",
  "WEIGHT_DECAY",
  "ArgumentError",
  "Flag",
  "Number",
  "Numbers",
  "OneOf",
  "Spec",
  "check",
  "declare",
  "declare_for",
  "declared",
  "from_annotations",
  "learning_rates",
  "weight_decays",
]
