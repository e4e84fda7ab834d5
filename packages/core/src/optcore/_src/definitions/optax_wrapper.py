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
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ParamSpec, cast

import jax
import jax.numpy as jnp
import optax
import optax.contrib

from optcore._src.axes import partition_rules, sharding
from optcore._src.containers.export import boxed_like_parameters, optax_update_arguments
from optcore._src.definitions.base import OptimizerDef
from optcore._src.ground import arguments, declarations, overrides, paths
from optcore._src.ground.checks import check_float_params, check_gradients
from optcore._src.ground.hyper_params import HyperParams, name_hint, static_key
from optcore._src.ground.state import OptimizerState
from optcore._src.persistence import serialization

PyTree = Any


class OptaxWrapper(OptimizerDef):
  """An optax transformation as an `OptimizerDef` (T5X's ``OptaxWrapper``).

  Built from a transformation, it has no hyper-parameters to override. Built
  from a factory and its arguments (as `wrap_optax_optimizer` and every
  ``optcore.<name>`` do), its hyper-parameters are the factory's arguments
  and apply-time overrides take effect (see `optcore._src.ground.overrides`). The
  state is ``OptimizerState(step, <optax state>)`` with the optax state
  exactly as optax lays it out.

  Args:
    optax_optimizer: anything with optax's ``init``/``update`` protocol
      (``GradientTransformation``, ``GradientTransformationExtraArgs``,
      ``optax.MultiSteps``); with ``hyper_params``, the factory that builds it.
    hyper_params: the factory's arguments, by name; None for a transformation.
    name: the name errors and reprs use; defaults to the factory's or type's.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> import optcore
    >>> opt = optcore.OptaxWrapper(optax.sgd(0.1)).create({'w': jnp.ones(2)})
    >>> opt.apply_gradient({'w': jnp.ones(2)}).target['w']
    Array([0.9, 0.9], dtype=float32)
    >>> optcore.OptaxWrapper(optax.sgd, {'learning_rate': 0.1}).hyper_params.learning_rate
    0.1
  """

  per_parameter_state = False  # optax lays its state out by field, not by parameter
  gives_optax_updates = True  # compute_updates is optax's own update
  legacy_state_dicts = False  # the core face: exactly 'target' and 'state', exact dtypes

  def __init__(
    self,
    optax_optimizer: Any,
    hyper_params: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
  ):
    factory = None if hyper_params is None else optax_optimizer
    if factory is not None and hyper_params is not None:
      hyper_params = _arguments(factory, hyper_params, name)
      for key, value in hyper_params.items():  # optax's ScalarOrSchedule arguments
        if key.endswith("learning_rate") and callable(value) and not hasattr(value, "shape"):
          overrides.check_schedule(name or factory.__name__, key, value)
    if name is None:
      source = optax_optimizer if factory is not None else type(optax_optimizer)
      name = getattr(source, "__name__", None) or type(source).__name__
    super().__init__(HyperParams() if hyper_params is None else hyper_params)
    self._factory = factory
    self._name: str = name or type(optax_optimizer).__name__
    # optax's dpsgd clips and noises one gradient per example: a leading batch axis.
    self.per_example_gradients = factory is optax.contrib.dpsgd
    if factory is None:
      _check_protocol(optax_optimizer)
      self.optax_optimizer = optax_optimizer
    else:
      self.optax_optimizer = self.transformation_for(self.hyper_params)

  @property
  def factory(self) -> Callable[..., Any] | None:
    """The optax factory the hyper-parameters are the arguments of; None for a
    ready transformation."""
    return self._factory

  def transformation_for(self, hyper_params: HyperParams) -> Any:
    """The optax transformation for ``hyper_params`` (the factory called with them)."""
    if self._factory is None:
      return self.optax_optimizer
    arguments = collections.OrderedDict((k, _as_optax(v)) for k, v in hyper_params.items())
    bound = inspect.BoundArguments(inspect.signature(self._factory), arguments)
    tx = self._factory(*bound.args, **bound.kwargs)
    _check_protocol(tx, f"{self._name}(...)")
    return tx

  def with_hyper_params(self, hyper_params: HyperParams) -> OptaxWrapper:
    """This definition with other hyper-parameter values (traced ones included)."""
    return type(self)(self._factory, hyper_params, name=self._name)

  def weight_decay_names(self) -> tuple[str, ...]:
    """The factory's arguments declared weight decays (`arguments.weight_decays`); none for a
    ready transformation."""
    return () if self._factory is None else arguments.weight_decays(self._factory)

  def learning_rate_names(self) -> tuple[str, ...]:
    """The factory's arguments declared learning rates (`arguments.learning_rates`); none for
    a ready transformation."""
    return () if self._factory is None else arguments.learning_rates(self._factory)

  def reads_param_logical_axes(self) -> bool:
    # muon, soap, shampoo: their matrix dimensions from the axes, unless given their own
    return self.hyper_params.get("param_logical_axes", False) is None

  def children(self) -> tuple[OptimizerDef, ...]:
    """The definitions among its arguments, in order: ``chain``'s members, the wrapped
    optimizer of ``contrib.schedule_free``, ``sam``, ``mechanize``, ...; none for a ready
    transformation. Every walk sees them: ``chain([contrib.muon(...)])`` is told the
    parameters' logical axes as ``contrib.muon`` alone is."""
    return tuple(_definitions_in(self.hyper_params.values()))

  def with_children(self, children: tuple[OptimizerDef, ...]) -> OptaxWrapper:
    held = len(self.children())
    if len(children) != held:
      raise TypeError(
        f"{self.display_name()} holds {held} definition(s) among its arguments; got "
        f"{len(children)} to put in their place"
      )
    replaced = iter(children)
    values = {k: _replace_definitions(v, replaced) for k, v in self.hyper_params.items()}
    return self.with_hyper_params(HyperParams(**values))

  def with_param_logical_axes(self, param_logical_axes: PyTree) -> OptaxWrapper:
    if self.children():  # chain([...]), schedule_free(...): its members read them
      return cast(OptaxWrapper, super().with_param_logical_axes(param_logical_axes))
    if not self.reads_param_logical_axes():
      return self  # no such argument, or its own axes win
    return self.with_hyper_params(self.hyper_params.replace(param_logical_axes=param_logical_axes))

  def with_state_split(self, split: Any) -> OptaxWrapper:
    if self.children():
      return cast(OptaxWrapper, super().with_state_split(split))
    # the factory's argument that takes the split, declared on the factory
    # (`optcore.contrib.muon`'s ns_sharding); left None it is the split's, set it is the user's
    name = getattr(self._factory, "placement_argument", None)
    if name is None or name not in self.hyper_params or self.hyper_params[name] is not None:
      return self
    return self.with_hyper_params(self.hyper_params.replace(**{name: split}))

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    state = self.optax_optimizer.init(params)
    refuse_undeclared_state(self._name, state)
    return OptimizerState(jnp.asarray(0, dtype=jnp.int32), state)

  def apply_gradient(self, hyper_params, params, state, grads, **extra_args):
    updates, new_state = self.compute_updates(hyper_params, params, state, grads, **extra_args)
    return optax.apply_updates(params, updates), new_state

  def compute_updates(
    self,
    hyper_params: HyperParams,
    params: PyTree | None,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    """optax's own updates, exactly; ``params`` is optional where optax's is."""
    changed = overrides.changed(self.hyper_params, hyper_params)
    if changed:
      shapes = params if params is not None else _param_shapes(self, grads)
      overrides.check_state_effect(self, changed, shapes, state.param_states)
      tx = overrides.guarded(self._name, changed, self.transformation_for, hyper_params)
    else:
      tx = self.optax_optimizer
    if extra_args:
      tx = optax.with_extra_args_support(tx)
    updates, new_opt_state = overrides.guarded(
      self._name, changed, tx.update, grads, state.param_states, params, **extra_args
    )
    return updates, OptimizerState(state.step + 1, new_opt_state)

  def display_name(self) -> str:
    return self._name

  def extra_arg_names(self) -> None:
    """Any: optax's transformations use the extra arguments they read and ignore the rest."""
    return None

  def overridable_names(self) -> frozenset[str]:
    """The factory's arguments and the names of wrapped definitions among them
    (``chain([optcore.adamw(...)])`` takes ``learning_rate``); none for a ready
    transformation."""
    if self._factory is None:
      return frozenset()
    hyper_params = self.hyper_params
    nested = overrides.reachable_names(hyper_params) | overrides.path_names(hyper_params)
    return frozenset(hyper_params) | nested

  def update_hyper_params(self, **hyper_param_overrides: Any) -> HyperParams:
    if self._factory is None and hyper_param_overrides.keys() - {"hyper_params"}:
      raise TypeError(
        f"OptaxWrapper({self._name}) was built from a ready optax transformation, so it has no "
        f"hyper-parameters to override (got {sorted(hyper_param_overrides)}). Build it with "
        "optcore.<name>(...) or optcore.wrap_optax_optimizer(factory)(...) to override them "
        "per step."
      )
    hyper_params = hyper_param_overrides.pop("hyper_params", self.hyper_params)
    hyper_params, hyper_param_overrides = overrides.route_nested(
      repr(self), hyper_params, hyper_param_overrides
    )
    return super().update_hyper_params(hyper_params=hyper_params, **hyper_param_overrides)

  def as_optax(self) -> Any:
    """The wrapped optax transformation: exact, with optax's own state. Boxed
    parameters (nnx Variables) give a state whose parameter-shaped leaves are
    boxed as their parameters (their sharding metadata kept), as optax's own
    ``init`` gives it; ``update`` computes on arrays either way. A
    hyper-parameter keyword of ``update`` (``learning_rate=lr``) is honoured for
    that step; every other keyword reaches the transformation, which uses what it
    reads (``value``, ...) and ignores the rest, as optax's own do."""
    tx = self.optax_optimizer

    def init_fn(params: PyTree) -> Any:
      return boxed_like_parameters(self, tx.init(paths.unbox(params)), params)

    def update_fn(updates: PyTree, state: Any, params: PyTree = None, **kwargs: Any):
      overrides, extra = optax_update_arguments(self, kwargs)
      boxed, state = state, paths.unbox(state)
      updates, params = paths.unbox(updates), paths.unbox(params)
      if params is not None:
        updates = paths.conform(params, updates)
        check_gradients(self, params, updates, what="updates")
      if not overrides:
        updates, new_state = sharding.with_auto_axes(  # on Explicit mesh axes: see there
          lambda u, s, p, e: optax.with_extra_args_support(tx).update(u, s, p, **e),
          (updates, state),
          updates,
          state,
          params,
          extra,
        )
        return updates, paths.rebox_like(new_state, boxed)
      hyper_params = self.update_hyper_params(**overrides)
      wrapped = OptimizerState(jnp.zeros((), jnp.int32), state)  # the step is not optax's
      updates, new_state = self.compute_updates(hyper_params, params, wrapped, updates, **extra)
      return updates, paths.rebox_like(new_state.param_states, boxed)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)

  def from_optax_state(self, optax_state: Any, step: Any) -> OptimizerState:
    """optax's own state under the step (`OptimizerDef.from_optax_state`)."""
    return OptimizerState(jnp.asarray(step, jnp.int32), optax_state)

  def to_optax_state(self, state: OptimizerState, like: Any = None) -> Any:
    del like
    return state.param_states

  def why_not_elementwise(self) -> str | None:
    """None for the optax aliases whose update reads each element alone (see
    `ELEMENTWISE_OPTAX`) with no weight-decay mask; else why not."""
    if all(self._factory is not getattr(optax, name) for name in ELEMENTWISE_OPTAX):
      return (
        f"{self.display_name()} is not one of the element-wise optax optimizers "
        f"({', '.join(ELEMENTWISE_OPTAX)}): it reduces per parameter (a norm, a factored "
        "moment), draws noise per parameter, or is a transformation optcore cannot read"
      )
    if self.hyper_params.get("mask") is not None:
      return (
        f"{self.display_name()} has a weight-decay mask, a tree over the parameters that a "
        "buffer does not have; give each part its own definition instead: "
        "optcore.grouped(optcore.MultiOptimizer((mask, adamw(...)), (rest, adamw(..., "
        "weight_decay=0.0))))"
      )
    return None

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

  def _static_key(self) -> tuple:
    if self._factory is None:
      return (type(self), static_key(self.optax_optimizer))
    return (type(self), self._factory, self.hyper_params)

  def __repr__(self) -> str:
    if self._factory is None:
      return f"OptaxWrapper({self._name})"
    inner = ", ".join(f"{k}={v!r}" for k, v in self.hyper_params.items())
    return f"{self._name}({inner})"


