"""Optimizer configs as plain data: the implementation behind `optcore.config`."""

from __future__ import annotations

import collections.abc
import enum
import functools
import inspect
import math
import typing
from collections.abc import Mapping
from typing import Any, cast

import jax.numpy as jnp
import numpy as np
import optax

from optcore import contrib, legacy

# Each wrapper class registers itself by name in WRAPPERS (the config's table) when its module
# is imported, as `import optcore` imports them all: this module names none of them.
from optcore._src.definitions import optax_aliases
from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.multi_optimizer import MultiOptimizer
from optcore._src.definitions.optax_wrapper import OptaxWrapper, chain
from optcore._src.definitions.wrapper import REQUIRED, WRAPPERS, Wrapper
from optcore._src.ground.arguments import ArgumentError, annotation_args, takes_numbers
from optcore._src.ground.hyper_params import static_key
from optcore._src.ground.schedules import OWN_SCHEDULES, WritesConfig
from optcore._src.legacy.adafactor import Adafactor as _T5XAdafactor
from optcore._src.legacy.factoring import FactorDim


class ConfigError(ValueError):
  """A config that does not describe an optimizer; the message names the field."""


ConfigError.__module__ = "optcore.config"


def _legacy_names() -> tuple[str, ...]:
  """The algorithms a config names as ``legacy.<name>``: every definition that
  `optcore.legacy` exports, read from it when a config is read or written, so a
  new one is nameable with no other edit. `ReplicatedOptimizer` is left out: it
  holds devices, which a config cannot (``opt.replicate()`` makes one).
  """
  return tuple(
    name
    for name in legacy.__all__
    if isinstance(cls := getattr(legacy, name), type)
    and issubclass(cls, OptimizerDef)
    and cls is not legacy.ReplicatedOptimizer
  )


class Schedule:
  """An optax schedule that remembers its name and arguments, so it can be
  written back to a config and compared by value.

  Example:
    >>> from optcore.config import Schedule
    >>> s = Schedule("linear_schedule", init_value=1.0, end_value=0.0, transition_steps=10)
    >>> float(s(5)), s == Schedule("linear_schedule", init_value=1.0, end_value=0.0,
    ...                            transition_steps=10)
    (0.5, True)
  """

  #: Read per step by the definitions whose algorithms take numbers (`optcore.legacy`).
  is_schedule = True

  def __init__(self, name: str, **kwargs: Any):
    factory = getattr(optax.schedules, name, None)
    if (
      factory is None
      or not _public_optax_function(optax.schedules, name)
      or not name.endswith("schedule")
    ):
      raise ConfigError(f"optax.schedules has no schedule {name!r}")
    # JSON and YAML give string keys; optax's boundaries ({100: 0.1}) are step counts.
    kwargs = {k: _int_keys(v) for k, v in kwargs.items()}
    self.name, self.kwargs = name, dict(kwargs)
    _check_arguments(name, factory, kwargs, "")
    _check_types(name, factory, kwargs, "")
    try:
      self._fn = factory(**kwargs)
      first = self._fn(0)
    except (TypeError, ValueError, ZeroDivisionError) as e:
      raise ConfigError(f"schedule {name!r}: {e}") from None
    if np.shape(first) != () or not np.isfinite(first):
      raise ConfigError(
        f"schedule {name!r} with {kwargs} gives {first!r} at step 0; a schedule gives one "
        "finite number per step. Check its arguments."
      )

  def __call__(self, count: Any) -> Any:
    return self._fn(count)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, Schedule) and _key(self) == _key(other)

  def __hash__(self) -> int:  # by value: kwargs may hold lists (boundaries)
    return hash(_key(self))

  def __repr__(self) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
    return f"Schedule({self.name!r}, {inner})"


