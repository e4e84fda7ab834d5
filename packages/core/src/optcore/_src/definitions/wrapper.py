"""The wrapper protocol: a definition that wraps another says, in one place, what it changes.

A wrapper (`accumulate`, `mixed_precision`, `ema`, `grouped`, and each one to
come) is a subclass of `Wrapper` that declares:

- ``name``: the name its function, its config and its errors use;
- ``changes``: the flags of `OptimizerDef.FLAGS` it sets itself. Every other
  flag is the wrapped definition's, by construction: a new flag on
  `OptimizerDef` reaches every wrapper without a line in it;
- ``config_arguments``: its constructor's arguments after the wrapped
  definition, with their defaults (`REQUIRED` for none). `optcore.config`
  writes and reads every wrapper from this table, and its static key (what
  ``==`` and ``jit``'s cache compare) is made of them;
- for a wrapper with state of its own (`StateWrapper`): ``state_type``, a
  NamedTuple whose first field ``inner`` holds the wrapped definition's state
  whole (as optax's wrappers do) and whose other fields the wrapper owns, each
  annotated with how its logical axes follow the parameters' (`ParamShaped`,
  `Replicated`: the words optax's state types use in `optax_rules`).

Hyper-parameters and their overrides, the display name, the logical axes a
definition is told (`with_param_logical_axes`), the moving average
(`ema_params`) and the checks of restored values (`check_state_values`) pass
through to the wrapped definition unless a wrapper says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from optcore._src.axes import matrix_axes, optax_rules, sharding
from optcore._src.axes.partition_rules import PartitionRuleError
from optcore._src.definitions.base import OptimizerDef
from optcore._src.ground import declarations, definition_tree, paths
from optcore._src.ground.declarations import Nested as Nested
from optcore._src.ground.declarations import ParamShaped as ParamShaped
from optcore._src.ground.declarations import Replicated as Replicated
from optcore._src.ground.hyper_params import HyperParams
from optcore._src.ground.state import OptimizerState
from optcore._src.ground.stored import is_stored

PyTree = Any

# A wrapper state's fields declare themselves in the words of every state type
# (`optcore._src.ground.declarations`): its ``inner`` is `Nested`, its own fields `ParamShaped`,
# `Replicated` (or a moment, where a wrapper keeps one).


class _Required:
  def __repr__(self) -> str:
    return "REQUIRED"


#: A config argument with no default.
REQUIRED: Any = _Required()

#: The wrappers by name (what `optcore.config` reads), filled as each wrapper class is defined.
WRAPPERS: dict[str, type[Wrapper]] = {}

_STATE_TYPES: list[type] = []


def wrapper_states() -> tuple[type, ...]:
  """The state types of every `StateWrapper`: ``inner`` first, then the wrapper's own fields."""
  return tuple(_STATE_TYPES)