#: The optax aliases whose update of each element reads only that element of
#: the gradient, parameter and state (no norm, no factored moment, no noise
#: drawn per leaf): `grouped` may run them on one buffer of many parameters.
ELEMENTWISE_OPTAX = tuple(
  name
  for name in (
    "adabelief adadelta adagrad adam adamax adamaxw adamw adan amsgrad lion nadam nadamw "
    "optimistic_adam optimistic_gradient_descent radam rmsprop rprop sgd sign_sgd signum yogi"
  ).split()
  if hasattr(optax, name)
)


def refuse_undeclared_state(name: str, state: PyTree) -> None:
  """`UndeclaredStateError` at the first state type in ``state`` that says nothing of its
  fields (no `optcore.ParamShaped`-style annotations, no `optcore.declare_state` table and no
  `optcore.register_state_rule`): every reader (axes, low-bit state, transplant) would have to
  guess what its fields hold."""
  try:
    found = declarations.undeclared_types(state)
  except declarations.UndeclaredStateError as e:  # a type that declares some fields only
    raise declarations.UndeclaredStateError(f"{name}: {e}") from None
  for keys, state_type in found:
    if partition_rules.rule_for(state_type) is None:
      where = paths.path_str(keys) or "/"
      raise declarations.UndeclaredStateError(
        f"{name}: the state type {state_type.__module__}.{state_type.__qualname__} at "
        f"{where!r} does not declare its fields. "
        + declarations.undeclared_message(state_type, list(state_type._fields))
      )


