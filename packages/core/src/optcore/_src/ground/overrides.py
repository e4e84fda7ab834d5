"""Per-step hyper-parameter overrides: which are accepted, where they go, which are refused.

Every face resolves overrides here, through its definition's
`update_hyper_params`, so an override is honoured or refused the same way in
the core, Flax, Equinox and Treex faces:

- `resolve`: ``hyper_params=`` replaces all, a keyword replaces one; an
  unknown name is a TypeError, a value that does not fit (None, a string, a
  non-finite number, another shape) is refused by `check_override`, and a
  constructor-only one warns that it changes nothing;
- `reachable_names` / `route`: an override reaches the wrapped optax
  factories among a factory's arguments (``chain([adamw(...)])``);
- `check_state_effect`: for a wrapped optax factory, an override that would
  change the state's layout, or that only enters the initial state (rprop's
  learning rate), is refused. Checked once per override signature.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeGuard, cast, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from optcore._src.ground import paths
from optcore._src.ground.hyper_params import (
  HyperParams,
  is_numeric,
  static_key,
  unknown_names_message,
)
from optcore._src.ground.user_warnings import warn

PyTree = Any
_TracerErrors = (
  jax.errors.ConcretizationTypeError,
  jax.errors.TracerBoolConversionError,
  jax.errors.TracerIntegerConversionError,
)
_CHECK_CACHE_SIZE = 256
# Override signatures already checked, per definition, oldest first: a jitted step
# retraces with the same avals, and the check (a make_jaxpr of init) need not rerun.
_CHECKED: collections.OrderedDict = collections.OrderedDict()


def resolve(optimizer_def: Any, **hyper_param_overrides: Any) -> HyperParams:
  """`OptimizerDef.update_hyper_params`: the hyper-parameters for one step."""
  hyper_params: Any = hyper_param_overrides.pop("hyper_params", optimizer_def.hyper_params)
  own = optimizer_def.hyper_params
  if dataclasses.is_dataclass(hyper_params) and not isinstance(hyper_params, type):
    # flax.optim's struct dataclass of hyper-parameters, as a user's own definition has it.
    hyper_params = {f.name: getattr(hyper_params, f.name) for f in dataclasses.fields(hyper_params)}
  if isinstance(own, HyperParams) and not isinstance(hyper_params, Mapping):
    raise TypeError(
      f"{optimizer_def!r}: hyper_params= takes the hyper-parameters by name (a dict or "
      f"optcore.HyperParams, e.g. optimizer.optimizer_def.hyper_params.replace(...)), found "
      f"a {type(hyper_params).__name__}. A list of them is for a MultiOptimizer, one per group."
    )
  if isinstance(hyper_params, Mapping) and isinstance(own, HyperParams):
    if not isinstance(hyper_params, HyperParams) or set(hyper_params) != set(own):
      # Some names only (a plain dict): the rest keep the definition's values, not the
      # factory's defaults, and each given one is checked as a keyword override is.
      hyper_param_overrides = {**hyper_params, **hyper_param_overrides}
      hyper_params = own
  ignored = sorted(set(hyper_param_overrides) & set(optimizer_def.constructor_only))
  if ignored:
    warn(
      f"{optimizer_def.display_name()}: the override(s) {ignored} have no effect: the original "
      f"algorithm reads them from the constructor only, and so does optcore, to keep its "
      f"numbers. Build a new definition with {ignored[0]}=... to change it.",
      UserWarning,
    )
  if hyper_param_overrides:
    try:
      replaced = cast(HyperParams, hyper_params).replace(**hyper_param_overrides)
    except TypeError as e:
      raise TypeError(f"{optimizer_def!r}: {e}") from None
    for name, value in hyper_param_overrides.items():
      if value is None and name in optimizer_def.none_means_off:
        continue  # the original's code reads None as "off"
      check_override(optimizer_def.display_name(), name, cast(Any, hyper_params)[name], value)
    hyper_params = replaced
  return cast(HyperParams, hyper_params)


@runtime_checkable
class NestedDefinition(Protocol):
  """What a definition among a factory's arguments (``chain([..., optcore.adamw(...)])``)
  offers the override route: its factory (None for a ready transformation), its
  hyper-parameters, and a copy with others. `OptaxWrapper` has it; this lower module asks for
  the protocol, not for that class."""

  factory: Any
  hyper_params: Any

  def update_hyper_params(self, **hyper_param_overrides: Any) -> Any: ...

  def with_hyper_params(self, hyper_params: Any) -> Any: ...


def _is_nested(value: Any) -> TypeGuard[NestedDefinition]:
  """A wrapped optax factory (``optcore.adamw(...)``) among a factory's arguments."""
  return isinstance(value, NestedDefinition) and value.factory is not None


