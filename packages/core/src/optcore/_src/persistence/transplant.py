"""State transplant: an optimizer's state from a state dict written for another
optimizer or other parameters, leaf by leaf where path, role and shape still match.

A state leaf is identified by the parameter it belongs to and its role there:
``param_states/0/mu/dense/kernel`` (optax: the role before the parameter's
path) and ``param_states/dense/kernel/grad_ema`` (flax.optim and T5X: the role
after it) are both ``mu`` of ``dense/kernel``. Where the names differ, a moment is matched by
the role its state type declares (`optcore.FirstMoment`, `optcore.SecondMoment`): flax.optim's
``grad_ema`` fills optax's ``mu``, adam's ``mu`` a user's declared first moment. Leaves of no
parameter (counts, the step) are identified by their name and the roles they sit beside:
adam's ``count`` beside ``mu`` and ``nu``, a schedule's ``count`` alone. The structure around
them (chain indices, wrappers) does not matter, so adam's state moves into
adamw's, into ``accumulate(adam)``, or out of a flax.optim checkpoint.

Two rules keep a transplant from making updates no optimizer would: one
parameter's state under one count is kept whole or not at all, and a count
is kept only with all the state it counts for (see docs/concepts/transplant.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np

from optcore._src.ground import declarations, paths, stored
from optcore._src.ground.checks import dtype_name
from optcore._src.persistence import placement
from optcore._src.persistence.serialization import (
  StateDictError,
  describe,
  restore_state_only,
  state_only_dict,
  to_state_dict,
)

PyTree = Any
Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class TransplantEntry:
  """One state leaf in a `TransplantReport`.

  Attributes:
    path: the leaf's path in the new state (``'param_states/0/mu/dense/kernel'``);
      for a dropped leaf, its path in the state dict.
    source: where a kept (or reshaped) leaf was in the state dict; None otherwise.
    note: why, where it is not plain: a cast, a shape change, a count taken from the step.
  """

  path: str
  source: str | None = None
  note: str = ""


@dataclasses.dataclass(frozen=True)
class TransplantReport:
  """What `optcore.transplant` did with every state leaf.

  ``kept``: leaves read from the state dict; ``initialised``: leaves as
  ``init`` makes them (a new parameter, a role the old optimizer did not
  have, a shape that changed: the note gives both shapes); ``dropped``: state
  dict leaves nothing reads any more. ``str(report)`` is a short table.
  """

  kept: tuple[TransplantEntry, ...]
  initialised: tuple[TransplantEntry, ...]
  dropped: tuple[TransplantEntry, ...]

  #: Rows shown per category by ``str()``; the rest are counted.
  rows_shown = 12

  def __str__(self) -> str:
    counts = (
      f"{len(self.kept)} kept, {len(self.initialised)} initialised, {len(self.dropped)} dropped"
    )
    lines = [f"transplant: {counts}"]
    rows = []
    for name, entries in (
      ("kept", self.kept),
      ("initialised", self.initialised),
      ("dropped", self.dropped),
    ):
      for entry in entries[: self.rows_shown]:
        detail = entry.note
        if entry.source is not None and entry.source != entry.path:
          detail = f"from {entry.source}" if name == "kept" else f"{entry.source}:"
          detail = ("; " if name == "kept" else " ").join(filter(None, [detail, entry.note]))
        rows.append((name, entry.path, detail))
      if len(entries) > self.rows_shown:
        rows.append((name, f"... and {len(entries) - self.rows_shown} more", ""))
    width = max((len(path) for _, path, _ in rows), default=0)
    for name, path, detail in rows:
      lines.append(f"  {name:<11}  {path:<{width}}  {detail}".rstrip())
    return "\n".join(lines)


class _Found(NamedTuple):
  """What the state dict has for one leaf: its value (None where it is not kept), the
  leaf it came from, why it is not kept (empty where it is) and a note on how it was."""

  value: Any
  source: _Leaf | None
  problem: str
  note: str = ""


@dataclasses.dataclass
class _Leaf:
  path: Path
  value: Any
  param: Path | None = None
  role: str | None = None
  key: tuple = ()
  #: what the leaf's state type declares it is (`declarations.Role`), None where nothing does
  declared: declarations.Role | None = None

  @property
  def moment(self) -> str | None:
    return None if self.declared is None else self.declared.moment

  @property
  def may_restart_alone(self) -> bool:
    """A copy of the parameters or a last gradient (declared `ParamShaped`, not a moment)
    starts anew beside kept moments without making them wrong; a moment or a basis cannot."""
    return self.declared is not None and self.declared.param_shaped and not self.moment


def transplant_state(
  optimizer_def: Any, params: PyTree, state: Any, state_dict: Mapping[str, Any]
) -> tuple[Any, TransplantReport]:
  """``state`` with every leaf that ``state_dict`` still holds for it (same
  parameter, same role, same shape), the rest as ``state`` has them; and the
  report. What a face's ``transplant`` calls; ``state`` is untouched.

  Args:
    optimizer_def: the definition ``state`` belongs to.
    params: the parameters ``state`` was initialised for (their paths find
      each leaf's parameter; their values are not read).
    state: the `OptimizerState` to fill, as ``init_state(params)`` made it
      (its step may be None, as in faces that keep none).
    state_dict: any face's state dict (``{'state': ...}``, with or without
      ``'target'``), or an old flax.optim or T5X checkpoint's.

  Returns:
    ``(new_state, report)``.

  Raises:
    optcore.StateDictError: ``state_dict`` has no ``'state'`` dict.

  Example (a new head, which the old state has nothing for):
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> from optcore import adapter
    >>> old = optcore.adam(0.1).create({'w': jnp.ones(2)}).apply_gradient({'w': jnp.ones(2)})
    >>> opt_def, params = optcore.adam(0.1), {'w': jnp.ones(2), 'head': jnp.zeros(3)}
    >>> state, report = adapter.transplant_state(
    ...     opt_def, params, opt_def.init_state(params), old.state_dict())
    >>> print(report)
    transplant: 3 kept, 3 initialised, 1 dropped
      kept         step
      kept         param_states/0/mu/w
      kept         param_states/0/nu/w
      initialised  param_states/0/count    2 of the 4 leaves it counts for start anew
      initialised  param_states/0/mu/head  a parameter the state dict has no state for
      initialised  param_states/0/nu/head  a parameter the state dict has no state for
      dropped      param_states/0/count
    >>> state.param_states[0].mu['w']
    Array([0.1, 0.1], dtype=float32)
  """
  if not isinstance(state_dict, Mapping) or not isinstance(state_dict.get("state"), Mapping):
    raise StateDictError(
      f"transplant: expected a state dict with a 'state' dict, found {describe(state_dict)}. "
      "Pass what an optimizer's state_dict() returns (any face's), or a flax.optim or T5X "
      "checkpoint's dict."
    )
  quantized = state
  state = stored.values(state)  # a low_bit_state's leaves are matched by their values
  written = state_only_dict(optimizer_def, state)["state"]
  param_paths = _leaf_paths(to_state_dict(params))
  source_target = state_dict.get("target")
  if isinstance(source_target, Mapping):  # an old model's parameters: located, then dropped
    param_paths |= _leaf_paths(source_target)
  lengths = sorted({len(p) for p in param_paths}, reverse=True)
  new_roles = _declared_paths(state.param_states)
  new = _classify(_flatten(written), param_paths, lengths, new_roles)
  old_roles = _inferred_roles(state_dict["state"])
  old = _classify(_flatten(state_dict["state"]), param_paths, lengths, old_roles)
  by_key = {leaf.key: leaf for leaf in old}
  old_step = by_key.get(("step",))
  old_counters, old_counted_by = _counters(old), _counted_by(old)

  # A count (adam's, accumulate's mini_step) counts for the parameter state it sits beside,
  # the leaves whose nearest count it is.
  counters = _counters(new)
  counted_by = _counted_by(new)

  def match(leaf: _Leaf, source: _Leaf | None, note: str = "") -> _Found:
    if source is None:
      return _Found(None, None, _why_new(leaf, old))
    value, problem = _fit(source.value, leaf.value)
    return _Found(None if problem else value, source, problem, "" if problem else note)

  found: dict[Path, _Found] = {}
  by_role: set[Path] = set()
  for leaf in new:
    if leaf.param is None and counters.get(leaf.path[:-1]) is leaf:
      continue  # decided below, from what was kept beside it
    source = by_key.get(leaf.key) or _same_name_beside(leaf, old)
    if source is None and (source := _same_moment(leaf, old)) is not None:
      found[leaf.path] = match(leaf, source, f"its declared {leaf.moment} moment")
      by_role.add(leaf.path)
      continue
    found[leaf.path] = match(leaf, source)

  # A moment read by its declared role, not its name, is not read beside a basis that starts
  # anew (a parameter-shaped leaf that is no moment and cannot restart alone: SOAP's and
  # Shampoo's matrices): moments kept in a basis that does not exist yet would not mean what
  # adam's meant. A new head's moments (moments) or a copy of the parameters do not stop it.
  for owner in counters:
    counted = [p for p in new if p.param is not None and counted_by[p.path] == owner]
    fresh_basis = [
      p for p in counted if found[p.path].problem and not p.may_restart_alone and not p.moment
    ]
    if fresh_basis:
      for p in counted:
        if p.path in by_role and not found[p.path].problem:
          why = f"read by its role only beside its basis, and {fresh_basis[0].role!r} starts anew"
          found[p.path] = _Found(None, found[p.path].source, why)

  # One parameter's state under one count is kept whole or not at all: adam's mu beside a
  # nu that starts anew (muon's momentum into adamw's) would make updates of mu / sqrt(0).
  groups: dict[tuple, list[_Leaf]] = {}
  for leaf in new:
    if leaf.param is not None:
      groups.setdefault((counted_by[leaf.path], leaf.param), []).append(leaf)
  for members in groups.values():
    members = [m for m in members if not m.may_restart_alone]
    missing = sorted({str(m.role) for m in members if found[m.path].problem})
    if missing and len(missing) < len(members):
      verb = "starts" if len(missing) == 1 else "start"
      roles = ", ".join(map(repr, missing))
      for m in members:
        if not found[m.path].problem:
          why = f"kept alone, it would not match the {roles} that {verb} anew"
          found[m.path] = _Found(None, found[m.path].source, why)

  # A count is kept only with all the state it counts for: over moments that start from
  # zero a kept count would skip their bias correction (first updates up to 1/sqrt(1-b2) big).
  for owner, leaf in counters.items():
    # every leaf it counts for, a copy that may restart alone included: an EMA's count
    # debiases its average, and a count kept over any fresh leaf would skip a bias correction
    counted = [p for p in new if p.param is not None and counted_by[p.path] == owner]
    fresh = [p for p in counted if found[p.path].problem]
    if fresh:
      why = (
        "none of the state it counts for was kept"
        if len(fresh) == len(counted)
        else f"{len(fresh)} of the {len(counted)} leaves it counts for start anew"
      )
      found[leaf.path] = _Found(None, None, why)
      continue
    source = by_key.get(leaf.key) or _same_name_beside(leaf, old)
    if source is None:  # the count of the moments it counts for, where they came from one
      sources = [found[p.path].source for p in counted]
      owners = {old_counted_by.get(s.path) for s in sources if s is not None}
      owner = next(iter(owners)) if len(owners) == 1 else None
      counter = old_counters.get(owner) if owner is not None else None
      if counter is not None and leaf.declared is not None and counter.declared is not None:
        found[leaf.path] = match(leaf, counter, "the count of the moments kept")
        continue
    if source is None and old_step is not None and leaf.path[-1] == "count":
      found[leaf.path] = match(leaf, old_step, "flax.optim counts with the step")
    else:
      found[leaf.path] = match(leaf, source)

  values: dict[Path, Any] = {}
  kept: list[TransplantEntry] = []
  initialised: list[TransplantEntry] = []
  used: set[Path] = set()
  for leaf in new:
    value, source, problem, note = found[leaf.path]
    path, source_path = "/".join(leaf.path), source and "/".join(source.path)
    if problem or source is None:
      initialised.append(TransplantEntry(path, source_path, problem))
      continue
    used.add(source.path)
    values[leaf.path] = placement.placed_like(value, leaf.value)
    note = "; ".join(filter(None, [note, _cast_note(source.value, leaf.value)]))
    kept.append(TransplantEntry(path, source_path, note))
  dropped = tuple(TransplantEntry("/".join(leaf.path)) for leaf in old if leaf.path not in used)

  filled = _replace_leaves(written, values)
  new_state = restore_state_only(optimizer_def, state, {"state": filled})
  new_state = stored.stored_like(new_state, quantized)
  return new_state, TransplantReport(tuple(kept), tuple(initialised), dropped)


def _counters(leaves: list[_Leaf]) -> dict[Path, _Leaf]:
  """Each count (adam's, accumulate's mini_step) by the path it sits in: a leaf of no parameter
  beside parameters' state; where several sit there (Dion's count and key), the one declared
  `optcore.Count`."""
  out: dict[Path, _Leaf] = {}
  for leaf in leaves:
    if leaf.param is None and leaf.key != ("step",) and leaf.key[1]:
      held = out.get(leaf.path[:-1])
      if held is None or not (held.declared is not None and held.declared.counts):
        out[leaf.path[:-1]] = leaf
  return out


def _counted_by(leaves: list[_Leaf]) -> dict[Path, Path | None]:
  """Each parameter's leaf and the place of its nearest count."""
  counters = _counters(leaves)
  return {
    leaf.path: max((o for o in counters if _under(leaf.path, o)), key=len, default=None)
    for leaf in leaves
    if leaf.param is not None
  }