_Arguments = ParamSpec("_Arguments")


def wrap_optax_optimizer(
  optax_optimizer: Callable[_Arguments, Any],
  name: str | None = None,
  *,
  definition_class: type[OptaxWrapper] | None = None,
  validate: Callable[[Mapping[str, Any]], None] | None = None,
  declare: Mapping[str, arguments.Spec] | None = None,
) -> Callable[_Arguments, OptaxWrapper]:
  """Turns an optax optimizer factory into an `OptaxWrapper` factory.

  The result takes the same arguments; they become the hyper-parameters, and
  each can be overridden per step in ``apply_gradient``.

  Args:
    optax_optimizer: a function returning an optax transformation, e.g.
      ``optax.adamw``.
    name: the name shown in errors and reprs; defaults to the factory's.
    definition_class: the `OptaxWrapper` subclass to build (an adapter's own
      face, e.g. T5X's); default `OptaxWrapper`.
    validate: called with the bound arguments (defaults applied) when a
      definition is made; it raises for a wrong one, so the error comes at
      construction instead of at the first step. Before it, every argument is
      checked as ``optax_optimizer`` declares it (`optcore._src.ground.arguments`:
      its ``declare``, else its annotations: a number, never a string, NaN or
      infinity).
    declare: what some of its arguments are, beyond their annotations
      (`arguments.declare_for`): ``{'weight_decay': arguments.OPTAX_WEIGHT_DECAY}``
      says that one is a weight decay, which `optcore.cautious` leaves unmasked.

  Returns:
    A factory with ``optax_optimizer``'s signature returning `OptaxWrapper` definitions.

  Raises:
    TypeError: ``definition_class`` is not an `OptaxWrapper` subclass (the
      factory itself raises TypeError for an argument ``optax_optimizer`` lacks,
      and `optcore.ArgumentError` for one it does not accept).

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
  shown: str = (
    name
    if name is not None
    else str(getattr(optax_optimizer, "__name__", None) or type(optax_optimizer).__name__)
  )

  cls = OptaxWrapper if definition_class is None else definition_class
  if not (isinstance(cls, type) and issubclass(cls, OptaxWrapper)):
    raise TypeError(f"definition_class must be a subclass of OptaxWrapper, got {cls!r}")

  signature = inspect.signature(optax_optimizer)
  if declare:
    arguments.declare_for(optax_optimizer, **declare)

  def wrapped(*args: Any, **kwargs: Any) -> OptaxWrapper:
    try:
      bound = signature.bind(*args, **kwargs)
    except TypeError as e:
      raise TypeError(f"{shown}(): {_argument_message(e, kwargs, signature, shown)}") from None
    bound.apply_defaults()
    specs = arguments.from_annotations(optax_optimizer)  # its declaration, or its annotations
    bound.arguments.update(arguments.check(shown, specs, bound.arguments))
    if validate is not None:
      validate(bound.arguments)
    return cls(optax_optimizer, bound.arguments, name=shown)

  try:
    functools.update_wrapper(wrapped, optax_optimizer)
  except AttributeError:  # functools.partial objects have no __name__
    wrapped.__doc__ = getattr(optax_optimizer, "__doc__", None)
  wrapped.__name__ = wrapped.__qualname__ = shown.rsplit(".", 1)[-1]
  # optax's arguments, and what the factory returns: a definition (optax's says a transformation).
  # An adapter's face (T5X's, whose functools.wraps showed optax's signature) keeps optax's.
  own = definition_class is None
  readable = _readable(signature).replace(return_annotation=cls) if own else signature
  setattr(wrapped, "__signature__", readable)  # noqa: B010  (what inspect.signature reads)
  setattr(wrapped, "__wrapped__", optax_optimizer)  # noqa: B010
  return wrapped


@functools.cache
def _type_aliases() -> tuple[tuple[Any, str], ...]:
  """optax's type aliases, each with its name: a signature shows ``jax.typing.ArrayLike``, not the
  union it stands for (``jax.Array | numpy.ndarray | numpy.bool | ...``)."""
  from optax._src import base as optax_base

  found = [(jax.typing.ArrayLike, "jax.typing.ArrayLike")]
  for name, value in vars(optax_base).items():
    if name[:1].isupper() and not isinstance(value, type) and hasattr(optax, name):
      found.append((value, f"optax.{name}"))
  return tuple(found)


def _readable(signature: inspect.Signature) -> inspect.Signature:
  """``signature`` with each annotation that is one of optax's type aliases shown by its name."""

  def named(annotation: Any) -> Any:
    for alias, name in _type_aliases():
      try:
        if annotation == alias:
          return name
      except Exception:  # an annotation that cannot be compared is shown as it is
        continue
    return annotation

  parameters = [p.replace(annotation=named(p.annotation)) for p in signature.parameters.values()]
  return signature.replace(parameters=parameters)