def _items(value: Any) -> tuple:
  return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def reachable_names(hyper_params: HyperParams) -> set[str]:
  """The hyper-parameter names of the wrapped factories among ``hyper_params``."""
  names: set[str] = set()
  for value in hyper_params.values():
    for item in _items(value):
      if _is_nested(item):
        names |= set(item.hyper_params) | reachable_names(item.hyper_params)
  return names


def reachable_values(hyper_params: Mapping[str, Any]) -> dict[str, Any]:
  """The hyper-parameters of the wrapped factories among ``hyper_params``, by name."""
  values: dict[str, Any] = {}
  for value in hyper_params.values():
    for item in _items(value):
      if _is_nested(item):
        values.update({**reachable_values(item.hyper_params), **item.hyper_params})
  return values


def path_names(hyper_params: Mapping[str, Any]) -> set[str]:
  """The names of the nested definitions' hyper-parameters by their path, as
  `optcore.current_hyper_params` reports them: ``transformations/1/learning_rate`` for the
  second member of a ``chain``, ``base_optimizer/learning_rate`` for ``mechanize``'s."""
  names: set[str] = set()
  for key, value in hyper_params.items():
    items = value if isinstance(value, (list, tuple)) and not hasattr(value, "_fields") else None
    for index, item in enumerate(_items(value)):
      if _is_nested(item):
        where = f"{key}/{index}" if items is not None else key
        inner = set(item.hyper_params) | path_names(item.hyper_params)
        names |= {f"{where}/{name}" for name in inner}
  return names


def _route_by_path(value: Any, rest: list[str], override: Any, owner: str, path: str) -> Any:
  """``value`` (an argument) with the override at ``rest`` (``['1', 'learning_rate']`` in a
  list, ``['learning_rate']`` in a definition) given to the definition it names."""
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
    index = int(rest[0]) if rest and rest[0].isdigit() else -1
    if not 0 <= index < len(value):
      raise TypeError(f"{owner}: {path!r} names no member (it has {len(value)})")
    items = list(value)
    items[index] = _route_by_path(items[index], rest[1:], override, owner, path)
    return type(value)(items)
  if not _is_nested(value) or not rest:
    raise TypeError(f"{owner}: {path!r} names no optimizer's hyper-parameter")
  name = "/".join(rest)
  return value.with_hyper_params(value.update_hyper_params(**{name: override}))


def route(value: Any, overrides: Mapping[str, Any]) -> Any:
  """``value`` with the overrides its wrapped factories take applied to them."""
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
    return type(value)(route(v, overrides) for v in value)
  if _is_nested(value):
    reachable = set(value.hyper_params) | reachable_names(value.hyper_params)
    applicable = {k: v for k, v in overrides.items() if k in reachable}
    if applicable:
      return value.with_hyper_params(value.update_hyper_params(**applicable))
  return value