def _same_moment(leaf: _Leaf, old: list[_Leaf]) -> _Leaf | None:
  """The one leaf of the state dict that holds the same parameter's moment of the same kind
  (first or second) as ``leaf`` is declared to: adam's ``mu`` for any optimizer's
  `optcore.FirstMoment`, flax.optim's ``grad_sq_ema`` for its `optcore.SecondMoment`."""
  if leaf.param is None or leaf.moment is None:
    return None
  found = [o for o in old if o.param == leaf.param and o.moment == leaf.moment]
  return found[0] if len(found) == 1 else None


def _declared_paths(param_states: Any) -> dict[Path, declarations.Role]:
  """The declared role of each leaf of a live state, by its state-dict path."""
  roles = declarations.leaf_roles(param_states)
  # A state dict names a leaf by its canonical path (no framework-internal level, as treeo's):
  # the same leaves in the same order, named as the state dict names them.
  keyed = jax.tree_util.tree_flatten_with_path(param_states)[0]
  named = paths.leaves_with_names(param_states)[0]  # a hidden level holds one child: as many
  return {
    ("param_states", *names): roles[keys]
    for (keys, _), (names, _) in zip(keyed, named, strict=True)
    if keys in roles
  }


def _inferred_roles(state: Mapping[str, Any]) -> dict[Path, declarations.Role]:
  """The roles of a state dict's leaves, read from its nodes: a node whose keys are exactly
  the fields of declared state types that agree on a field's role gives that role to the
  leaves below the field (the innermost node deciding). A state dict keeps field names, not
  types; nothing is read from a name alone."""
  by_fields: dict[frozenset, list[Mapping[str, declarations.Role]]] = {}
  for state_type in declarations.known_state_types():
    fields = declarations.declared_fields(state_type)
    if fields:
      by_fields.setdefault(frozenset(fields), []).append(fields)
  out: dict[Path, declarations.Role] = {}

  def visit(node: Any, prefix: Path) -> None:
    if not isinstance(node, Mapping):
      return
    present = frozenset(str(k) for k in node)
    # a field holding None (RMSProp's mg when not centered) is absent from a state dict
    candidates = [f for keys, fs in by_fields.items() if present <= keys for f in fs]
    for key, value in node.items():
      roles = {f[str(key)] for f in candidates}
      if len(roles) == 1:
        role = roles.pop()
        for path, _ in _flatten(value, (*prefix, str(key))):
          out[path] = role
      visit(value, (*prefix, str(key)))

  visit(state, ())
  return out