def _argument_message(
  error: TypeError, kwargs: Mapping[str, Any], signature: Any, name: str = "factory"
) -> str:
  """``error`` of binding a factory's arguments, naming optax's keyword for one another
  library uses (``lr`` -> ``learning_rate``)."""
  accepted = signature.parameters
  positional = [
    name
    for name, p in accepted.items()
    if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  ]
  if "too many positional" in str(error) and "Sequence" in str(accepted[positional[0]].annotation):
    return (
      f"{error}; it takes its {positional[0]} as one list: "
      f"{name}([optax.clip_by_global_norm(1.0), optcore.adamw(1e-3)])"
    )
  if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
    return str(error)
  unknown = [k for k in kwargs if k not in accepted]
  if not unknown:
    return str(error)
  noun = "argument" if len(unknown) == 1 else "arguments"
  named = ", ".join(f"{k!r}{name_hint(k, accepted)}" for k in unknown)
  return f"unexpected keyword {noun} {named}; it takes: {', '.join(accepted)}"


def wrapped_names(namespace: Mapping[str, Any], source: Any) -> tuple[str, ...]:
  """The public names in ``namespace`` bound to `wrap_optax_optimizer` of
  ``source``'s function of the same name, in the order they were bound.

  How `optcore.OPTAX_ALIASES` and `optcore.contrib.CONTRIB_OPTIMIZERS` are
  read from the modules that define the wrappers, so no list is kept by hand.
  """
  return tuple(
    name
    for name, value in list(namespace.items())
    if not name.startswith("_") and callable(value) and _wraps(value, getattr(source, name, None))
  )