def route_nested(
  owner: str, hyper_params: HyperParams, hyper_param_overrides: dict[str, Any]
) -> tuple[HyperParams, dict[str, Any]]:
  """Sends the overrides that name a wrapped definition's hyper-parameters
  (``chain([adamw(...)])`` takes ``weight_decay=``, ``mechanize(base_optimizer=
  ...)`` its base's) to that definition, as a MultiOptimizer does to its
  groups. Returns the hyper-parameters with them routed, and the overrides of
  ``hyper_params``' own names. A name neither has raises TypeError."""
  by_path = {k: v for k, v in hyper_param_overrides.items() if "/" in k and k not in hyper_params}
  if by_path:  # transformations/1/learning_rate: the one definition the path names
    values = dict(hyper_params)
    for key, value in by_path.items():
      first, *rest = key.split("/")
      if first not in values:
        raise TypeError(f"{owner}: {key!r} names no argument {first!r}; it has {list(values)}")
      values[first] = _route_by_path(values[first], rest, value, owner, key)
    hyper_params = HyperParams(**values)
    hyper_param_overrides = {k: v for k, v in hyper_param_overrides.items() if k not in by_path}
  nested = {k: v for k, v in hyper_param_overrides.items() if k not in hyper_params}
  reachable = reachable_names(hyper_params) if nested else set()
  if not reachable:
    return hyper_params, hyper_param_overrides
  valid = set(hyper_params) | reachable
  unused = sorted(nested.keys() - valid)
  if unused:
    values = {**reachable_values(hyper_params), **hyper_params}
    raise TypeError(f"{owner}: {unknown_names_message(unused, valid, values)}")
  routed = HyperParams(**{k: route(v, nested) for k, v in hyper_params.items()})
  return routed, {k: v for k, v in hyper_param_overrides.items() if k not in nested}


def changed(base: HyperParams, new: HyperParams) -> dict[str, Any]:
  """The entries of ``new`` that differ from ``base``."""
  if new is base:
    return {}
  return {k: v for k, v in new.items() if static_key(v) != static_key(base[k])}


def guarded(name: str, changed: Mapping[str, Any], fn: Callable[..., Any], *args, **kwargs) -> Any:
  """Calls ``fn``; a tracer error caused by overridden values gets a clear message."""
  try:
    return fn(*args, **kwargs)
  except _TracerErrors as e:
    if not changed:
      raise
    raise TypeError(
      f"{name}: overriding {sorted(changed)} with a traced value failed, because the "
      "optax code branches on that value in Python. Pass a Python number (not a jax array) "
      "for it, or create the optimizer with that value."
    ) from e


def check_state_effect(
  wrapper: Any, changed: dict[str, Any], params: PyTree, opt_state: PyTree
) -> None:
  """Refuses overrides of a wrapped optax factory that would change the state's
  layout or that only enter the initial state. ``wrapper`` has
  ``transformation_for(hyper_params)``."""
  traced = {k: v for k, v in changed.items() if is_numeric(v)}
  try:
    _check_layout_and_init_use(wrapper, changed, traced, params, opt_state)
  except TypeError:
    # optax branches on a value in Python: concrete values may still go in
    # as constants (only the layout can be checked then); traced ones cannot.
    if any(isinstance(v, Tracer) for v in traced.values()):
      raise
    _check_layout_and_init_use(wrapper, changed, {}, params, opt_state)


def _check_layout_and_init_use(
  wrapper: Any, changed: dict[str, Any], traced: dict[str, Any], params: PyTree, opt_state: PyTree
) -> None:
  name = wrapper.display_name()
  static = {k: v for k, v in changed.items() if k not in traced}
  key = (
    wrapper,
    tuple(sorted((k, _aval(v)) for k, v in traced.items())),
    tuple(sorted((k, static_key(v)) for k, v in static.items())),
    jax.tree.structure(params),
    tuple(_aval(x) for x in jax.tree.leaves(params)),
  )
  if key in _CHECKED:
    _CHECKED.move_to_end(key)
    return
  params_avals = jax.tree.map(_aval, params)

  def init_with(traced_values: dict[str, Any], params: PyTree) -> PyTree:
    hyper_params = wrapper.hyper_params.replace(**static, **traced_values)
    return wrapper.transformation_for(hyper_params).init(params)

  traced_avals = {k: _aval(v) for k, v in traced.items()}
  closed, out_shape = guarded(
    name, changed, jax.make_jaxpr(init_with, return_shape=True), traced_avals, params_avals
  )
  schedules = sorted(
    k for k in changed if callable(wrapper.hyper_params[k]) and not callable(changed[k])
  )
  _check_state_layout(name, changed, out_shape, opt_state, schedules)
  in_init = _inputs_used(closed.jaxpr, len(jax.tree.leaves(traced_avals)))
  names = [k for k, _ in sorted(traced.items())]
  init_only = [n for n, used in zip(names, in_init, strict=True) if used]
  if init_only:
    raise ValueError(
      f"{name}: the hyper-parameter(s) {init_only} set the optimizer's initial state "
      "(its state is built from them at init), so an override at apply time cannot take "
      f"effect. Create the optimizer with the value you want instead: {name}("
      + ", ".join(f"{n}=..." for n in init_only)
      + ")."
    )
  _CHECKED[key] = True
  if len(_CHECKED) > _CHECK_CACHE_SIZE:
    _CHECKED.popitem(last=False)