def _leaf_paths(tree: Any) -> set[Path]:
  return {path for path, _ in _flatten(tree)}


@paths.allows_deep_trees
def _flatten(tree: Any, prefix: Path = ()) -> list[tuple[Path, Any]]:
  """The (path, value) of every leaf of a nested dict; None and empty dicts have none."""
  if isinstance(tree, Mapping):
    out = []
    for key, value in tree.items():
      out.extend(_flatten(value, (*prefix, str(key))))
    return out
  return [] if tree is None else [(prefix, tree)]


def _classify(
  leaves: list[tuple[Path, Any]],
  params: set[Path],
  lengths: list[int],
  declared: Mapping[Path, declarations.Role],
) -> list[_Leaf]:
  """Each leaf with its parameter and role, and the key it is matched by."""
  out = [_Leaf(path, value, declared=declared.get(path)) for path, value in leaves]
  for leaf in out:
    path = leaf.path
    for n in lengths:  # optax's layout: .../role/<param>; the longest parameter path wins
      if len(path) > n and path[-n:] in params:
        leaf.param, leaf.role = path[-n:], path[-n - 1]
        break
    else:
      for n in lengths:  # flax.optim's and T5X's: .../<param>/role
        if _is_counter(leaf.value):  # optax's .../<index>/count under list parameters [w, b]
          break
        if len(path) > n and path[-n - 1 : -1] in params:
          leaf.param, leaf.role = path[-n - 1 : -1], path[-1]
          break
  seen: dict[tuple, int] = {}
  for leaf in out:
    if leaf.param is not None:
      base: tuple = ("param", leaf.param, leaf.role)
    elif leaf.path == ("step",):
      leaf.key = ("step",)
      continue
    else:
      owner = leaf.path[:-1]
      roles = frozenset(p.role for p in out if p.param is not None and _under(p.path, owner))
      base = (leaf.path[-1], roles)
    leaf.key = (*base, seen.get(base, 0))
    seen[base] = seen.get(base, 0) + 1
  return out