def _wraps(value: Any, target: Any) -> bool:
  """Whether ``target`` is on ``value``'s chain of ``__wrapped__`` (an optcore
  factory may wrap optax's through a function of its own: contrib.muon)."""
  for _ in range(4):
    value = getattr(value, "__wrapped__", None)
    if value is None or target is None:
      return False
    if value is target:
      return True
  return False


def _chain(transformations: Sequence[Any]) -> optax.GradientTransformationExtraArgs:
  """Applies a list of transformations in sequence, as ``optax.chain``.

  T5X's ``optimizers.chain`` signature: one list (or tuple) of optax
  transformations or optcore definitions.

  Args:
    transformations: optax transformations or optcore definitions, applied in order.

  Returns:
    A definition (an `OptaxWrapper` of ``optax.chain``); its members' hyper-parameters
    are overridable by their path (``transformations/1/learning_rate``).

  Raises:
    TypeError: a member that is neither an optax transformation nor a definition.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> import optcore
    >>> tx = optcore.chain([optax.clip_by_global_norm(1.0), optcore.sgd(1.0)])
    >>> tx.create({'w': jnp.zeros(2)}).apply_gradient({'w': jnp.array([3.0, 4.0])}).target['w']
    Array([-0.6, -0.8], dtype=float32)
  """
  return optax.chain(*transformations)


