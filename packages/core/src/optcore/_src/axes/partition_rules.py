"""Logical axes for every leaf of an optax state, derived from the parameters' axes.

A rule per state type says what each field holds: the parameters' axes for a
parameter-shaped field, replication for counters and keys, the surviving axes
for a factored accumulator, or a recursive derivation for a nested state. The
rules live in one registry; the built-in ones are registered through the same
`register_state_rule` that users call for their own state types.

Decisions for leaves without a rule:
  * a NamedTuple state of an unregistered type raises `PartitionRuleError`,
    naming the type and showing how to register a rule;
  * a scalar outside any registered state (in a plain tuple, list or dict) is
    replicated;
  * a non-scalar array outside any registered state raises: optcore never
    replicates an array it cannot place.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec

from optcore._src.ground import declarations, paths
from optcore._src.persistence import serialization

PyTree = Any
# rule(state, params_axes, params) -> the state's structure with PartitionSpec leaves
# (None anywhere means: replicate everything below).
StateRule = Callable[[Any, PyTree, PyTree], Any]


class PartitionRuleError(ValueError):
  """Logical axes that cannot be derived: an unknown state type, a rule that
  does not fit the state, or parameter axes that do not fit the parameters."""


PartitionRuleError.__module__ = "optcore"

_RULES: dict[type, StateRule] = {}


def register_state_rule(state_type: type, rule: Callable[..., Any] | None = None):
  """Registers how to derive the logical axes of ``state_type``'s leaves.

  ``rule(state, params_axes, params)`` returns ``state``'s structure with a
  `PartitionSpec` (one entry per dimension) or None (replicated) at each leaf.
  ``params_axes`` holds one full-rank PartitionSpec per parameter, in the
  parameters' structure; ``params`` holds the parameters or their
  ``jax.ShapeDtypeStruct``s. A T5X-style ``rule(state, params_axes)`` is
  accepted too. The helpers `like_params`, `replicated` and
  `derive_optax_logical_axes` cover most fields. Usable as a decorator.

  Args:
    state_type: the optax (or your own) state class.
    rule: ``rule(state, params_axes, params)`` or T5X's ``rule(state, params_axes)``;
      omitted: the decorator form.

  Returns:
    ``rule`` (so it works as a decorator).

  Raises:
    TypeError: ``state_type`` is not a class.

  Example:
    >>> from typing import NamedTuple
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import optcore
    >>> from optcore import partitioning
    >>> class EmaState(NamedTuple):
    ...   count: jax.Array
    ...   ema: dict
    >>> @optcore.register_state_rule(EmaState)
    ... def _(state, params_axes, params):
    ...   return EmaState(count=None, ema=partitioning.like_params(state.ema, params_axes))
    >>> params = {'w': jnp.zeros((4, 2))}
    >>> state = EmaState(jnp.zeros([], jnp.int32), {'w': jnp.zeros((4, 2))})
    >>> axes = optcore.derive_optax_logical_axes(state, {'w': P('embed', 'mlp')}, params)
    >>> axes == EmaState(count=P(), ema={'w': P('embed', 'mlp')})
    True
  """
  if rule is None:
    return lambda fn: register_state_rule(state_type, fn) or fn
  if not isinstance(state_type, type):
    raise TypeError(f"register_state_rule takes a type, got {state_type!r}")
  _RULES[state_type] = _three_arguments(rule)
  return rule


def _three_arguments(rule: Callable[..., Any]) -> StateRule:
  try:
    positional = [
      p
      for p in inspect.signature(rule).parameters.values()
      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
  except (TypeError, ValueError):  # builtins without a signature: assume ours
    return rule
  if len(positional) == 2:  # T5X's rule(state, params_axes)
    return lambda state, params_axes, params: rule(state, params_axes)
  return rule


def rule_for(state_type: type) -> StateRule | None:
  """The rule registered for ``state_type`` or its nearest registered base, else the one its
  fields' declarations give (`optcore.ParamShaped`, ..., `declarations.declared_fields`)."""
  for cls in state_type.__mro__:
    if cls in _RULES:
      return _RULES[cls]
  declared = declarations.declared_fields(state_type)
  return None if declared is None else declared_rule(declared)


