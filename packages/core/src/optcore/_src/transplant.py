"""State transplant: an optimizer's state from a state dict written for another
optimizer or other parameters, leaf by leaf where path, role and shape still match.

A state leaf is identified by the parameter it belongs to and its role there:
``param_states/0/mu/dense/kernel`` (optax: the role before the parameter's
path) and ``param_states/dense/kernel/grad_ema`` (flax.optim and T5X: the role
after it) are both ``mu`` of ``dense/kernel``; flax.optim's names are read as
optax's (`ROLE_ALIASES`). Leaves of no parameter (counts, the step) are
identified by their name and the roles they sit beside: adam's ``count``
beside ``mu`` and ``nu``, a schedule's ``count`` alone. The structure around
them (chain indices, wrappers) does not matter, so adam's state moves into
adamw's, into ``accumulate(adam)``, or out of a flax.optim checkpoint.

Two rules keep a transplant from making updates no optimizer would: one
parameter's state under one count is kept whole or not at all, and a count
is kept only with all the state it counts for (see docs/concepts/transplant.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from optcore._src import paths, placement, stored
from optcore._src.checks import dtype_name
from optcore._src.serialization import (
  StateDictError,
  describe,
  restore_state_only,
  state_only_dict,
  to_state_dict,
)

PyTree = Any
Path = tuple[str, ...]

#: flax.optim's (and optcore.legacy's) names for the state optax calls ``mu``,
#: ``nu`` and ``trace``: the same quantities, updated by the same formulas.
ROLE_ALIASES: dict[str, str] = {
  "grad_ema": "mu",  # Adam, LAMB, ...: the moving average of the gradients
  "grad_sq_ema": "nu",  # ... and of their squares
  "momentum": "trace",  # Momentum, LARS: optax's trace (sgd's momentum)
}


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
  new = _classify(_flatten(written), param_paths, lengths)
  old = _classify(_flatten(state_dict["state"]), param_paths, lengths)
  by_key = {leaf.key: leaf for leaf in old}
  old_step = by_key.get(("step",))

  # A count (adam's, accumulate's mini_step) counts for the parameter state it sits beside,
  # the leaves whose nearest count it is.
  counters = {
    leaf.path[:-1]: leaf
    for leaf in new
    if leaf.param is None and leaf.key != ("step",) and leaf.key[1]
  }
  counted_by = {
    leaf.path: max((o for o in counters if _under(leaf.path, o)), key=len, default=None)
    for leaf in new
    if leaf.param is not None
  }

  def match(leaf: _Leaf, source: _Leaf | None, note: str = "") -> _Found:
    if source is None:
      return _Found(None, None, _why_new(leaf, old))
    value, problem = _fit(source.value, leaf.value)
    return _Found(None if problem else value, source, problem, "" if problem else note)

  found: dict[Path, _Found] = {}
  for leaf in new:
    if leaf.param is None and counters.get(leaf.path[:-1]) is leaf:
      continue  # decided below, from what was kept beside it
    found[leaf.path] = match(leaf, by_key.get(leaf.key) or _same_name_beside(leaf, old))

  # One parameter's state under one count is kept whole or not at all: adam's mu beside a
  # nu that starts anew (muon's momentum into adamw's) would make updates of mu / sqrt(0).
  groups: dict[tuple, list[_Leaf]] = {}
  for leaf in new:
    if leaf.param is not None:
      groups.setdefault((counted_by[leaf.path], leaf.param), []).append(leaf)
  for members in groups.values():
    missing = sorted({m.role for m in members if found[m.path].problem})
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
    if problem:
      initialised.append(TransplantEntry(path, source_path, problem))
      continue
    used.add(source.path)
    values[leaf.path] = placement.placed_like(value, leaf.value)
    note = "; ".join(filter(None, [note, _cast_note(source.value, leaf.value)]))
    kept.append(TransplantEntry(path, source_path, note))
  dropped = tuple(TransplantEntry("/".join(leaf.path)) for leaf in old if leaf.path not in used)
  kept, initialised = tuple(kept), tuple(initialised)

  filled = _replace_leaves(written, values)
  new_state = restore_state_only(optimizer_def, state, {"state": filled})
  new_state = stored.stored_like(new_state, quantized)
  return new_state, TransplantReport(kept, initialised, dropped)


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


def _classify(leaves: list[tuple[Path, Any]], params: set[Path], lengths: list[int]) -> list[_Leaf]:
  """Each leaf with its parameter and role, and the key it is matched by."""
  out = [_Leaf(path, value) for path, value in leaves]
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
    if leaf.role is not None:
      leaf.role = ROLE_ALIASES.get(leaf.role, leaf.role)
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
    if jax.dtypes.issubdtype(dtype, family):
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
      kept         param_states/0/mu/w   from param_states/w/grad_ema
      kept         param_states/0/nu/w   from param_states/w/grad_sq_ema
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
  return method(state_dict) if params is None else method(state_dict, params)