def from_config(config: Mapping[str, Any], *, _path: str = "") -> OptimizerDef:
  """The `OptimizerDef` a config describes (plain data: JSON, YAML, a gin binding).

  Args:
    config: ``{"name": "adamw", "learning_rate": 1e-3, ...}``; ``"multi"``,
      ``"chain"``, ``"accumulate"``, ``"mixed_precision"``, ``"ema"`` and
      ``"grouped"`` nest further configs (docs: Configs as data).

  Returns:
    The definition.

  Raises:
    optcore.config.ConfigError: an unknown name or argument, or a bad value
      (the message names the field's path).

  Example:
    >>> import optcore
    >>> opt_def = optcore.config.from_config({'name': 'adamw', 'learning_rate': 1e-3})
    >>> opt_def.hyper_params.learning_rate
    0.001
    >>> optcore.config.from_config({'name': 'adamw', 'lr': 1e-3})
    Traceback (most recent call last):
    ...
    optcore.config.ConfigError: ...
  """
  where = _path or "config"
  if not isinstance(config, Mapping):
    raise ConfigError(f"at {where!r}: expected a dict with a 'name' key, found {config!r}")
  if "name" not in config:
    raise ConfigError(f"at {where!r}: missing the 'name' key (the optimizer's name)")
  name = config["name"]
  args = {k: v for k, v in config.items() if k != "name"}
  if name == "multi":
    return _multi(args, _path)
  if name == "chain":
    return _chain(args, _path)
  if name in WRAPPERS:
    return _wrapper(name, args, _path)
  factory = _factory(name, _join(_path, "name"))
  _check_arguments(name, factory, args, _path)
  _check_types(name, factory, args, _path)
  kwargs = {k: _value(k, v, _join(_path, k)) for k, v in args.items()}
  try:
    return factory(**kwargs)
  except ArgumentError as e:  # a declared argument: name its field
    raise ConfigError(f"at {_join(_path, e.argument)!r}: {name}: {e.message}") from None
  except (TypeError, ValueError) as e:
    raise ConfigError(f"at {where!r}: {name}: {e}") from None


def to_config(opt_def: OptimizerDef) -> dict[str, Any]:
  """The config of ``opt_def``: JSON-able, the non-default hyper-parameters.

  Args:
    opt_def: a definition built from names (an alias, a legacy algorithm, a
      MultiOptimizer with regex selectors, a wrapper of those).

  Returns:
    A dict that `from_config` turns back into an equal definition.

  Raises:
    optcore.config.ConfigError: what a config cannot express (selectors other
      than regexes, ready optax transformations, schedules that are not
      `Schedule` objects).

  Example:
    >>> import optcore
    >>> optcore.config.to_config(optcore.adamw(1e-3, weight_decay=0.1))
    {'name': 'adamw', 'learning_rate': 0.001, 'weight_decay': 0.1}
  """
  if isinstance(opt_def, MultiOptimizer):
    groups = []
    for i, (selector, sub) in enumerate(
      zip(opt_def.traversals, opt_def.sub_optimizers, strict=True)
    ):
      if not isinstance(selector, str):
        raise ConfigError(
          f"group {i}: its selector is a {type(selector).__name__}, and only regex selectors "
          "can be written to a config. To write this MultiOptimizer, select the group by a "
          "regex over parameter paths, e.g. MultiOptimizer((r'.*/kernel$', opt), ...)."
        )
      groups.append({"select": selector, "optimizer": to_config(sub)})
    return {"name": "multi", "groups": groups}
  if isinstance(opt_def, Wrapper):  # accumulate, mixed_precision, ema, grouped, ...
    inner = to_config(opt_def.optimizer_def)
    written = {
      k: to_config(v) if k in opt_def.definition_arguments and v is not None else v
      for k, v in opt_def.config().items()
    }
    return {"name": opt_def.name, **written, "optimizer": inner}
  if isinstance(opt_def, OptaxWrapper):
    if opt_def.factory is None:
      raise ConfigError(f"{opt_def!r} wraps a ready optax transformation: it has no config")
    name = _optax_name(opt_def)
    hyper_params = dict(opt_def.hyper_params)
    if hyper_params.get("param_logical_axes") is not None:
      raise ConfigError(
        f"{name}: param_logical_axes have no config form (they belong to the model, not the "
        f"optimizer). Leave them out of the definition and create it with "
        "create_sharded(params, param_logical_axes, mesh, rules), which passes them"
      )
    if name == "chain":
      return {"name": "chain", "transformations": [
        _transform_config(t) for t in hyper_params["transformations"]
      ]}  # fmt: skip
    defaults = inspect.signature(opt_def.factory).parameters
    return {"name": name, **_non_default(hyper_params, defaults)}
  for name in _legacy_names():
    if type(opt_def) is getattr(legacy, name):
      return {"name": f"legacy.{name}", **_constructor_args(opt_def)}
  if type(opt_def) is _T5XAdafactor:
    return {"name": "adafactor.Adafactor", **_constructor_args(opt_def)}
  raise ConfigError(f"{opt_def!r} has no config form")