class Wrapper(OptimizerDef):
  """A definition around another: see the module's docstring for what a subclass declares."""

  name: ClassVar[str] = ""
  #: The flags (`OptimizerDef.FLAGS`) this wrapper sets itself; every other one is the wrapped
  #: definition's.
  changes: ClassVar[Mapping[str, Any]] = MappingProxyType({})
  #: The constructor's arguments after the wrapped definition, and their defaults.
  config_arguments: ClassVar[Mapping[str, Any]] = MappingProxyType({})
  #: Those of `config_arguments` that are definitions (`diloco`'s ``outer``): a config writes
  #: and reads each as a config of its own.
  definition_arguments: ClassVar[tuple[str, ...]] = ()

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    if cls.name:
      WRAPPERS[cls.name] = cls

  def __init__(self, optimizer_def: OptimizerDef):
    if not isinstance(optimizer_def, OptimizerDef):
      raise TypeError(
        f"{self.name} takes an optimizer definition (optcore.adam(1e-3), "
        f"optcore.legacy.Adam(...)); got {optimizer_def!r}. For an optax transformation, "
        f"wrap it first: optcore.OptaxWrapper(tx)"
      )
    super().__init__(HyperParams())
    self.hyper_params = optimizer_def.hyper_params  # a MultiOptimizer's is a list
    self.optimizer_def = optimizer_def
    for flag in OptimizerDef.FLAGS:
      setattr(self, flag, self.changes.get(flag, getattr(optimizer_def, flag)))

  @classmethod
  def settings(cls, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` over ``config_arguments``' defaults: for a constructor that takes its settings
    as keywords (its public function carries the typed signature), so that each default is
    written once.

    Raises:
      TypeError: a name ``config_arguments`` lacks, or a `REQUIRED` one missing.
    """
    unknown = sorted(set(given) - set(cls.config_arguments))
    missing = sorted(k for k, v in cls.config_arguments.items() if v is REQUIRED and k not in given)
    if unknown or missing:
      said = f"unknown setting(s) {unknown}" if unknown else f"missing setting(s) {missing}"
      raise TypeError(f"{cls.name}: {said}; it takes {sorted(cls.config_arguments)}")
    return {**cls.config_arguments, **given}

  def config(self) -> dict[str, Any]:
    """The config arguments that differ from their defaults (every required one), dtypes by
    name: what `optcore.config.to_config` writes beside ``name`` and ``optimizer``."""
    written = {}
    for argument, default in self.config_arguments.items():
      value = getattr(self, argument)
      if default is REQUIRED or value != default:
        written[argument] = jnp.dtype(value).name if isinstance(value, type) else value
    return written

  def display_name(self) -> str:
    return f"{self.name}({self.optimizer_def.display_name()})"

  def overridable_names(self) -> frozenset[str]:
    return self.optimizer_def.overridable_names()

  def extra_arg_names(self) -> frozenset[str] | None:
    return self.optimizer_def.extra_arg_names()

  def update_hyper_params(self, **hyper_param_overrides: Any) -> Any:
    return self.optimizer_def.update_hyper_params(**hyper_param_overrides)

  def children(self) -> tuple[OptimizerDef, ...]:
    return (self.optimizer_def,)

  def leaf_hyper_params(self, state: OptimizerState, params: PyTree) -> dict[str, jax.Array]:
    inner = self._inner_state(state) if isinstance(self, StateWrapper) else state
    return self.optimizer_def.leaf_hyper_params(inner, params)

  def with_children(self, children: tuple[OptimizerDef, ...]) -> OptimizerDef:
    (inner,) = children
    bound = self._renewed()  # a new definition: this one is never changed
    bound.optimizer_def = inner
    bound.hyper_params = inner.hyper_params
    for flag in OptimizerDef.FLAGS:
      setattr(bound, flag, self.changes.get(flag, getattr(inner, flag)))
    return bound

  def _static_key(self) -> tuple:
    return (type(self), self.optimizer_def, *(getattr(self, a) for a in self.config_arguments))

  #: Config arguments the repr shows even at their default (ema's ``decay``), beside the
  #: required ones.
  repr_shows: ClassVar[tuple[str, ...]] = ()

  def __repr__(self) -> str:
    """``name(wrapped, setting=value, ...)``: the required config arguments, those in
    `repr_shows`, and the others away from their defaults, as the constructor takes them
    (a dtype as ``jnp.bfloat16``)."""
    shown = [
      f"{name}={_setting_repr(getattr(self, name))}"
      for name, default in self.config_arguments.items()
      if default is REQUIRED or name in self.repr_shows or getattr(self, name) != default
    ]
    return f"{self.name}({', '.join([repr(self.optimizer_def), *shown])})"


class StateWrapper(Wrapper):
  """A `Wrapper` with state of its own: a ``state_type`` NamedTuple around the wrapped
  definition's state (``inner``), never per parameter and never grouped (its own state
  follows the parameters' layout). Wrapping the same kind twice anywhere inside is refused."""

  changes: ClassVar[Mapping[str, Any]] = MappingProxyType(
    {"per_parameter_state": False, "elementwise": False}
  )
  #: The NamedTuple of this wrapper's state; its first field is ``inner``.
  state_type: ClassVar[type]
  #: The logical axes of each field of `state_type` after ``inner`` (whose axes the wrapped
  #: definition derives), read once from the state type's own annotations: `ParamShaped`,
  #: `Replicated`, or ``Annotated[<type>, rule]`` with a rule of `optax_rules.field_rule`'s
  #: form. Not set by hand.
  field_axes: ClassVar[Mapping[str, Any]] = MappingProxyType({})

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    state_type = cls.__dict__.get("state_type")
    if state_type is not None:
      if getattr(state_type, "_fields", ("",))[0] != "inner":
        raise TypeError(f"{cls.__name__}.state_type: a NamedTuple whose first field is inner")
      cls.field_axes = MappingProxyType(_declared_axes(state_type))
      _STATE_TYPES.append(state_type)

  def derive_param_states_axes(self, param_states: Any, params: PyTree, params_axes: PyTree):
    """The wrapped definition's axes for ``inner``; each own field's by `field_axes`."""
    inner = self.optimizer_def.derive_param_states_axes(param_states.inner, params, params_axes)
    own = {
      name: optax_rules.field_rule(kind)(
        getattr(param_states, name), param_states, params_axes, params
      )
      for name, kind in self.field_axes.items()
    }
    return param_states._replace(inner=inner, **own)

  def __init__(self, optimizer_def: OptimizerDef):
    if isinstance(optimizer_def, OptimizerDef) and optimizer_def.groups_parameters:
      raise TypeError(
        f"{self.name}({optimizer_def.display_name()}) is not possible: grouped keeps the "
        f"parameters in buffers of its own layout, and {self.name}'s state follows the "
        f"parameters' layout. Wrap the ungrouped definition: "
        f"{self.name}({getattr(optimizer_def, 'optimizer_def', optimizer_def)!r}, ...)."
      )
    if isinstance(optimizer_def, OptimizerDef) and any(
      isinstance(d, type(self)) for d in wrapped_chain(optimizer_def)
    ):
      raise TypeError(
        f"{self.name}({optimizer_def.display_name()}) wraps {self.name} twice; {self.twice_hint}"
      )
    super().__init__(optimizer_def)

  #: What the error for a second wrapper of this kind suggests instead.
  twice_hint: ClassVar[str] = "wrap it once"

  #: Why `grouped` cannot take this wrapper (`why_not_elementwise`), said of its kind.
  ungrouped_because: ClassVar[str] = "keeps its own parameter-shaped state: it is not grouped"

  def why_not_elementwise(self) -> str | None:
    return f"{self.display_name()} {self.ungrouped_because}"

  def _inner_state(self, state: OptimizerState) -> OptimizerState:
    return OptimizerState(state.step, state.param_states.inner)

  def ema_params(self, state: OptimizerState) -> PyTree:
    return self.optimizer_def.ema_params(self._inner_state(state))

  def keeps_ema(self) -> bool:
    return self.optimizer_def.keeps_ema()

  def check_state_values(self, state: OptimizerState, where: str = "state/param_states") -> None:
    self.optimizer_def.check_state_values(self._inner_state(state), f"{where}/inner")


class ReadsParamAxes:
  """For a wrapper that reads the parameters' logical axes (`multipliers`' rules by axes,
  `qk_clip`'s heads): told them once by `create_sharded` (or given ``param_logical_axes=``),
  kept in its static key, and read per leaf by `named_leaves`."""

  name: ClassVar[str]
  #: The parameters' logical axes, once told (`create_sharded` tells them).
  param_logical_axes: Any = None

  def _reads_axes(self) -> bool:
    """Whether this wrapper, as configured, reads the axes at all."""
    return True

  def reads_param_logical_axes(self) -> bool:
    return self._reads_axes() and self.param_logical_axes is None

  def with_param_logical_axes(self, param_logical_axes: PyTree) -> OptimizerDef:
    told = super().with_param_logical_axes(param_logical_axes)  # type: ignore[misc]
    if self.reads_param_logical_axes():
      told = told._renewed() if told is self else told
      told.param_logical_axes = param_logical_axes
    return told

  def named_leaves(self, params: PyTree) -> list[tuple[str, Any, tuple[str | None, ...] | None]]:
    """``(path, leaf, axes)`` per leaf of ``params`` in flatten order: its ``/``-joined path
    (`paths.leaves_with_names`: every face's names), and its logical axis names, one per
    dimension (None where none were told). The axes are in the parameters' structure, or a
    nested mapping by those names (``{'attn': {'query': {'kernel': P(...)}}}`` for any face's
    model, an Equinox module's or a treeo Tree's alike).

    Raises:
      optcore.PartitionRuleError: axes that do not fit the parameters.
    """
    named_paths = [names for names, _ in paths.leaves_with_names(params)[0]]
    leaf_paths = ["/".join(names) for names in named_paths]
    axes = self.param_logical_axes
    if axes is None:
      leaves = jax.tree.leaves(params)
      return [(path, leaf, None) for path, leaf in zip(leaf_paths, leaves, strict=True)]
    try:
      named, _ = matrix_axes.named_dimensions(self.name, params, axes)
    except PartitionRuleError:
      if not isinstance(axes, Mapping):
        raise
      by_name = {}
      for names in named_paths:  # the same axes, keyed by the names every face gives a leaf
        node = axes
        for name in names:
          node = node.get(name) if isinstance(node, Mapping) else None
        by_name[names] = node
      if any(v is None for v in by_name.values()):
        raise
      named, _ = matrix_axes.named_dimensions(
        self.name, params, jax.tree.unflatten(jax.tree.structure(params), list(by_name.values()))
      )
    out = []
    for path, (_, leaf, names) in zip(leaf_paths, named, strict=True):
      entries = names or ()  # no is_leaf: every leaf has its entries
      out.append((path, leaf, tuple(matrix_axes.single_name(self.name, path, n) for n in entries)))
    return out


def _setting_repr(value: Any) -> str:
  """A wrapper's setting as its constructor takes it: a dtype as ``jnp.<name>``, anything else
  by its repr."""
  if isinstance(value, (np.dtype, type)):
    try:
      return f"jnp.{jnp.dtype(value).name}"
    except TypeError:
      pass
  return repr(value)


def _declared_axes(state_type: type) -> dict[str, Any]:
  """Each field after ``inner`` of a wrapper's state type, and the axes its declaration gives
  (`declarations.declared_fields`: the annotations every state type uses); ``inner`` is
  `Nested`, and a field without a declaration is refused, naming it."""
  fields = declarations.declared_fields(state_type)
  if fields is None:
    raise declarations.UndeclaredStateError(
      declarations.undeclared_message(state_type, list(state_type._fields))
    )
  if fields["inner"] is not declarations.NESTED:
    raise TypeError(f"{state_type.__name__}.inner holds the wrapped state: annotate it Nested")
  return {name: role.axes for name, role in fields.items() if name != "inner"}


def wrapped_chain(optimizer_def: OptimizerDef) -> list[OptimizerDef]:
  """``optimizer_def`` and every definition it wraps, however deep (``ema(accumulate(ema(
  ...)))`` has two EMAs), the groups of a MultiOptimizer included."""
  return list(definition_tree.iter_definitions(optimizer_def))


def map_optimizer_leaves(fn: Any, tree: PyTree, *rest: PyTree) -> PyTree:
  """``fn`` over the leaves of ``tree`` (and the same leaves of ``rest``) that an algorithm
  keeps, leaving a wrapper's own fields as they are: `mixed_precision`'s ``state_dtype`` is the
  moments' dtype, never an `accumulate` mean's or an `ema` average's (a bfloat16 average of
  decay 0.999 never moved)."""
  return map_optimizer_leaves_with_path(lambda _, *leaves: fn(*leaves), tree, *rest)


def map_optimizer_leaves_with_path(
  fn: Any, tree: PyTree, *rest: PyTree, prefix: tuple = ()
) -> PyTree:
  """`map_optimizer_leaves` with each leaf's key path from the top of ``tree`` first:
  ``fn(keys, leaf, *others)`` (a wrapper's own state is entered at its ``inner``). A
  stored leaf (`optcore._src.ground.stored`: a `QuantizedArray`) is kept as it is: its format is not
  the algorithm's dtype."""
  states = wrapper_states()

  def visit(keys: tuple, node: Any, *others: Any) -> Any:
    if isinstance(node, states):
      inner_keys = (*prefix, *keys, jax.tree_util.GetAttrKey("inner"))
      inner = map_optimizer_leaves_with_path(
        fn, node.inner, *(o.inner for o in others), prefix=inner_keys
      )
      return node._replace(inner=inner)
    if is_stored(node):
      return node
    return fn((*prefix, *keys), node, *others)

  stop = lambda n: isinstance(n, states) or is_stored(n)
  return jax.tree_util.tree_map_with_path(visit, tree, *rest, is_leaf=stop)


def init_in_one_program(init: Any, params: PyTree) -> Any:
  """``init(params)`` compiled as one program when called eagerly: a state stored smaller
  than the wrapped definition makes it (bfloat16, 8 or 4 bits) is computed leaf by leaf
  inside it, and the wrapped definition's float32 state is never held whole. Under a trace
  (``create`` in ``jax.jit``) it is part of that program already."""
  leaves = jax.tree.leaves(params)
  if any(isinstance(x, Tracer) for x in leaves) or not leaves:
    return sharding.init_with_auto_axes(init, params)
  # Constant folding would compute a state made of constants (zeros) while compiling, in
  # memory, as a whole: the detour this function is here to avoid.
  program = jax.jit(
    lambda p: sharding.init_with_auto_axes(init, p),
    compiler_options={"xla_disable_hlo_passes": "constant_folding"},
  )
  mesh = sharding.explicit_mesh_of(params)
  if mesh is None:
    return program(params)
  with jax.set_mesh(mesh):  # jax 0.10 compiles a program typed on an Explicit mesh only there
    return program(params)


def floating_dtype(where: str, name: str, dtype: Any) -> Any:
  """``dtype`` as a real floating scalar type; TypeError naming ``where`` and ``name`` for any
  other, and for a 64-bit one while JAX's 64-bit mode is off (it would be float32, silently)."""
  try:
    resolved = jnp.dtype(dtype)
  except TypeError:
    resolved = None
  if resolved is None or not jnp.issubdtype(resolved, jnp.floating):
    raise TypeError(
      f"{where}: {name} must be a real floating dtype (jnp.float32, jnp.bfloat16, ...); "
      f"got {name}={dtype!r}"
    )
  if resolved.itemsize == 8 and not jax.config.jax_enable_x64:
    raise TypeError(
      f"{where}: {name}={resolved.name} needs 64-bit JAX, which is off: every array would be "
      f"made float32 instead, silently. Turn it on first (jax.config.update('jax_enable_x64', "
      f"True)), or pass {name}=jnp.float32."
    )
  return resolved.type
