"""What each field of a state type holds, declared once where the type is defined.

A NamedTuple state annotates each field with one of four public names (the words optax's own
state types use in their comments, ``count: ArrayLike  # shape=()``, made data):

- `ParamShaped`: the parameters' structure, each leaf with its parameter's logical axes (a copy
  of the parameters, a last gradient, a basis); never quantized unless asked for by path;
- `FirstMoment`: a parameter-shaped running average of signed values (adam's ``mu``, a
  momentum trace): quantized by `low_bit_state` with the signed map, carried over by
  `transplant` from any optimizer's first moment;
- `SecondMoment`: the same of non-negative values (adam's ``nu``): the unsigned map;
- `Replicated`: split by no axis (a scalar, a key, a window of norms);
- `Count`: a step counter, replicated; `transplant` keeps it only with all it counts for.

A type optcore does not own (optax's) gets the same declaration in table form with
`declare_state`. Logical axes, ZeRO-1 and host memory, low-bit state, transplant and state dicts
read the declaration (`declared_fields`) and nothing else: no reader decides what a field is by
its name.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Annotated, Any

import jax

from optcore._src.ground import paths

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Role:
  """What one state field holds: how its logical axes follow the parameters' (``axes``:
  ``"params"``, ``"replicated"``, ``"nested"`` or a rule ``(field, state, params_axes, params)
  -> axes``) and whether it is a moment (``moment``: ``"first"``, ``"second"`` or None)."""

  name: str
  axes: Any
  moment: str | None = None
  #: a step counter: `transplant` keeps it only with all the state it counts for
  counts: bool = False

  def with_axes(self, rule: Callable[..., Any]) -> Role:
    """This role with its own axes rule (a factored or per-dimension accumulator)."""
    return dataclasses.replace(self, axes=rule)

  @property
  def is_moment(self) -> bool:
    return self.moment is not None

  @property
  def param_shaped(self) -> bool:
    """Whether its leaves are the parameters' shapes (carried over by `transplant` by shape)."""
    return self.axes == "params"

  def __repr__(self) -> str:
    rule = "" if isinstance(self.axes, str) else f".with_axes({self.axes.__name__})"
    return f"optcore.{self.name}{rule}"


PARAM_SHAPED = Role("ParamShaped", "params")
FIRST_MOMENT = Role("FirstMoment", "params", "first")
SECOND_MOMENT = Role("SecondMoment", "params", "second")
REPLICATED = Role("Replicated", "replicated")
COUNT = Role("Count", "replicated", counts=True)
#: A nested optax state (a combinator's inner state): its own type declares its fields.
NESTED = Role("Nested", "nested")

#: A state field in the parameters' structure that is no moment: a copy of the parameters, a
#: last gradient, a preconditioner's basis. Each leaf takes its parameter's logical axes.
ParamShaped = Annotated[PyTree, PARAM_SHAPED]
#: A parameter-shaped running average of signed values (adam's ``mu``, a momentum trace).
FirstMoment = Annotated[PyTree, FIRST_MOMENT]
#: A parameter-shaped running average of non-negative values (adam's ``nu``).
SecondMoment = Annotated[PyTree, SECOND_MOMENT]
#: A field that no axis splits: a scalar, a key, a window of norms.
Replicated = Annotated[Any, REPLICATED]
#: A step counter (replicated): the count the state's bias corrections and schedules read.
#: `transplant` keeps it only where it keeps all the state it counts for; beside another
#: field of no parameter (a random key) it is the one that counts.
Count = Annotated[Any, COUNT]
#: A nested state whose own type declares its fields (a wrapper's or combinator's inner state).
Nested = Annotated[PyTree, NESTED]

_WORDS = {"params": PARAM_SHAPED, "replicated": REPLICATED, "nested": NESTED}
_PUBLIC = (
  "optcore.ParamShaped, optcore.FirstMoment, optcore.SecondMoment, optcore.Replicated or "
  "optcore.Count"
)

_TABLE: dict[type, Mapping[str, Role]] = {}


class UndeclaredStateError(TypeError):
  """A state type whose fields do not all say what they hold."""


UndeclaredStateError.__module__ = "optcore"


def as_role(value: Any, where: str) -> Role:
  """The `Role` a declaration names: a role, one of the public annotations, optax_rules' words
  (``"params"``, ``"replicated"``, ``"nested"``) or an axes rule (a function)."""
  # an annotation (optcore.FirstMoment) carries its role in its metadata; the alias itself is
  # callable, so it is read before the value is taken as an axes rule
  declared = [m for m in getattr(value, "__metadata__", ()) if isinstance(m, Role)]
  if (role := declared[0] if declared else _role_of(value)) is not None:
    return role
  raise TypeError(f"{where}: {value!r} declares nothing; use {_PUBLIC}")