def _check_chain(arguments: Mapping[str, Any]) -> None:
  """chain's members, checked when the definition is made: one list of transformations or
  definitions, each named by its index where it is not one."""
  members = arguments["transformations"]
  if not isinstance(members, (list, tuple)) or hasattr(members, "_fields"):
    raise TypeError(
      f"chain(): transformations must be one list of optax transformations or optcore "
      f"definitions, found {type(members).__name__} {members!r:.80}. To fix: wrap it in a list, "
      "optcore.chain([optax.clip_by_global_norm(1.0), optcore.adamw(1e-3)])."
    )
  if not members:
    raise ValueError(
      "chain(): transformations is empty; give at least one, or use optcore.sgd(...) alone."
    )
  for i, member in enumerate(members):
    if isinstance(member, OptimizerDef) and not isinstance(member, OptaxWrapper):
      wrapper = member.display_name().split("(")[0] if hasattr(member, "optimizer_def") else ""
      around = f"wrap the chain instead, optcore.{wrapper}(optcore.chain([...])), or " * bool(
        wrapper
      )
      raise TypeError(
        f"chain(): transformations[{i}] is {member.display_name()}, a definition with no optax "
        "factory to chain (a wrapper, a MultiOptimizer, a flax.optim algorithm). To fix: "
        f"{around}chain its optax face, transformations[{i}].as_optax()."
      )
    if isinstance(member, OptimizerDef) or (hasattr(member, "init") and hasattr(member, "update")):
      continue
    fix = (
      f" It is a factory: call it, as in optax.{getattr(member, '__name__', 'f')}(...)."
      if callable(member)
      else ""
    )
    raise TypeError(
      f"chain(): transformations[{i}] is {member!r:.80}, neither an optax transformation (with "
      f"init and update) nor an optcore definition.{fix}"
    )