def _aval(x: Any) -> jax.ShapeDtypeStruct:
  # Keep weak types: a Python float must promote in the check as it does in the step.
  aval = jax.typeof(x)
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def _inputs_used(jaxpr: Any, n: int) -> list[bool]:
  """Whether each of the first ``n`` inputs of ``jaxpr`` reaches an output.

  A backward liveness pass: values computed and dropped (optax builds
  ``-learning_rate`` in the factory even where init never reads it) do not
  count. An equation with a live output keeps all its inputs live.
  """
  live = {id(v) for v in jaxpr.outvars}
  for eqn in reversed(jaxpr.eqns):
    if eqn.effects or any(id(v) in live for v in eqn.outvars):
      live.update(id(v) for v in eqn.invars)
  return [id(v) in live for v in jaxpr.invars[:n]]


def _check_state_layout(
  name: str,
  changed: Mapping[str, Any],
  new_shapes: PyTree,
  opt_state: PyTree,
  schedules: list[str] | None = None,
) -> None:
  expected = jax.tree_util.tree_flatten_with_path(opt_state)[0]
  found = jax.tree_util.tree_flatten_with_path(new_shapes)[0]
  if jax.tree.structure(opt_state) == jax.tree.structure(new_shapes):
    mismatch = [
      (p, e, f)
      for (p, e), (_, f) in zip(expected, found, strict=True)
      if (jnp.shape(e), jnp.result_type(e)) != (f.shape, f.dtype)
    ]
    if not mismatch:
      return
    p, e, f = mismatch[0]
    detail = (
      f"at {paths.path_str(p)!r} the state holds shape {jnp.shape(e)} {jnp.result_type(e)}, "
      f"the override would need {f.shape} {f.dtype}"
    )
  else:
    detail = (
      f"the state would change from {jax.tree.structure(opt_state)} "
      f"to {jax.tree.structure(new_shapes)}"
    )
  if schedules:  # a schedule's count is state: a number in its place drops it
    fix = (
      f"{name} was built with a schedule for {schedules[0]}, and optax keeps the schedule's "
      "step count in the state: override it with a schedule too, "
      f"{schedules[0]}=lambda count: 1e-4 (any function of the count)."
    )
  else:
    fix = (
      "Overrides last one step and cannot add or reshape state; create the optimizer with "
      "that setting instead (for example optcore.sgd(lr, momentum=0.9) rather than overriding "
      "momentum)."
    )
  raise ValueError(
    f"{name}: overriding {sorted(changed)} would change the optimizer state's layout "
    f"({detail}). {fix}"
  )