def field_rule(kind: Any) -> Callable[[Any, Any, Any, Any], Any]:
  """The rule one field's declared axes stand for: ``"params"`` the parameters' axes,
  ``"replicated"`` none, ``"nested"`` a nested state's own rule, or a function ``(field, state,
  params_axes, params) -> axes`` as it is (a `declarations.Role`'s ``axes``)."""
  if kind == "params":
    return lambda field, state, axes, params: like_params(field, axes)
  if kind == "replicated":
    return lambda field, state, axes, params: replicated(field)
  if kind == "nested":
    return lambda field, state, axes, params: derive_normalized(field, axes, params)
  return kind


def declared_rule(declared: Any) -> StateRule:
  """The axes of a state whose fields are declared, field by field."""
  rules = {name: field_rule(role.axes) for name, role in declared.items()}

  def rule(state: Any, params_axes: PyTree, params: PyTree) -> Any:
    unknown = [f for f in state._fields if f not in rules]
    if unknown:
      raise PartitionRuleError(
        f"optcore's declaration does not know the field(s) {unknown} (a newer optax?). "
        "Declare them: optcore.declare_state(type, field=optcore.ParamShaped, ...)."
      )
    return type(state)(
      **{f: rules[f](getattr(state, f), state, params_axes, params) for f in state._fields}
    )

  return rule


# The parameters' axes.


def normalize_param_axes(params: PyTree, params_axes: PyTree) -> PyTree:
  """One full-rank `PartitionSpec` per parameter, in the parameters' structure.

  Each leaf of ``params_axes`` at a parameter's position may be a
  PartitionSpec, a tuple of axis names, or None (replicated); a shorter spec
  is padded with None (replicated trailing dimensions), as JAX reads it.
  """
  keyed, treedef = jax.tree_util.tree_flatten_with_path(params)
  try:
    given = treedef.flatten_up_to(paths.conform(params, params_axes))
  except (ValueError, TypeError) as e:
    raise PartitionRuleError(
      "the parameter axes do not have the structure of the parameters: give one PartitionSpec "
      f"(or None) per parameter, in the same tree. Parameters: {treedef}; the mismatch: {e}"
    ) from None
  specs = [_full_rank(spec, param, keys) for (keys, param), spec in zip(keyed, given, strict=True)]
  return treedef.unflatten(specs)


def _full_rank(spec: Any, param: Any, keys: tuple) -> PartitionSpec:
  ndim = _ndim(param)
  if spec is None:
    entries: tuple = ()
  elif isinstance(spec, PartitionSpec):
    entries = tuple(spec)
  elif isinstance(spec, str):
    entries = (spec,)
  elif isinstance(spec, (tuple, list)):
    entries = tuple(spec)
  else:
    raise PartitionRuleError(
      f"the axes of the parameter at {paths.path_str(keys)!r} are {spec!r}; expected a "
      "PartitionSpec, a tuple of axis names, or None."
    )
  if len(entries) > ndim:
    raise PartitionRuleError(
      f"the axes of the parameter at {paths.path_str(keys)!r} are {PartitionSpec(*entries)} with "
      f"{len(entries)} entries, but the parameter has {ndim} dimensions (shape "
      f"{_shape(param)}). Give one entry "
      "per dimension."
    )
  return PartitionSpec(*entries, *(None,) * (ndim - len(entries)))


# Helpers for rules.


def replicated(tree: PyTree) -> PyTree:
  """Fully replicated specs for every leaf of ``tree``: ``PartitionSpec(None, ...)``,
  one None per dimension (``PartitionSpec()`` for scalars)."""
  return jax.tree.map(lambda x: PartitionSpec(*(None,) * _ndim(x)), tree)


def like_params(field: PyTree, params_axes: PyTree) -> PyTree:
  """The parameters' axes for a field shaped like the parameters.

  A leaf with a parameter's rank gets that parameter's spec; a scalar at a
  parameter's position (a per-parameter norm) and a scalar field are
  replicated; masked-out parts (None, ``optax.MaskedNode``) stay as they are.
  Anything else raises `PartitionRuleError` naming the path.
  """
  if _is_array(field) and _ndim(field) == 0 and not _is_leaf_tree(params_axes):
    return PartitionSpec()

  def per_param(leaf: Any, spec: PartitionSpec, keys: tuple) -> PartitionSpec:
    if not _is_array(leaf):
      raise PartitionRuleError(
        f"expected an array at the parameter position {paths.path_str(keys)!r}, found "
        f"{type(leaf).__name__}."
      )
    if _ndim(leaf) == 0:
      return PartitionSpec()
    if _ndim(leaf) != len(spec):
      raise PartitionRuleError(
        f"at the parameter position {paths.path_str(keys)!r}: a leaf of shape "
        f"{tuple(leaf.shape)} where the parameter has {len(spec)} dimensions; this field is "
        "not shaped like the parameters."
      )
    return spec

  return map_params(per_param, field, params_axes)