# Reading.


def _factory(name: Any, where: str) -> Any:
  if not isinstance(name, str):
    raise ConfigError(f"at {where!r}: expected an optimizer name, found {name!r}")
  legacy_names = _legacy_names()
  if name.startswith("contrib.") and name[8:] in contrib.CONTRIB_OPTIMIZERS:
    return getattr(contrib, name[8:])
  if name in contrib.OWN_OPTIMIZERS:  # optcore's own: no optax name to tell apart from
    return getattr(contrib, name)
  if name.startswith("legacy.") and name[7:] in legacy_names:
    return getattr(legacy, name[7:])
  if name == "adafactor.Adafactor":
    return _T5XAdafactor
  if name in optax_aliases.OPTAX_ALIASES:
    return getattr(optax_aliases, name)
  known = [*optax_aliases.OPTAX_ALIASES, *(f"contrib.{n}" for n in contrib.CONTRIB_OPTIMIZERS)]
  known += [f"legacy.{n}" for n in legacy_names] + ["adafactor.Adafactor", "chain", "multi"]
  raise ConfigError(f"at {where!r}: unknown optimizer {name!r}; known: {', '.join(known)}")


def _check_arguments(name: str, factory: Any, args: Mapping[str, Any], path: str) -> None:
  params = inspect.signature(factory).parameters
  if any(p.kind is p.VAR_KEYWORD for p in params.values()):
    return
  for key in args:
    if key not in params:
      raise ConfigError(
        f"at {_join(path, key)!r}: {name} has no argument {key!r}; its arguments are: "
        f"{', '.join(params)}"
      )


def _is_number(x: Any) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_types(name: str, factory: Any, args: Mapping[str, Any], path: str) -> None:
  """Each argument's type against the factory's signature, naming the field.

  An argument whose default is a number (and every ``learning_rate``, and
  one annotated as a float with default None) takes a number or a schedule;
  a numeric string is refused, not coerced, with the fix; None is refused
  where the default is not None. A flag takes a bool.
  A learning rate without a default must be given; flax.optim's and T5X's
  definitions default it to None ("pass it every step"), which a config
  cannot do, so a config must give it too.
  """
  params = inspect.signature(factory).parameters
  is_legacy = name.startswith("legacy.") or name == "adafactor.Adafactor"
  for key, p in params.items():
    required = p.default is inspect.Parameter.empty and p.kind not in (
      p.VAR_KEYWORD,
      p.VAR_POSITIONAL,
    )
    if key not in args and (required or (is_legacy and key == "learning_rate")):
      raise ConfigError(
        f"at {_join(path, key)!r}: {name} needs {key!r}; add it to the config"
        + (', e.g. "learning_rate": 1e-3' if key == "learning_rate" else "")
      )
  for key, value in args.items():
    p = params.get(key)
    if p is None:
      continue
    where = _join(path, key)
    # A number by its default, its name, or its annotation (float, int, optax's Numeric).
    # An enum's member (Shampoo's graft_type) is an int by type, not a number to a config.
    by_default = _is_number(p.default) and not isinstance(p.default, enum.Enum)
    numeric = by_default or key.endswith("learning_rate") or takes_numbers(p)
    if numeric:
      if isinstance(value, Mapping) and "schedule" in value:
        continue
      if value is None and (p.default is None and not (is_legacy and key == "learning_rate")):
        continue
      if isinstance(value, str):
        try:
          float(value)
        except ValueError:
          raise ConfigError(
            f"at {where!r}: expected a number, found the string {value!r}"
          ) from None
        raise ConfigError(
          f"at {where!r}: expected a number, found the string {value!r}; numeric strings are "
          "refused, not converted. Write it as a number (YAML 1.1 reads 1e-3 as a string: "
          "write 1.0e-3)."
        )
      if not _is_number(value) and not _takes_other_values(p, value):
        raise ConfigError(
          f"at {where!r}: expected a number"
          + (" or a schedule" if key.endswith("learning_rate") else "")
          + f", found {value!r}"
          + (" (an empty YAML field reads as None)" if value is None else "")
        )
      if _is_number(value):
        _check_finite(value, where)
    elif isinstance(p.default, bool) and not isinstance(value, bool):
      raise ConfigError(f"at {where!r}: {key} is a flag: expected true or false, found {value!r}")