def _role_of(item: Any) -> Role | None:
  """The `Role` one declaration item names (a role, optax_rules' word, an axes rule), or None
  for anything else an annotation may carry."""
  if isinstance(item, Role):
    return item
  if isinstance(item, str):
    return _WORDS.get(item)
  if callable(item) and not isinstance(item, type):
    return Role("rule", item)
  return None


def declare_state(state_type: type, /, **fields: Any) -> type:
  """Declares what each field of ``state_type`` holds, for a state type you cannot annotate
  (optax's, another library's): the table form of the annotations.

  Args:
    state_type: a NamedTuple state class.
    **fields: one declaration per field: `optcore.ParamShaped`, `optcore.FirstMoment`,
      `optcore.SecondMoment`, `optcore.Replicated` (or a nested state, `optcore.Nested`).

  Returns:
    ``state_type``.

  Raises:
    UndeclaredStateError: ``state_type`` is not a NamedTuple class, or a field is missing,
      unknown or declared with something else.

  Example:
    >>> from typing import NamedTuple
    >>> import optcore
    >>> class TheirState(NamedTuple):  # a library's type, not yours to annotate
    ...   count: object
    ...   slow: object
    ...   velocity: object
    >>> _ = optcore.declare_state(
    ...   TheirState, count=optcore.Replicated, slow=optcore.ParamShaped,
    ...   velocity=optcore.FirstMoment)
    >>> optcore.declared_fields(TheirState)['velocity']
    optcore.FirstMoment
  """
  names = _named_fields(state_type)
  missing = [n for n in names if n not in fields]
  unknown = [n for n in fields if n not in names]
  if missing or unknown:
    raise UndeclaredStateError(
      f"declare_state({state_type.__name__}, ...): its fields are {list(names)}"
      + (f"; missing: {missing}" if missing else "")
      + (f"; not its fields: {unknown}" if unknown else "")
      + f". Declare each field once, as one of {_PUBLIC}."
    )
  _TABLE[state_type] = MappingProxyType(
    {n: as_role(fields[n], f"declare_state({state_type.__name__}, {n}=...)") for n in names}
  )
  _annotated_fields.cache_clear()
  return state_type


def declare_known(state_type: type, /, **fields: Any) -> None:
  """`declare_state` for a table written against one version of a library: a field that
  version lacks is dropped, and one it added stays undeclared (its axes then raise, naming it,
  rather than being guessed)."""
  names = _named_fields(state_type)
  _TABLE[state_type] = MappingProxyType(
    {n: as_role(v, f"{state_type.__name__}.{n}") for n, v in fields.items() if n in names}
  )
  _annotated_fields.cache_clear()


def declared_fields(state_type: type) -> Mapping[str, Role] | None:
  """What each field of ``state_type`` holds, from its annotations or its `declare_state` table
  (the table wins); None for a type that declares nothing.

  Args:
    state_type: a state class.

  Returns:
    ``{field: role}`` for every field, or None.

  Raises:
    UndeclaredStateError: the type annotates some fields and not others, naming them and the
      annotation to add.

  Example:
    >>> from typing import NamedTuple
    >>> import optcore
    >>> class MyState(NamedTuple):
    ...   count: optcore.Replicated
    ...   mu: optcore.FirstMoment
    >>> dict(optcore.declared_fields(MyState))
    {'count': optcore.Replicated, 'mu': optcore.FirstMoment}
  """
  for cls in getattr(state_type, "__mro__", ()):
    if cls in _TABLE:
      return _TABLE[cls]
  if not isinstance(state_type, type) or not hasattr(state_type, "_fields"):
    return None
  return _annotated_fields(state_type)


@functools.cache
def _annotated_fields(state_type: type) -> Mapping[str, Role] | None:
  try:
    hints = typing.get_type_hints(state_type, include_extras=True)
  except Exception as e:  # a name the annotations use is not importable where it is defined
    if not any("optcore" in str(a) for a in getattr(state_type, "__annotations__", {}).values()):
      return None
    raise UndeclaredStateError(
      f"{state_type.__name__}'s annotations cannot be read ({e}): import what they name "
      f"({_PUBLIC}) at the top of its module, not under `if TYPE_CHECKING:`"
    ) from None
  roles = {}
  for name in state_type._fields:
    items = getattr(hints.get(name), "__metadata__", ())
    declared = [m for m in items if isinstance(m, Role)]  # a role before a word or a rule
    found = declared or [role for role in map(_role_of, items) if role is not None]
    if found:
      roles[name] = found[0]
  if not roles:
    return None
  missing = [n for n in state_type._fields if n not in roles]
  if missing:
    raise UndeclaredStateError(undeclared_message(state_type, missing))
  return MappingProxyType(roles)