def check_override(owner: str, name: str, current: Any, value: Any) -> None:
  """Raises TypeError or ValueError, naming ``name``, for an override value that
  does not fit the hyper-parameter (``owner`` names the definition).

  A number (or a scalar array) takes a number, a scalar array (traced or not)
  or a schedule; never None (optax reads it as "no scaling"), a string, a bool
  or an array of another shape. A flag takes a bool. Other values (schedules,
  masks, dtypes, lists of transformations) are not checked.

  Example:
    >>> from optcore._src.ground.overrides import check_override
    >>> check_override('adam', 'learning_rate', 1e-3, '1e-3')
    Traceback (most recent call last):
    ...
    TypeError: adam: the override learning_rate='1e-3' is a str; learning_rate takes a number ...
  """
  if isinstance(current, bool) or (_is_array(current) and _dtype_kind(current) == "b"):
    if not (isinstance(value, bool) or (_is_array(value) and _dtype_kind(value) == "b")):
      raise TypeError(
        f"{owner}: the override {name}={value!r} is a {type(value).__name__}; {name} is a flag "
        f"and takes True or False."
      )
    if isinstance(value, Tracer):
      raise TypeError(
        f"{owner}: the override {name} is a traced boolean; {name} is a flag that chooses which "
        "code the step runs, so it must be a Python bool when the step is traced. Pass "
        f"{name}=True or False, and mark it static if it is an argument of the jitted function "
        f"(jax.jit(step, static_argnames='{name}'))."
      )
    return
  if not is_numeric(current):
    return
  if value is None:
    raise ValueError(
      f"{owner}: the override {name}=None is refused: the optimizer was built with "
      f"{name}={current!r}, and None would mean something else (for a learning rate in "
      f"optax: no scaling at all, a step of the raw gradient). Pass a number, or leave "
      f"{name} out to keep {current!r}."
    )
  if callable(value) and not _is_array(value):
    value = _schedule_output(owner, name, value)  # a schedule of the step count, as optax takes
  if isinstance(value, bool) or not (is_numeric(value) or _is_array(value)):
    raise TypeError(
      f"{owner}: the override {name}={value!r} is a {type(value).__name__}; {name} takes a "
      f"number or a scalar array (traced values included), e.g. {name}={current!r}."
    )
  if _dtype_kind(value) not in "iufc":
    raise TypeError(
      f"{owner}: the override {name} has dtype {_dtype_of(value)}; {name} takes a number or a "
      "scalar array of numbers."
    )
  if _dtype_kind(value) == "c" and _dtype_kind(current) != "c":
    raise TypeError(
      f"{owner}: the override {name}={value!r} is complex; {name} takes a real number (the "
      "imaginary part would be dropped silently). Pass its real part if that is what you mean."
    )
  abstract = isinstance(value, (Tracer, jax.ShapeDtypeStruct))
  if not abstract and not np.all(np.isfinite(np.asarray(value))):
    raise ValueError(
      f"{owner}: the override {name}={value!r} is not finite; every parameter it touches "
      "would become NaN or infinite. Check the schedule or value that produced it."
    )
  want = tuple(getattr(current, "shape", ()))
  if tuple(getattr(value, "shape", ())) != want:
    raise ValueError(
      f"{owner}: the override {name} has shape {tuple(getattr(value, 'shape', ()))}; {name} takes "
      + ("a scalar" if not want else f"shape {want}")
      + " (one value for every parameter; a per-parameter value would broadcast silently)."
    )


def check_schedule(owner: str, name: str, schedule: Any) -> None:
  """Raises where a schedule given to a constructor (``optcore.sgd(lambda count: ...)``) does
  not return one number per step: traced once, abstractly, as an override's schedule is
  (None ended in a bare optax TypeError; a vector was broadcast over every parameter)."""
  out = _schedule_output(owner, name, schedule)
  if out.shape != () or np.dtype(out.dtype).kind not in "iuf":
    raise ValueError(
      f"{owner}: the schedule given for {name} returns {out.dtype}{list(out.shape)} for a step "
      "count; a schedule returns one real number (a scalar) for each step, the same for every "
      "parameter (a vector would broadcast silently)."
    )


def _schedule_output(owner: str, name: str, schedule: Any) -> Any:
  """What ``schedule(count)`` gives, as an abstract value (traced once, at trace time),
  so its output is checked as a plain override would be; None is refused here."""
  try:
    out = jax.eval_shape(schedule, jax.ShapeDtypeStruct((), jnp.int32))
  except Exception as e:
    raise TypeError(
      f"{owner}: the override {name}={schedule!r} is a callable, so it is read as a schedule "
      f"of the step count, but calling it with a step count failed: {type(e).__name__}: {e}"
    ) from e
  if out is None or not _is_array(out):
    raise TypeError(
      f"{owner}: the schedule given for {name} returns {out!r} for a step count; a schedule "
      f"returns a number (a scalar) for each step, e.g. lambda count: 1e-3 * 0.99 ** count."
    )
  return jax.ShapeDtypeStruct(out.shape, out.dtype)  # checked below like a traced value


def _is_array(x: Any) -> bool:
  return hasattr(x, "shape") and hasattr(x, "dtype")


def _dtype_of(x: Any) -> np.dtype:
  return np.dtype(x.dtype) if _is_array(x) else np.asarray(x).dtype


def _dtype_kind(x: Any) -> str:
  if _is_array(x):
    return np.dtype(x.dtype).kind
  return np.asarray(x).dtype.kind