def _int_keys(value: Any) -> Any:
  if isinstance(value, Mapping) and value and all(str(k).isdigit() for k in value):
    return {int(k): v for k, v in value.items()}
  return value


def _takes_other_values(p: inspect.Parameter, value: Any) -> bool:
  """A value besides a number that the argument's annotation admits: None for
  Optional[...] (or a None default), a list, a mapping, a callable config."""
  if value is None:
    return p.default is None or type(None) in annotation_args(p)
  if isinstance(value, Mapping) and "name" in value:  # an optimizer config, where one fits
    return False
  origins = {typing.get_origin(a) or a for a in annotation_args(p)}
  return isinstance(value, (list, Mapping)) and bool(
    origins & {list, tuple, dict, collections.abc.Sequence, collections.abc.Mapping}
  )


def _check_finite(value: Any, where: str) -> None:
  """A config number is finite and fits float32 (JAX's default), as an override must."""
  try:
    as_float = float(value)
  except OverflowError:
    as_float = math.inf
  if not math.isfinite(as_float) or abs(as_float) > float(np.finfo(np.float32).max):
    shown = f"an integer of {len(str(value))} digits" if isinstance(value, int) else repr(value)
    raise ConfigError(
      f"at {where!r}: {shown} is not a finite number that float32 can hold; every value it "
      "touches would become NaN or infinite. Write a finite number."
    )


def _value(key: str, value: Any, where: str) -> Any:
  if isinstance(value, Mapping) and "schedule" in value:
    kwargs = {k: v for k, v in value.items() if k != "schedule"}
    own = OWN_SCHEDULES.get(value["schedule"])
    if own is not None:
      try:
        return own(**kwargs)
      except (TypeError, ValueError) as e:
        raise ConfigError(f"at {where!r}: {e}") from None
    try:
      return Schedule(value["schedule"], **kwargs)
    except ConfigError as e:
      message = str(e)
      if message.startswith("at '"):  # a field of the schedule: name it from the config's root
        return _raise(f"at '{where}.{message[4:]}")
      raise ConfigError(f"at {where!r}: {e}") from None
  if isinstance(value, Mapping) and "name" in value:
    return from_config(value, _path=where)
  if isinstance(value, Mapping) and "transform" in value:  # e.g. masked's inner transformation
    return _transform(value, where)
  if isinstance(value, Mapping):  # e.g. T5X Adafactor's logical_factor_rules
    return {str(k): _value(str(k), v, _join(where, str(k))) for k, v in value.items()}
  if "dtype" in key and isinstance(value, str):
    try:
      dtype = jnp.dtype(value)
    except TypeError:
      raise ConfigError(f"at {where!r}: {value!r} is not a dtype name") from None
    if not jnp.issubdtype(dtype, jnp.inexact):
      raise ConfigError(
        f"at {where!r}: {value!r} is not a floating dtype; optimizer state is kept in a float "
        "dtype (an integer one would truncate it to 0). Write e.g. 'bfloat16' or 'float32'."
      )
    return dtype
  if isinstance(value, (bool, int, float, str)) or value is None:
    return value
  if isinstance(value, list):
    return [_value(key, v, f"{where}[{i}]") for i, v in enumerate(value)]
  raise ConfigError(f"at {where!r}: {value!r} is not a config value (number, string, bool, None)")


def _multi(args: Mapping[str, Any], path: str) -> MultiOptimizer:
  groups = args.get("groups")
  if set(args) != {"groups"} or not isinstance(groups, list) or not groups:
    raise ConfigError(f"at {_join(path, 'groups')!r}: 'multi' takes a non-empty 'groups' list")
  pairs = []
  for i, group in enumerate(groups):
    where = _join(path, f"groups[{i}]")
    if not isinstance(group, Mapping) or set(group) != {"select", "optimizer"}:
      raise ConfigError(f"at {where!r}: a group is {{'select': regex, 'optimizer': config}}")
    if not isinstance(group["select"], str):
      raise ConfigError(f"at {_join(where, 'select')!r}: expected a regex string")
    pairs.append(
      (group["select"], from_config(group["optimizer"], _path=_join(where, "optimizer")))
    )
  return MultiOptimizer(*pairs)