def undeclared_message(state_type: type, missing: list[str]) -> str:
  """What to write where ``state_type``'s fields ``missing`` declare nothing."""
  name = state_type.__name__
  shown = "\n".join(f"    {field}: optcore.ParamShaped  # or FirstMoment, ..." for field in missing)
  return (
    f"{name}.{missing[0]} declares nothing"
    + (f" (nor {', '.join(missing[1:])})" if len(missing) > 1 else "")
    + f": annotate each field of the state with one of {_PUBLIC}, as\n"
    f"  class {name}(NamedTuple):\n{shown}\n"
    f"or, for a type you cannot edit, optcore.declare_state({name}, "
    f"{', '.join(f'{f}=optcore.ParamShaped' for f in missing[:2])}, ...)."
  )


def known_state_types() -> list[type]:
  """Every state type that declares its fields and is defined in a loaded module: the table's
  and each NamedTuple class whose annotations declare. What `transplant` reads a state dict
  by, whose nodes carry field names but no types."""
  import sys

  found = dict.fromkeys(_TABLE)
  for module in list(sys.modules.values()):
    for value in list(getattr(module, "__dict__", {}).values()):
      if (
        isinstance(value, type)
        and issubclass(value, tuple)
        and "__annotations__" in vars(value)
        and value not in found
      ):
        try:
          if declared_fields(value) is not None:
            found[value] = None
        except UndeclaredStateError:
          continue
  return list(found)


def _named_fields(state_type: Any) -> tuple[str, ...]:
  if not (isinstance(state_type, type) and isinstance(getattr(state_type, "_fields", None), tuple)):
    raise UndeclaredStateError(f"declare_state takes a NamedTuple state class, got {state_type!r}")
  return state_type._fields


def leaf_roles(tree: PyTree, *, is_leaf: Callable[[Any], bool] | None = None) -> dict:
  """``{key path: role}`` for each leaf of ``tree`` under a declared field, the innermost
  declaration winning (a nested state's own fields over its owner's `Nested`); a leaf under no
  declared field is absent. Key paths are `jax.tree_util`'s, from the top of ``tree``."""
  out: dict = {}

  def visit(keys: tuple, node: Any, role: Role | None) -> None:
    if is_leaf is not None and is_leaf(node) and keys:
      if role is not None:
        out[keys] = role
      return
    fields = declared_fields(type(node)) if hasattr(node, "_fields") else None
    if fields is not None:
      for name in node._fields:
        declared = fields.get(name)
        # a nested state's own fields say what they are; a field it does not know keeps the
        # role of the field that holds the state
        inner = None if declared is NESTED else (declared or role)
        visit((*keys, jax.tree_util.GetAttrKey(name)), getattr(node, name), inner)
      return
    split = paths.children_with_keys(node)
    if split is None:  # a leaf
      if role is not None:
        out[keys] = role
      return
    for key, child in split[0]:
      visit((*keys, key), child, role)

  visit((), tree, None)
  return out


def undeclared_types(tree: PyTree) -> list[tuple[tuple, type]]:
  """Each NamedTuple state node of ``tree`` whose type declares nothing, with its key path: the
  containers of states (tuples, lists, dicts) and each declared `Nested` field are entered, a
  field declared as data (`ParamShaped`, a moment, `Replicated`) is not."""
  found: list[tuple[tuple, type]] = []

  def visit(keys: tuple, node: Any) -> None:
    if isinstance(node, tuple) and hasattr(node, "_fields"):
      fields = declared_fields(type(node))
      if fields is None:
        found.append((keys, type(node)))
        return
      for name in getattr(node, "_fields"):  # noqa: B009  (a NamedTuple, which tuple is not)
        if fields.get(name) is NESTED:
          visit((*keys, jax.tree_util.GetAttrKey(name)), getattr(node, name))
      return
    split = paths.children_with_keys(node)
    for key, child in split[0] if split is not None else ():
      visit((*keys, key), child)

  visit((), tree)
  return found
