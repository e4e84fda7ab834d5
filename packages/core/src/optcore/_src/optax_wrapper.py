"""Optax transformations as optimizer definitions, with honoured overrides.

A wrapped factory keeps its bound arguments as hyper-parameters. An override
at apply time (``learning_rate=lr``) calls the factory again with the new
value, so the step uses it; the state keeps exactly optax's layout. Overrides
that cannot take effect that way are refused with an error instead of being
ignored: one that would change the state's structure, and one that only
enters the optimizer's initial state (rprop's learning_rate).
"""

from __future__ import annotations

import collections
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
import optax.contrib

from optcore._src import partition_rules, paths, serialization
from optcore._src.base import OptimizerDef, OptimizerState, PyTree, check_float_params
from optcore._src.hyper_params import HyperParams, is_numeric, static_key

_TracerErrors = (
  jax.errors.ConcretizationTypeError,
  jax.errors.TracerBoolConversionError,
  jax.errors.TracerIntegerConversionError,
)
_CHECK_CACHE_SIZE = 256


class OptaxWrapper(OptimizerDef):
  """An optax transformation as an `OptimizerDef` (T5X's ``OptaxWrapper``).

  Built from a transformation, it has no hyper-parameters to override. Built
  through `wrap_optax_optimizer` (as every ``optcore.<name>`` is), its
  hyper-parameters are the factory's arguments and apply-time overrides take
  effect. The state is ``OptimizerState(step, <optax state>)`` with the optax
  state exactly as optax lays it out.

  Args:
    optax_optimizer: anything with optax's ``init``/``update`` protocol
      (``GradientTransformation``, ``GradientTransformationExtraArgs``,
      ``optax.MultiSteps``).

  Example:
    >>> import jax.numpy as jnp, optax
    >>> import optcore
    >>> opt = optcore.OptaxWrapper(optax.sgd(0.1)).create({'w': jnp.ones(2)})
    >>> opt.apply_gradient({'w': jnp.ones(2)}).target['w']
    Array([0.9, 0.9], dtype=float32)
  """

  per_parameter_state = False  # optax lays its state out by field, not by parameter

  def __init__(self, optax_optimizer: Any):
    _check_protocol(optax_optimizer)
    self._setup(HyperParams(), None, type(optax_optimizer).__name__)
    self.optax_optimizer = optax_optimizer

  @classmethod
  def _from_factory(
    cls, factory: Callable[..., Any], name: str, args: tuple, kwargs: dict
  ) -> OptaxWrapper:
    try:
      bound = inspect.signature(factory).bind(*args, **kwargs)
    except TypeError as e:
      raise TypeError(f"{name}(): {e}") from None
    bound.apply_defaults()
    self = cls.__new__(cls)
    self._setup(HyperParams(**bound.arguments), factory, name)
    self.optax_optimizer = self._build(self.hyper_params)
    return self

  def _setup(self, hyper_params: HyperParams, factory: Callable[..., Any] | None, name: str):
    OptimizerDef.__init__(self, hyper_params)
    self._factory = factory
    self._signature = inspect.signature(factory) if factory is not None else None
    self._name = name
    # optax's dpsgd clips and noises one gradient per example: a leading batch axis.
    self.per_example_gradients = factory is not None and factory is optax.contrib.dpsgd
    # Override signatures already checked (see _check_overrides), oldest first.
    self._checked: collections.OrderedDict = collections.OrderedDict()

  def _build(self, hyper_params: HyperParams) -> Any:
    """The optax transformation for ``hyper_params``."""
    if self._factory is None:
      return self.optax_optimizer
    arguments = collections.OrderedDict((k, _as_optax(v)) for k, v in hyper_params.items())
    bound = inspect.BoundArguments(self._signature, arguments)
    tx = self._factory(*bound.args, **bound.kwargs)
    _check_protocol(tx, f"{self._name}(...)")
    return tx

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    return OptimizerState(jnp.asarray(0, dtype=jnp.int32), self.optax_optimizer.init(params))

  def apply_gradient(
    self,
    hyper_params: HyperParams,
    params: PyTree,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    changed = _changed(self.hyper_params, hyper_params)
    if changed:
      self._check_overrides(changed, params, state.param_states)
      tx = self._guarded(changed, self._build, hyper_params)
    else:
      tx = self.optax_optimizer
    if extra_args:
      tx = optax.with_extra_args_support(tx)
    updates, new_opt_state = self._guarded(
      changed, tx.update, grads, state.param_states, params, **extra_args
    )
    new_params = optax.apply_updates(params, updates)
    return new_params, OptimizerState(state.step + 1, new_opt_state)

  def display_name(self) -> str:
    return self._name

  def overridable_names(self) -> frozenset[str]:
    """The factory's arguments and the names of wrapped definitions among them
    (``chain([optcore.adamw(...)])`` takes ``learning_rate``); none for a ready
    transformation."""
    if self._factory is None:
      return frozenset()
    return frozenset(self.hyper_params) | _reachable_names(self.hyper_params)

  def update_hyper_params(self, **hyper_param_overrides: Any) -> HyperParams:
    if self._factory is None and hyper_param_overrides.keys() - {"hyper_params"}:
      raise TypeError(
        f"OptaxWrapper({self._name}) was built from a ready optax transformation, so it has no "
        f"hyper-parameters to override (got {sorted(hyper_param_overrides)}). Build it with "
        "optcore.<name>(...) or optcore.wrap_optax_optimizer(factory)(...) to override them "
        "per step."
      )
    hyper_params = hyper_param_overrides.pop("hyper_params", self.hyper_params)
    nested = {k: v for k, v in hyper_param_overrides.items() if k not in hyper_params}
    reachable = _reachable_names(hyper_params) if nested and self._factory is not None else set()
    if reachable:
      # Names of wrapped optimizers among the arguments (chain([adamw(...)]),
      # mechanize(base_optimizer=...)) reach them, as in a MultiOptimizer.
      valid = set(hyper_params) | reachable
      unused = sorted(nested.keys() - valid)
      if unused:
        raise TypeError(
          f"{self!r}: unknown hyper-parameter(s) {unused}; the valid names are: "
          f"{', '.join(sorted(valid))}"
        )
      hyper_params = HyperParams(**{k: _route(v, nested) for k, v in hyper_params.items()})
      hyper_param_overrides = {k: v for k, v in hyper_param_overrides.items() if k not in nested}
    return super().update_hyper_params(hyper_params=hyper_params, **hyper_param_overrides)

  def _with_hyper_params(self, hyper_params: HyperParams) -> OptaxWrapper:
    """This definition with other hyper-parameter values (traced ones included)."""
    new = type(self).__new__(type(self))
    new._setup(hyper_params, self._factory, self._name)
    new.optax_optimizer = new._build(hyper_params)
    return new

  def as_optax(self) -> Any:
    """The wrapped optax transformation: exact, with optax's own state. Boxed
    parameters (nnx Variables) are unboxed before ``init``, so the state holds
    arrays, as ``update`` sees them."""
    tx = self.optax_optimizer
    return optax.GradientTransformationExtraArgs(
      lambda params: tx.init(paths.unbox(params)), optax.with_extra_args_support(tx).update
    )

  def derive_param_states_axes(
    self, param_states: PyTree, params: PyTree, params_axes: PyTree
  ) -> PyTree:
    """The optax state's axes, from the partition rules (`derive_optax_logical_axes`)."""
    return partition_rules.derive_normalized(param_states, params_axes, params)

  def state_dict(self, target: PyTree, state: OptimizerState) -> dict[str, Any]:
    """Flax's layout with optax's empty states dropped, as T5X writes it."""
    out = super().state_dict(target, state)
    out["state"] = serialization.drop_empty(out["state"])
    return out

  def _check_overrides(self, changed: dict[str, Any], params: PyTree, opt_state: PyTree) -> None:
    """Refuses overrides that would change the state's layout or that only
    enter the initial state; cached per override signature."""
    traced = {k: v for k, v in changed.items() if is_numeric(v)}
    try:
      self._check_layout_and_init_use(changed, traced, params, opt_state)
    except TypeError:
      # optax branches on a value in Python: concrete values may still go in
      # as constants (only the layout can be checked then); traced ones cannot.
      if any(isinstance(v, jax.core.Tracer) for v in traced.values()):
        raise
      self._check_layout_and_init_use(changed, {}, params, opt_state)

  def _check_layout_and_init_use(
    self, changed: dict[str, Any], traced: dict[str, Any], params: PyTree, opt_state: PyTree
  ) -> None:
    static = {k: v for k, v in changed.items() if k not in traced}
    key = (
      tuple(sorted((k, _aval(v)) for k, v in traced.items())),
      tuple(sorted((k, static_key(v)) for k, v in static.items())),
      jax.tree.structure(params),
      tuple(_aval(x) for x in jax.tree.leaves(params)),
    )
    if key in self._checked:
      self._checked.move_to_end(key)
      return
    params_avals = jax.tree.map(_aval, params)

    def init_with(traced_values: dict[str, Any], params: PyTree) -> PyTree:
      return self._build(self.hyper_params.replace(**static, **traced_values)).init(params)

    traced_avals = {k: _aval(v) for k, v in traced.items()}
    closed, out_shape = self._guarded(
      changed, jax.make_jaxpr(init_with, return_shape=True), traced_avals, params_avals
    )
    _check_state_layout(self, changed, out_shape, opt_state)
    in_init = _inputs_used(closed.jaxpr, len(jax.tree.leaves(traced_avals)))
    names = [k for k, _ in sorted(traced.items())]
    init_only = [n for n, used in zip(names, in_init, strict=True) if used]
    if init_only:
      raise ValueError(
        f"{self._name}: the hyper-parameter(s) {init_only} set the optimizer's initial state "
        "(its state is built from them at init), so an override at apply time cannot take "
        f"effect. Create the optimizer with the value you want instead: {self._name}("
        + ", ".join(f"{n}=..." for n in init_only)
        + ")."
      )
    self._checked[key] = True
    if len(self._checked) > _CHECK_CACHE_SIZE:
      self._checked.popitem(last=False)

  def _guarded(self, changed: Mapping[str, Any], fn: Callable[..., Any], *args, **kwargs) -> Any:
    """Calls ``fn``; a tracer error from overridden values gets a clear message."""
    try:
      return fn(*args, **kwargs)
    except _TracerErrors as e:
      if not changed:
        raise
      raise TypeError(
        f"{self._name}: overriding {sorted(changed)} with a traced value failed, because the "
        "optax code branches on that value in Python. Pass a Python number (not a jax array) "
        "for it, or create the optimizer with that value."
      ) from e

  def _static_key(self) -> tuple:
    if self._factory is None:
      return (type(self), static_key(self.optax_optimizer))
    return (type(self), self._factory, self.hyper_params)

  def __repr__(self) -> str:
    if self._factory is None:
      return f"OptaxWrapper({self._name})"
    inner = ", ".join(f"{k}={v!r}" for k, v in self.hyper_params.items())
    return f"{self._name}({inner})"


def wrap_optax_optimizer(
  optax_optimizer: Callable[..., Any],
  name: str | None = None,
  *,
  definition_class: type[OptaxWrapper] | None = None,
) -> Callable[..., OptaxWrapper]:
  """Turns an optax optimizer factory into an `OptaxWrapper` factory.

  The result takes the same arguments; they become the hyper-parameters, and
  each can be overridden per step in ``apply_gradient``.

  Args:
    optax_optimizer: a function returning an optax transformation, e.g.
      ``optax.adamw``.
    name: the name shown in errors and reprs; defaults to the factory's.
    definition_class: the `OptaxWrapper` subclass to build (an adapter's own
      face, e.g. T5X's); default `OptaxWrapper`.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> import optcore
    >>> my_adamw = optcore.wrap_optax_optimizer(optax.adamw)
    >>> opt = my_adamw(learning_rate=1e-3, weight_decay=0.1).create({'w': jnp.ones(2)})
    >>> opt.optimizer_def.hyper_params.weight_decay
    0.1
    >>> opt = opt.apply_gradient({'w': jnp.ones(2)}, learning_rate=0.0, weight_decay=0.0)
    >>> opt.target['w']
    Array([1., 1.], dtype=float32)
  """
  if name is None:
    name = getattr(optax_optimizer, "__name__", None) or type(optax_optimizer).__name__

  cls = OptaxWrapper if definition_class is None else definition_class
  if not (isinstance(cls, type) and issubclass(cls, OptaxWrapper)):
    raise TypeError(f"definition_class must be a subclass of OptaxWrapper, got {cls!r}")

  def wrapped(*args: Any, **kwargs: Any) -> OptaxWrapper:
    return cls._from_factory(optax_optimizer, name, args, kwargs)

  try:
    functools.update_wrapper(wrapped, optax_optimizer)
  except AttributeError:  # functools.partial objects have no __name__
    wrapped.__doc__ = getattr(optax_optimizer, "__doc__", None)
  wrapped.__name__ = wrapped.__qualname__ = name.rsplit(".", 1)[-1]
  wrapped.__signature__ = inspect.signature(optax_optimizer)
  wrapped.__wrapped__ = optax_optimizer
  return wrapped


def _chain(transformations: Sequence[Any]) -> optax.GradientTransformationExtraArgs:
  """Applies a list of transformations in sequence, as ``optax.chain``.

  T5X's ``optimizers.chain`` signature: one list (or tuple) of optax
  transformations or optcore definitions.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> import optcore
    >>> tx = optcore.chain([optax.clip_by_global_norm(1.0), optcore.sgd(1.0)])
    >>> tx.create({'w': jnp.zeros(2)}).apply_gradient({'w': jnp.array([3.0, 4.0])}).target['w']
    Array([-0.6, -0.8], dtype=float32)
  """
  return optax.chain(*transformations)


chain = wrap_optax_optimizer(_chain, name="chain")


def _reachable_names(hyper_params: HyperParams) -> set[str]:
  """The hyper-parameter names of the wrapped definitions among ``hyper_params``."""
  names: set[str] = set()
  for value in hyper_params.values():
    for item in value if isinstance(value, (list, tuple)) else (value,):
      if isinstance(item, OptaxWrapper) and item._factory is not None:
        names |= set(item.hyper_params) | _reachable_names(item.hyper_params)
  return names


def _route(value: Any, overrides: dict[str, Any]) -> Any:
  """``value`` with the overrides its wrapped definitions can take applied."""
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
    return type(value)(_route(v, overrides) for v in value)
  if isinstance(value, OptaxWrapper) and value._factory is not None:
    reachable = set(value.hyper_params) | _reachable_names(value.hyper_params)
    applicable = {k: v for k, v in overrides.items() if k in reachable}
    if applicable:
      return value._with_hyper_params(value.update_hyper_params(**applicable))
  return value


def _as_optax(value: Any) -> Any:
  """Optcore definitions among a factory's arguments become optax transformations."""
  if isinstance(value, OptaxWrapper):
    return value.optax_optimizer
  if isinstance(value, OptimizerDef):
    raise TypeError(
      f"{value!r} is not an optax transformation; only optcore's wrapped optax optimizers can "
      "be passed where optax expects a transformation."
    )
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
    converted = [_as_optax(v) for v in value]
    return type(value)(converted)
  return value


def as_definition(optimizer: Any, who: str) -> OptimizerDef:
  """``optimizer`` as a definition: itself, or an optax transformation wrapped.

  For adapters that take "any optcore config or an optax transformation";
  anything else raises a TypeError that names ``who``.
  """
  if isinstance(optimizer, OptimizerDef):
    return optimizer
  if callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None)):
    return OptaxWrapper(optimizer)
  raise TypeError(
    f"{who} takes an optcore definition (optcore.adamw(1e-3), optcore.MultiOptimizer(...), "
    f"optcore.legacy.Adam(...)) or an optax GradientTransformation; got {optimizer!r:.80}"
  )


def _check_protocol(tx: Any, what: str | None = None) -> None:
  if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
    raise TypeError(
      f"{what or 'OptaxWrapper'} needs an object with optax's init/update protocol (an "
      f"optax.GradientTransformation), found {type(tx).__name__}: {tx!r:.80}"
    )


def _changed(base: HyperParams, new: HyperParams) -> dict[str, Any]:
  if new is base:
    return {}
  return {k: v for k, v in new.items() if static_key(v) != static_key(base[k])}


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
  wrapper: OptaxWrapper, changed: Mapping[str, Any], new_shapes: PyTree, opt_state: PyTree
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
  raise ValueError(
    f"{wrapper._name}: overriding {sorted(changed)} would change the optimizer state's layout "
    f"({detail}). Overrides last one step and cannot add or reshape state; create the "
    "optimizer with that setting instead (for example optcore.sgd(lr, momentum=0.9) rather "
    "than overriding momentum)."
  )