def _wrapper(name: str, args: Mapping[str, Any], path: str) -> OptimizerDef:
  """A wrapper from its config: ``optimizer`` and the arguments its ``config_arguments`` name."""
  cls = WRAPPERS[name]
  required = {k for k, v in cls.config_arguments.items() if v is REQUIRED}
  if "optimizer" not in args or not required <= set(args) <= {"optimizer", *cls.config_arguments}:
    keys = ", ".join(f"{k!r}" for k in sorted(cls.config_arguments))
    raise ConfigError(
      f"at {path or 'config'!r}: {name!r} takes {{'optimizer': config, {keys}}} (required: "
      f"{sorted({'optimizer', *required})}), found the keys {sorted(args)}"
    )
  inner = from_config(args["optimizer"], _path=_join(path, "optimizer"))
  settings = {
    k: from_config(v, _path=_join(path, k))
    if k in cls.definition_arguments and v is not None
    else v
    for k, v in args.items()
    if k != "optimizer"
  }
  try:
    return cls(inner, **settings)
  except ArgumentError as e:  # a declared argument: name its field
    raise ConfigError(f"at {_join(path, e.argument)!r}: {name}: {e.message}") from None
  except (TypeError, ValueError) as e:
    said = str(e) if str(e).startswith(name) else f"{name}: {e}"  # its own name once
    raise ConfigError(f"at {path or 'config'!r}: {said}") from None


def _chain(args: Mapping[str, Any], path: str) -> OptaxWrapper:
  items = args.get("transformations")
  if set(args) != {"transformations"} or not isinstance(items, list):
    raise ConfigError(f"at {_join(path, 'transformations')!r}: 'chain' takes a list")
  built = []
  for i, item in enumerate(items):
    where = _join(path, f"transformations[{i}]")
    if isinstance(item, Mapping) and "transform" in item:
      built.append(_transform(item, where))
    else:
      built.append(from_config(item, _path=where))
  try:
    return chain(built)
  except (TypeError, ValueError) as e:  # chain's own check names the member by its index
    message = str(e).removeprefix("chain(): ")
    index = message.split("]", 1)[0].removeprefix("transformations[")
    field = f"transformations[{index}]" if index.isdigit() else "transformations"
    raise ConfigError(f"at {_join(path, field)!r}: {message}") from None


class _Transform:
  """An optax transformation by name, remembered for `to_config`."""

  def __init__(self, name: str, kwargs: dict[str, Any]):
    self.name, self.kwargs = name, kwargs
    # Where optax takes a transformation, an optimizer the config built goes in as one.
    built = {k: _as_transformation(v) for k, v in kwargs.items()}
    self.tx = getattr(optax, name)(**built)
    self.init, self.update = self.tx.init, self.tx.update

  def __eq__(self, other: object) -> bool:
    return isinstance(other, _Transform) and _key(self) == _key(other)

  def __hash__(self) -> int:  # by value: kwargs may hold dicts (a mask) and definitions
    return hash(_key(self))

  def __repr__(self) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
    return f"optax.{self.name}({inner})"


def _public_optax_function(module: Any, name: Any) -> bool:
  """A config (maybe from an untrusted file) names public optax functions only:
  no private or dunder name, no class, module or builtin."""
  if not isinstance(name, str) or name.startswith("_"):
    return False
  fn = getattr(module, name, None)
  if isinstance(fn, functools.partial):
    fn = fn.func
  return inspect.isfunction(fn) and fn.__module__.split(".")[0] == "optax"


def _as_transformation(value: Any) -> Any:
  if isinstance(value, OptimizerDef):
    return value.as_optax()
  return value.tx if isinstance(value, _Transform) else value


