"""Optimizer configs as plain data: one JSON/YAML-able dict drives every adapter.

A config names an optimizer and its hyper-parameters::

  {"name": "adamw", "learning_rate": 1e-3, "weight_decay": 0.1}

`to_config` writes the hyper-parameters that differ from their defaults.
``name`` is an optax alias (``"adamw"``), a contrib optimizer
(``"contrib.muon"``), a legacy algorithm (``"legacy.Adam"``), T5X's Adafactor
(``"adafactor.Adafactor"``), ``"chain"`` (``"transformations"``: a list of
optimizer configs or optax transforms ``{"transform": "clip_by_global_norm",
"max_norm": 1.0}``) or ``"multi"`` (``"groups"``: a list of ``{"select":
regex, "optimizer": config}``). A hyper-parameter may be a schedule by name:
``{"schedule": "cosine_decay_schedule", "init_value": 1e-3, "decay_steps":
1000}``; dtypes are written by name (``"bfloat16"``).

Example:
  >>> import optcore
  >>> config = {
  ...   "name": "multi",
  ...   "groups": [
  ...     {"select": "kernel$", "optimizer": {"name": "adamw", "learning_rate": 1e-3}},
  ...     {"select": "bias$", "optimizer": {"name": "legacy.Momentum", "learning_rate": 0.1}},
  ...   ],
  ... }
  >>> opt_def = optcore.config.from_config(config)
  >>> optcore.config.from_config(optcore.config.to_config(opt_def)) == opt_def
  True
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

from optcore import contrib, legacy
from optcore._src import optax_aliases
from optcore._src.adafactor import Adafactor as _T5XAdafactor
from optcore._src.adafactor import FactorDim
from optcore._src.base import OptimizerDef
from optcore._src.hyper_params import static_key
from optcore._src.multi_optimizer import MultiOptimizer
from optcore._src.optax_wrapper import OptaxWrapper, chain


class ConfigError(ValueError):
  """A config that does not describe an optimizer; the message names the field."""


ConfigError.__module__ = "optcore.config"

_LEGACY = (
  "GradientDescent Momentum Adam AdaBelief Adadelta Adagrad RMSProp LAMB LARS Adafactor".split()
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

  def __init__(self, name: str, **kwargs: Any):
    factory = getattr(optax.schedules, name, None)
    if not _public_optax_function(optax.schedules, name) or not name.endswith("schedule"):
      raise ConfigError(f"optax.schedules has no schedule {name!r}")
    self.name, self.kwargs = name, dict(kwargs)
    try:
      self._fn = factory(**kwargs)
    except TypeError as e:
      raise ConfigError(f"schedule {name!r}: {e}") from None

  def __call__(self, count: Any) -> Any:
    return self._fn(count)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, Schedule) and (self.name, self.kwargs) == (other.name, other.kwargs)

  def __hash__(self) -> int:
    return hash((self.name, tuple(sorted(self.kwargs.items()))))

  def __repr__(self) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
    return f"Schedule({self.name!r}, {inner})"


def from_config(config: Mapping[str, Any], *, _path: str = "") -> OptimizerDef:
  """The `OptimizerDef` a config describes; `ConfigError` names a bad field."""
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
  factory = _factory(name, _join(_path, "name"))
  _check_arguments(name, factory, args, _path)
  _check_types(name, factory, args, _path)
  kwargs = {k: _value(k, v, _join(_path, k)) for k, v in args.items()}
  try:
    return factory(**kwargs)
  except (TypeError, ValueError) as e:
    raise ConfigError(f"at {where!r}: {name}: {e}") from None


def to_config(opt_def: OptimizerDef) -> dict[str, Any]:
  """The config of ``opt_def``: JSON-able, the non-default hyper-parameters.

  Raises `ConfigError` for what a config cannot express (selectors other than
  regexes, ready optax transformations, schedules that are not `Schedule` objects).
  """
  if isinstance(opt_def, MultiOptimizer):
    groups = []
    for i, (selector, sub) in enumerate(
      zip(opt_def.traversals, opt_def.sub_optimizers, strict=True)
    ):
      if not isinstance(selector, str):
        raise ConfigError(f"group {i}: only regex selectors can be written to a config")
      groups.append({"select": selector, "optimizer": to_config(sub)})
    return {"name": "multi", "groups": groups}
  if isinstance(opt_def, OptaxWrapper):
    if opt_def.factory is None:
      raise ConfigError(f"{opt_def!r} wraps a ready optax transformation: it has no config")
    name = _optax_name(opt_def)
    hyper_params = dict(opt_def.hyper_params)
    if name == "chain":
      return {"name": "chain", "transformations": [
        _transform_config(t) for t in hyper_params["transformations"]
      ]}  # fmt: skip
    defaults = inspect.signature(opt_def.factory).parameters
    return {"name": name, **_non_default(hyper_params, defaults)}
  for name in _LEGACY:
    if type(opt_def) is getattr(legacy, name):
      return {"name": f"legacy.{name}", **_constructor_args(opt_def)}
  if type(opt_def) is _T5XAdafactor:
    return {"name": "adafactor.Adafactor", **_constructor_args(opt_def)}
  raise ConfigError(f"{opt_def!r} has no config form")


# Reading.


def _factory(name: Any, where: str) -> Any:
  if not isinstance(name, str):
    raise ConfigError(f"at {where!r}: expected an optimizer name, found {name!r}")
  if name.startswith("contrib.") and name[8:] in contrib.CONTRIB_OPTIMIZERS:
    return getattr(contrib, name[8:])
  if name.startswith("legacy.") and name[7:] in _LEGACY:
    return getattr(legacy, name[7:])
  if name == "adafactor.Adafactor":
    return _T5XAdafactor
  if name in optax_aliases.OPTAX_ALIASES:
    return getattr(optax_aliases, name)
  known = [*optax_aliases.OPTAX_ALIASES, *(f"contrib.{n}" for n in contrib.CONTRIB_OPTIMIZERS)]
  known += [f"legacy.{n}" for n in _LEGACY] + ["adafactor.Adafactor", "chain", "multi"]
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
    # A number by its default, its name, or (default None) its annotation: Optional[float].
    annotated = p.default is None and "float" in str(p.annotation)
    numeric = _is_number(p.default) or key.endswith("learning_rate") or annotated
    if numeric:
      if isinstance(value, Mapping) and "schedule" in value:
        continue
      if value is None and (p.default is None and not (legacy and key == "learning_rate")):
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
      if not _is_number(value):
        raise ConfigError(
          f"at {where!r}: expected a number"
          + (" or a schedule" if key.endswith("learning_rate") else "")
          + f", found {value!r}"
          + (" (an empty YAML field reads as None)" if value is None else "")
        )
    elif isinstance(p.default, bool) and not isinstance(value, bool):
      raise ConfigError(f"at {where!r}: {key} is a flag: expected true or false, found {value!r}")


def _value(key: str, value: Any, where: str) -> Any:
  if isinstance(value, Mapping) and "schedule" in value:
    kwargs = {k: v for k, v in value.items() if k != "schedule"}
    try:
      return Schedule(value["schedule"], **kwargs)
    except ConfigError as e:
      raise ConfigError(f"at {where!r}: {e}") from None
  if isinstance(value, Mapping) and "name" in value:
    return from_config(value, _path=where)
  if isinstance(value, Mapping):  # e.g. T5X Adafactor's logical_factor_rules
    return {str(k): _value(str(k), v, _join(where, str(k))) for k, v in value.items()}
  if "dtype" in key and isinstance(value, str):
    try:
      return jnp.dtype(value)
    except TypeError:
      raise ConfigError(f"at {where!r}: {value!r} is not a dtype name") from None
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
  return chain(built)


class _Transform:
  """An optax transformation by name, remembered for `to_config`."""

  def __init__(self, name: str, kwargs: dict[str, Any]):
    self.name, self.kwargs = name, kwargs
    self.tx = getattr(optax, name)(**kwargs)
    if not (
      callable(getattr(self.tx, "init", None)) and callable(getattr(self.tx, "update", None))
    ):
      raise TypeError(f"optax.{name} does not build a transformation (init/update)")
    self.init, self.update = self.tx.init, self.tx.update

  def __eq__(self, other: object) -> bool:
    return isinstance(other, _Transform) and (self.name, self.kwargs) == (other.name, other.kwargs)

  def __hash__(self) -> int:
    return hash((self.name, tuple(sorted(self.kwargs.items()))))

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


def _transform(item: Mapping[str, Any], where: str) -> _Transform:
  name = item["transform"]
  if not _public_optax_function(optax, name):
    raise ConfigError(
      f"at {_join(where, 'transform')!r}: {name!r} is not a public optax transformation; name "
      "one of optax's functions, e.g. 'clip_by_global_norm'"
    )
  kwargs = {k: _value(k, v, _join(where, k)) for k, v in item.items() if k != "transform"}
  try:
    return _Transform(name, kwargs)
  except TypeError as e:
    raise ConfigError(f"at {where!r}: {name}: {e}") from None


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
  if isinstance(value, OptimizerDef):
    return to_config(value)
  if isinstance(value, (list, tuple)):
    return [_write(key, v) for v in value]
  if isinstance(value, Mapping):
    return {str(k): _write(str(k), v) for k, v in value.items()}
  if isinstance(value, FactorDim):
    return value.name.lower()
  if isinstance(value, (np.dtype, type)) or ("dtype" in key and value is not None):
    return jnp.dtype(value).name
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


def _join(path: str, key: str) -> str:
  return f"{path}.{key}" if path and not key.startswith("[") else f"{path}{key}" if path else key


__all__ = ["ConfigError", "Schedule", "from_config", "to_config"]