def _is_counter(value: Any) -> bool:
  """An integer scalar: a count (optax's ``count``, a ``mini_step``), never a parameter's
  state in flax.optim's layout, whose roles are float arrays."""
  dtype = getattr(value, "dtype", None)
  return dtype is not None and np.ndim(value) == 0 and np.issubdtype(dtype, np.integer)


def _same_name_beside(leaf: _Leaf, old: list[_Leaf]) -> _Leaf | None:
  """The one leaf of the same name beside some of the same roles (``mini_step``
  beside ``accumulated`` when a wrapper added ``master`` around it), if one."""
  if leaf.param is not None or len(leaf.key) < 3 or not leaf.key[1]:
    return None
  name, roles = leaf.key[0], leaf.key[1]
  found = [o for o in old if o.param is None and len(o.key) == 3 and o.key[0] == name]
  found = [o for o in found if o.key[1] & roles]
  return found[0] if len(found) == 1 else None


def _under(path: Path, owner: Path) -> bool:
  return path[: len(owner)] == owner


def _why_new(leaf: _Leaf, old: list[_Leaf]) -> str:
  if leaf.param is None:
    return "not in the state dict"
  if not any(o.param == leaf.param for o in old):
    return "a parameter the state dict has no state for"
  return f"the state dict has no {leaf.role!r} for this parameter"