def _builds_transformation(fn: Any) -> bool:
  """Whether optax declares that ``fn`` returns a GradientTransformation: known
  before anything is called."""
  returned = inspect.signature(fn).return_annotation
  return isinstance(returned, type) and issubclass(returned, optax.GradientTransformation)


def _transform(item: Mapping[str, Any], where: str) -> _Transform:
  name = item["transform"]
  if not _public_optax_function(optax, name):
    raise ConfigError(
      f"at {_join(where, 'transform')!r}: {name!r} is not a public optax transformation; name "
      "one of optax's functions, e.g. 'clip_by_global_norm'"
    )
  if not _builds_transformation(getattr(optax, name)):
    raise ConfigError(
      f"at {_join(where, 'transform')!r}: optax.{name} does not build a transformation (optax "
      "declares another return type), so it is not called; name a function that returns a "
      "GradientTransformation, e.g. 'clip_by_global_norm'"
    )
  args = {k: v for k, v in item.items() if k != "transform"}
  fn = getattr(optax, name)
  _check_arguments(f"optax.{name}", fn, args, where)
  _check_types(f"optax.{name}", fn, args, where)
  kwargs = {k: _value(k, v, _join(where, k)) for k, v in args.items()}
  try:
    return _Transform(name, kwargs)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"at {where!r}: optax.{name}: {e}") from None


# Writing.


def _optax_name(opt_def: OptaxWrapper) -> str:
  name = opt_def.display_name()
  if name in optax_aliases.OPTAX_ALIASES or name == "chain":
    return name
  if name.startswith("contrib.") and name[8:] in contrib.CONTRIB_OPTIMIZERS:
    return name
  if name in contrib.CONTRIB_OPTIMIZERS:
    return f"contrib.{name}"
  raise ConfigError(f"{opt_def!r} is not an optax alias, contrib optimizer or chain")


def _transform_config(item: Any) -> dict[str, Any]:
  if isinstance(item, _Transform):
    return {"transform": item.name, **{k: _write(k, v) for k, v in item.kwargs.items()}}
  if isinstance(item, OptimizerDef):
    return to_config(item)
  raise ConfigError(f"the chain member {item!r} has no config form (build it from a config)")


def _write(key: str, value: Any) -> Any:
  if isinstance(value, Schedule):
    return {"schedule": value.name, **value.kwargs}
  if isinstance(value, WritesConfig):  # optcore's own schedules say what to write
    return dict(value.optcore_config)
  if isinstance(value, OptimizerDef):
    return to_config(value)
  if isinstance(value, _Transform):
    return _transform_config(value)
  if isinstance(value, (list, tuple)):
    return [_write(key, v) for v in value]
  if isinstance(value, Mapping):
    return {str(k): _write(str(k), v) for k, v in value.items()}
  if isinstance(value, FactorDim):
    return value.name.lower()
  if isinstance(value, (np.dtype, type)) or ("dtype" in key and value is not None):
    return jnp.dtype(cast(Any, value)).name
  if isinstance(value, (np.generic, np.ndarray)):
    return value.item() if np.ndim(value) == 0 else value.tolist()
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  raise ConfigError(f"the hyper-parameter {key!r} = {value!r} has no config form")


def _constructor_args(opt_def: OptimizerDef) -> dict[str, Any]:
  params = inspect.signature(type(opt_def).__init__).parameters
  values = {
    # Constructor arguments that are not hyper-parameters are attributes (dtype_momentum, ...).
    name: opt_def.hyper_params[name] if name in opt_def.hyper_params else getattr(opt_def, name)
    for name in list(params)[1:]
  }
  return _non_default(values, params)


def _non_default(values: Mapping[str, Any], params: Mapping[str, inspect.Parameter]) -> dict:
  """The values that differ from the signature's defaults, written as config values."""
  out = {}
  for name, value in values.items():
    default = params[name].default if name in params else inspect.Parameter.empty
    if default is not inspect.Parameter.empty and static_key(value) == static_key(default):
      continue
    out[name] = _write(name, value)
  return out


def _key(item: Schedule | _Transform) -> Any:
  return static_key((item.name, item.kwargs))


def _raise(message: str) -> Any:
  raise ConfigError(message) from None


def _join(path: str, key: str) -> str:
  return f"{path}.{key}" if path and not key.startswith("[") else f"{path}{key}" if path else key