def map_params(fn: Callable[[Any, PartitionSpec, tuple], Any], field: PyTree, params_axes: PyTree):
  """Replaces each parameter-position subtree ``x`` of ``field`` with
  ``fn(x, spec, key_path)``; None and ``optax.MaskedNode`` stay."""
  keyed = jax.tree_util.tree_flatten_with_path(params_axes)[0]
  spec_at = {tuple(keys): spec for keys, spec in keyed}
  return _map_at(fn, field, spec_at, ())


def _map_at(fn, node: Any, spec_at: dict, keys: tuple) -> Any:
  if node is None or isinstance(node, optax.MaskedNode):
    return node
  if keys in spec_at:
    return fn(node, spec_at[keys], keys)
  split = paths.children_with_keys(node)
  if split is None:
    raise PartitionRuleError(
      f"found {_describe(node)} at {paths.path_str(keys)!r}, which is not the position of a "
      "parameter; this field is not shaped like the parameters."
    )
  children, treedef = split
  return treedef.unflatten([_map_at(fn, child, spec_at, (*keys, k)) for k, child in children])


# Deriving.


def derive_optax_logical_axes(optax_state: Any, params_axes: PyTree, params: PyTree) -> Any:
  """The logical axes of every leaf of ``optax_state``.

  Returns ``optax_state``'s structure with a `PartitionSpec` at every array
  leaf, of the leaf's rank: parameter-shaped leaves get the parameter's axes,
  counters, scalars and RNG keys are replicated, factored accumulators keep
  the axes of the dimensions they did not reduce (Adafactor's ``v_row`` and
  ``v_col``, SM3's per-dimension accumulators).

  Args:
    optax_state: the state, or its ``jax.eval_shape``.
    params_axes: one PartitionSpec (or tuple of names, or None) per parameter.
    params: the parameters the state was initialised from, or their shapes.

  Returns:
    ``optax_state``'s structure with a `PartitionSpec` at each array leaf.

  Raises:
    optcore.PartitionRuleError: a state type no rule covers, or axes that do
      not fit a leaf (named by its path; register a rule with `register_state_rule`).

  Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> from jax.sharding import PartitionSpec as P
    >>> import optcore
    >>> params = {'w': jnp.zeros((512, 256))}
    >>> state = optax.adafactor(1e-3).init(params)
    >>> axes = optcore.derive_optax_logical_axes(state, {'w': P('embed', 'mlp')}, params)
    >>> axes[0].v_row == {'w': P('mlp')}, axes[0].v_col == {'w': P('embed')}, axes[0].count == P()
    (True, True, True)
  """
  axes = normalize_param_axes(params, params_axes)
  return derive_normalized(optax_state, axes, params)


def derive_normalized(state: Any, params_axes: PyTree, params: PyTree) -> Any:
  """`derive_optax_logical_axes` for ``params_axes`` already normalized (one
  full-rank spec per parameter): what rules call for a nested state."""
  return _derive(state, params_axes, params, ())


def _derive(state: Any, params_axes: PyTree, params: PyTree, keys: tuple) -> Any:
  if state is None:
    return None
  rule = rule_for(type(state))
  if rule is not None:
    try:
      out = rule(state, params_axes, params)
    except PartitionRuleError as e:
      raise PartitionRuleError(f"{_where(keys)}{type(state).__name__}: {e}") from None
    return _complete(out, state, type(state).__name__, keys, ())
  if _is_namedtuple(state):
    name = type(state).__name__
    raise PartitionRuleError(
      f"{_where(keys)}no partition rule for the optax state type {type(state).__module__}."
      f"{type(state).__qualname__} (fields {list(state._fields)}). Register one, for example:\n\n"
      f"    from jax.sharding import PartitionSpec as P\n"
      f"    from optcore import partitioning\n\n"
      f"    @partitioning.register_state_rule({name})\n"
      f"    def _(state, params_axes, params):\n"
      f"      return {name}(\n"
      + "".join(
        f"        {f}=partitioning.like_params(state.{f}, params_axes),  # or None: replicated\n"
        for f in state._fields
      )
      + "      )"
    )
  split = paths.children_with_keys(state)
  if split is None:
    if _is_array(state) and _ndim(state) == 0:
      return PartitionSpec()
    raise PartitionRuleError(
      f"{_where(keys)}{_describe(state)} lies outside any registered state type, so optcore "
      "cannot tell what its dimensions mean. Keep optimizer state in a NamedTuple and "
      "register a rule for it with optcore.register_state_rule."
    )
  children, treedef = split
  return treedef.unflatten(
    [_derive(child, params_axes, params, (*keys, k)) for k, child in children]
  )