chain = wrap_optax_optimizer(_chain, name="chain", validate=_check_chain)


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


def _definitions_in(values: Any) -> Iterator[OptaxWrapper]:
  """The definitions among a factory's arguments, as `_as_optax` finds them: an argument,
  or a member of a list or tuple argument (``chain``'s)."""
  for value in values:
    if isinstance(value, OptaxWrapper):
      yield value
    elif isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
      yield from _definitions_in(value)


def _replace_definitions(value: Any, replaced: Iterator[OptimizerDef]) -> Any:
  """``value`` with each definition `_definitions_in` finds replaced by the next of
  ``replaced``, in the same order."""
  if isinstance(value, OptaxWrapper):
    return next(replaced)
  if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
    return type(value)([_replace_definitions(v, replaced) for v in value])
  return value


def as_definition(optimizer: Any, who: str) -> OptimizerDef:
  """``optimizer`` as a definition: itself, or an optax transformation wrapped.

  For adapters that take "any optcore config or an optax transformation";
  anything else raises a TypeError that names ``who``.

  Args:
    optimizer: an `OptimizerDef` or an optax ``GradientTransformation``.
    who: the face's name, for the error message.

  Returns:
    The definition (an optax transformation wrapped in an `OptaxWrapper`).

  Raises:
    TypeError: anything else, or a grouped definition (a face owns its parameters).

  Example:
    >>> import optax
    >>> import optcore
    >>> optcore.adapter.as_definition(optax.sgd(0.1), 'my_face.Optimizer')
    OptaxWrapper(GradientTransformationExtraArgs)
    >>> optcore.adapter.as_definition('adam', 'my_face.Optimizer')
    Traceback (most recent call last):
    ...
    TypeError: my_face.Optimizer takes an optcore definition (optcore.adamw(1e-3), ...
  """
  if isinstance(optimizer, OptimizerDef) and optimizer.groups_parameters:
    raise TypeError(
      f"{who} owns its parameters, so {optimizer.display_name()} could only group them for "
      "each step and split them back, which measured no reliable gain over the ungrouped step "
      "and compiles slower (the performance page has the numbers). Pass the ungrouped "
      f"definition, {getattr(optimizer, 'optimizer_def', optimizer)!r}, or keep the parameters "
      "grouped between steps "
      "with optcore's own Optimizer: optcore.grouped(...).create(params)."
    )
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


def _param_shapes(wrapper: OptaxWrapper, grads: PyTree) -> PyTree:
  """The parameters' shapes when only gradients are given (optax's ``params=None``)."""
  if not wrapper.per_example_gradients:
    return grads
  return jax.tree.map(lambda g: jax.ShapeDtypeStruct(g.shape[1:], g.dtype), grads)


def _arguments(
  factory: Callable[..., Any], hyper_params: Mapping[str, Any], name: Any
) -> dict[str, Any]:
  """``hyper_params`` as every argument of ``factory``, in its order, defaults filled in
  (as ``inspect.BoundArguments.apply_defaults`` fills them)."""
  parameters = inspect.signature(factory).parameters
  who = name or getattr(factory, "__name__", "the factory")
  unknown = sorted(set(hyper_params) - set(parameters))
  if unknown:
    raise TypeError(
      f"{who}: {unknown} are not arguments of the factory; its arguments are {list(parameters)}"
    )
  out = {}
  for key, p in parameters.items():
    if key in hyper_params:
      out[key] = hyper_params[key]
    elif p.kind is p.VAR_POSITIONAL:
      out[key] = ()
    elif p.kind is p.VAR_KEYWORD:
      out[key] = {}
    elif p.default is not p.empty:
      out[key] = p.default
    else:
      raise TypeError(f"{who}: missing the required argument {key!r}")
  return out