def _fit(value: Any, reference: Any) -> tuple[Any, str]:
  """``value`` in the reference's dtype, or why it cannot be."""
  shape, ref_shape = tuple(np.shape(value)), tuple(np.shape(reference))
  if shape != ref_shape:
    return None, f"shape {shape} in the state dict, {ref_shape} here"
  dtype, ref_dtype = getattr(value, "dtype", None), getattr(reference, "dtype", None)
  if ref_dtype is None or dtype == ref_dtype:  # a Python number: restore_state checks it
    return value, ""
  kind, ref_kind = _kind(value), _kind(reference)
  if kind is None or kind != ref_kind:
    return None, f"{describe(value)} in the state dict, {describe(reference)} here"
  return (value.astype(ref_dtype) if hasattr(value, "astype") else np.asarray(value, ref_dtype)), ""


def _kind(x: Any) -> str | None:
  """'f' (floating, bfloat16 included), 'i' (integer) or 'b'; None for anything else
  (typed PRNG keys, complex numbers: kept only where the dtype is the same)."""
  dtype = getattr(x, "dtype", None)
  dtype = np.asarray(x).dtype if dtype is None else dtype
  for kind, family in (("b", np.bool_), ("i", np.integer), ("f", np.floating)):
    if jnp.issubdtype(dtype, family):
      return kind
  return None