def _complete(out: Any, state: Any, rule_name: str, state_keys: tuple, keys: tuple) -> Any:
  """Fills None in a rule's output with replication and checks every spec's rank."""
  if out is None:
    return replicated(state)
  where = f"the rule for {rule_name} at {paths.path_str(state_keys + keys)!r}"
  if isinstance(out, PartitionSpec):
    if not _is_array(state):
      raise PartitionRuleError(f"{where} gave {out} where the state has {_describe(state)}.")
    if len(out) != _ndim(state):
      raise PartitionRuleError(
        f"{where} gave {out} with {len(out)} entries for a leaf of shape {_shape(state)}."
      )
    return out
  if state is None:
    raise PartitionRuleError(f"{where} gave {out!r} where the state has None.")
  out_split, state_split = paths.children_with_keys(out), paths.children_with_keys(state)
  if out_split is None or state_split is None or type(out) is not type(state):
    raise PartitionRuleError(
      f"{where} gave {_describe(out)} where the state has {_describe(state)}."
    )
  out_keys = [k for k, _ in out_split[0]]
  state_children = state_split[0]
  if out_keys != [k for k, _ in state_children]:
    raise PartitionRuleError(
      f"{where} gave keys {[paths.key_name(k) for k in out_keys]}, the state has "
      f"{[paths.key_name(k) for k, _ in state_children]}."
    )
  return state_split[1].unflatten(
    [
      _complete(o, s, rule_name, state_keys, (*keys, k))
      for (_, o), (k, s) in zip(out_split[0], state_children, strict=True)
    ]
  )


def _where(keys: tuple) -> str:
  return f"at {paths.path_str(keys)!r} of the optimizer state: " if keys else ""


def _is_namedtuple(x: Any) -> bool:
  return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _is_array(x: Any) -> bool:
  return (hasattr(x, "shape") and hasattr(x, "dtype")) or isinstance(x, (int, float, complex, bool))


def _is_leaf_tree(tree: Any) -> bool:
  return jax.tree_util.treedef_is_leaf(jax.tree.structure(tree))


def _shape(x: Any) -> tuple[int, ...]:
  shape = getattr(x, "shape", None)
  return tuple(shape) if shape is not None else np.shape(x)


def _ndim(x: Any) -> int:
  return len(_shape(x))


_describe = serialization.describe


class OptaxStatePartitionRules:
  """T5X's name for the rule registry, kept for code written against T5X.

  ``derive_optax_logical_axes(optax_state, params_axes, params)`` and
  ``derive_params_axes(optax_params, params_axes)`` do what the functions of
  the same names do; ``register(state_type, rule)`` adds a rule.

  Example:
    >>> import jax.numpy as jnp, optax
    >>> from jax.sharding import PartitionSpec as P
    >>> from optcore import OptaxStatePartitionRules
    >>> params = {'w': jnp.zeros((4, 2))}
    >>> state = optax.adam(1e-3).init(params)
    >>> axes = OptaxStatePartitionRules.derive_optax_logical_axes(state, {'w': P('a', 'b')}, params)
    >>> axes[0].nu == {'w': P('a', 'b')}
    True
  """

  _RULES = _RULES

  @classmethod
  def derive_optax_logical_axes(cls, optax_state: Any, params_axes: PyTree, params: PyTree):
    return derive_optax_logical_axes(optax_state, params_axes, params)

  @classmethod
  def derive_params_axes(cls, optax_params: PyTree, params_axes: PyTree) -> PyTree:
    return like_params(optax_params, params_axes)

  @classmethod
  def register(cls, state_type: type, rule: Callable[..., Any]) -> None:
    register_state_rule(state_type, rule)