def _cast_note(value: Any, reference: Any) -> str:
  dtype = getattr(value, "dtype", None)
  if dtype is None or np.dtype(dtype) == np.dtype(reference.dtype):
    return ""
  return f"cast {dtype_name(dtype)} to {dtype_name(reference.dtype)}"


def _replace_leaves(tree: Any, values: dict[Path, Any], prefix: Path = ()) -> Any:
  if isinstance(tree, Mapping):
    return {k: _replace_leaves(v, values, (*prefix, str(k))) for k, v in tree.items()}
  return values.get(prefix, tree)


def transplant(
  optimizer: Any, state_dict: Mapping[str, Any], params: PyTree | None = None
) -> tuple[Any, TransplantReport]:
  """``optimizer`` holding what ``state_dict`` still has for it, and a report.

  Every state leaf whose parameter, role and shape still match is read from
  ``state_dict`` (Adam's ``mu`` and ``nu`` into AdamW's or into
  ``accumulate(adam)``'s, flax.optim's ``grad_ema``/``grad_sq_ema`` and
  ``momentum`` into optax's ``mu``/``nu`` and ``trace``, a count with the
  state beside it, the step); the others stay as ``optimizer`` holds them (as
  ``create``/``init`` made them, for a new one); what nothing reads is
  dropped. One parameter's state is kept whole or not at all (no ``mu``
  beside a ``nu`` that starts anew), and a count only with all the state it
  counts for (a new head's moments restart adam's count: kept, it would skip
  their bias correction). A dtype that differs is cast (bfloat16 state into
  float32); a shape that differs is never read: the leaf is reported as
  initialised, with both shapes. `restore_state` stays the strict way back.

  Fine-tuning a model with a new head and another optimizer::

    new_opt = optcore.adamw(1e-4).create(new_params)
    new_opt, report = optcore.transplant(new_opt, old_opt.state_dict())
    print(report)  # kept / initialised / dropped, by path

  Args:
    optimizer: a core or Flax `Optimizer`, an ``optcore_equinox.Optimizer``
      or an ``optcore_treex.Optimizer`` (anything with a ``transplant``
      method).
    state_dict: any face's state dict (with or without ``'target'``), or an
      old flax.optim or T5X checkpoint's dict.
    params: the parameters, for a face whose optimizer does not hold them
      (Equinox: the model; Treex: the parameters given to ``init``).

  Returns:
    ``(new_optimizer, report)``: a `TransplantReport` (``print`` it for a
    table). ``optimizer`` is untouched.

  Raises:
    TypeError: ``optimizer`` is not an optcore optimizer of any face, or its
      face needs ``params`` and none were given.
    optcore.StateDictError: ``state_dict`` has no ``'state'`` dict.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> from optcore import legacy
    >>> params = {'w': jnp.ones(2)}
    >>> old = legacy.Adam(0.1).create(params).apply_gradient({'w': jnp.ones(2)})
    >>> opt, report = optcore.transplant(optcore.adamw(0.1).create(params), old.state_dict())
    >>> print(report)
    transplant: 4 kept, 0 initialised, 0 dropped
      kept         step
      kept         param_states/0/count  from step; flax.optim counts with the step
      kept         param_states/0/mu/w   from param_states/w/grad_ema; its declared first moment
      kept         param_states/0/nu/w   from param_states/w/grad_sq_ema; its declared second moment
    >>> opt.state.param_states[0].mu['w'] == old.state.param_states['w'].grad_ema
    Array([ True,  True], dtype=bool)
  """
  method = getattr(optimizer, "transplant", None)
  if not callable(method):
    raise TypeError(
      f"optcore.transplant: expected an optimizer of an optcore face (optcore.Optimizer, "
      f"optcore_flax's, optcore_equinox.Optimizer, optcore_treex.Optimizer), found "
      f"{type(optimizer).__name__}. For a definition and a state, call "
      "optcore.adapter.transplant_state(opt_def, params, state, state_dict)."
    )
  return cast(
    tuple[Any, TransplantReport],
    method(state_dict) if params is None else method(state_dict, params),
  )
