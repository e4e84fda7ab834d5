"""`with_statistics`: per-layer gradient, update and parameter norms, computed inside the step
and kept in the state for logging (one wrapper of the wrapper protocol,
`optcore._src.definitions.wrapper`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import StateWrapper
from optcore._src.ground.declarations import Nested
from optcore._src.ground.paths import some_paths
from optcore._src.ground.state import OptimizerState
from optcore._src.ground.traversal import leaves_with_paths
from optcore._src.ground.user_warnings import warn

PyTree = Any

#: The name of the group of every parameter together.
GLOBAL = "global"
#: What each group's entry holds, in order.
FIELDS = ("grad_norm", "update_norm", "param_norm")


@jax.tree_util.register_pytree_with_keys_class
class GroupNorms:
  """Each group's last norms as the rows of one array, the groups' names beside it (static).

  One array, not one per group: a jitted step writes each output array with a kernel of its
  own, and a group a layer is hundreds of them (issue 52: x1.53 against x1.19 the plain adamw
  step at 1M parameters in 310 groups). State dicts keep an array a group (`state_dict_form`).

  Attributes:
    norms: float32 ``(len(names), 3)``; row ``i`` is group ``names[i]``'s ``[grad_norm,
      update_norm, param_norm]`` (`FIELDS`).
    names: the groups' names, ``'global'`` last.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.with_statistics(optcore.sgd(1.0)).create({'a': jnp.ones(4), 'b': jnp.ones(1)})
    >>> kept = opt.apply_gradient({'a': jnp.ones(4), 'b': jnp.zeros(1)}).state.param_states.values
    >>> kept.names, kept.norms.shape, float(kept.rows()['a'][0])
    (('a', 'b', 'global'), (3, 3), 2.0)
  """

  def __init__(self, norms: Any, names: tuple[str, ...]):
    self.norms = norms
    self.names = tuple(names)

  def tree_flatten_with_keys(self) -> tuple:
    return ((jax.tree_util.GetAttrKey("norms"), self.norms),), self.names

  @classmethod
  def tree_unflatten(cls, names: tuple[str, ...], children: Any) -> GroupNorms:
    return cls(children[0], names)

  def rows(self) -> dict[str, Any]:
    """``{group: float32 (3,)}``, in ``names``' order."""
    if isinstance(self.norms, np.ndarray):
      return {name: self.norms[i] for i, name in enumerate(self.names)}
    # a static slice, not an index: JAX 0.10 gathers ``norms[i]`` with the index in device
    # memory, which an array placed in host memory on a mesh refuses
    row = lambda i: jax.lax.index_in_dim(self.norms, i, keepdims=False)
    return {name: row(i) for i, name in enumerate(self.names)}

  def state_dict_form(self) -> dict[str, Any]:
    """What a state dict holds of it (`optcore.to_state_dict`): `rows`, an array a group, the
    layout state dicts and checkpoints had before the rows were one array. A tree of logical
    axes or of abstract arrays gives each row's."""
    norms = self.norms
    if isinstance(norms, PartitionSpec):
      return {name: PartitionSpec(*norms[1:]) for name in self.names}
    if isinstance(norms, jax.ShapeDtypeStruct):
      row = jax.ShapeDtypeStruct(norms.shape[1:], norms.dtype)
      return {name: row for name in self.names}
    if np.shape(norms)[:1] == (len(self.names),):
      return self.rows()
    return {name: norms for name in self.names}  # None, or one value for every row

  def from_state_dict_form(self, rows: Mapping[str, Any]) -> GroupNorms:
    """These names with ``rows`` (`state_dict_form`'s layout, read and checked against it)."""
    found = [rows[name] for name in self.names]
    if isinstance(found[0], PartitionSpec):
      return GroupNorms(PartitionSpec(None, *found[0]), self.names)
    if all(hasattr(row, "shape") and not isinstance(row, jax.ShapeDtypeStruct) for row in found):
      return GroupNorms(jnp.stack(found), self.names)
    return GroupNorms(found[0], self.names)

  def __eq__(self, other: object) -> bool:  # as a NamedTuple compares: field by field
    if type(other) is not type(self):
      return NotImplemented
    return self.names == other.names and (self.norms,) == (other.norms,)

  __hash__ = None  # type: ignore[assignment]  # holds an array

  def __repr__(self) -> str:
    shown = tuple(self.norms.shape) if hasattr(self.norms, "shape") else self.norms
    return f"GroupNorms({shown}, names={self.names})"


class StatisticsState(NamedTuple):
  """The state of `with_statistics`.

  Attributes:
    inner: the wrapped definition's ``param_states``.
    values: `GroupNorms`: the last step's gradient, update and parameter (after the update) L2
      norms of each group, ``'global'`` for all parameters together, as one float32
      ``(groups, 3)`` array; a state dict holds an array a group (``values/global``).
  """

  inner: Nested
  values: Annotated[GroupNorms, "replicated"]

  def logged(self) -> dict[str, jax.Array]:
    """What `optcore.statistics` shows of it: `as_flat_dict` of ``values``' rows."""
    return as_flat_dict(self.values.rows())


class WithStatistics(StateWrapper):
  """``optimizer_def`` with per-group norms kept for logging: see `with_statistics`."""

  ungrouped_because = "computes each parameter's norms, a reduction over the whole parameter"

  name = "with_statistics"
  state_type = StatisticsState
  config_arguments: ClassVar = MappingProxyType({"groups": 1})

  def __init__(self, optimizer_def: OptimizerDef, groups: int | Mapping[str, str] = 1):
    if isinstance(groups, Mapping):
      for group, pattern in groups.items():
        if not isinstance(group, str) or not isinstance(pattern, str) or group == GLOBAL:
          raise TypeError(
            "with_statistics: groups maps a group name (a str other than 'global', which is "
            f"every parameter) to a path regex; got {group!r}: {pattern!r}"
          )
        try:
          re.compile(pattern)
        except re.error as e:
          raise ValueError(
            f"with_statistics: group {group!r}: {pattern!r} is no regex ({e})"
          ) from None
      groups = dict(groups)
    elif not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
      raise TypeError(
        "with_statistics: groups is a path depth counted from 1 (1: one group per top-level "
        "key, 2: per key below it) or a dict from group names to path regexes; got "
        f"groups={groups!r}"
      )
    else:
      groups = int(groups)
    super().__init__(optimizer_def)
    self.groups = groups

  twice_hint = "keep one set of statistics (groups= chooses what each line sums)"

  def _static_key(self) -> tuple:
    # in the user's order: the first regex a path matches takes it, and values keep that order
    groups = tuple(self.groups.items()) if isinstance(self.groups, dict) else self.groups
    return (type(self), self.optimizer_def, groups)

  def group_of(self, path: str) -> str | None:
    """The group a parameter at ``path`` (``'/layers/0/attention/kernel'``) is summed in: the
    first of ``groups`` whose regex it matches, or its first ``groups`` path components;
    None when no regex matches (it counts in ``'global'`` only)."""
    if isinstance(self.groups, dict):
      return next((g for g, p in self.groups.items() if re.search(p, path)), None)
    return "/".join(path.split("/")[1 : 1 + self.groups]) or GLOBAL

  def _assignment(self, params: PyTree) -> tuple[list[str | None], list[str]]:
    """Each leaf's group, in flatten order, and the groups' names (sorted, then 'global')."""
    named, _ = leaves_with_paths(params)
    assigned = [self.group_of(path) for path, _ in named]
    names = sorted({g for g in assigned if g is not None and g != GLOBAL})
    if isinstance(self.groups, dict):
      names = [g for g in self.groups if g != GLOBAL]  # the user's order, every group
    return assigned, [*names, GLOBAL]

  def init_state(self, params: PyTree) -> OptimizerState:
    inner = self.optimizer_def.init_state(params)
    assigned, names = self._assignment(params)
    empty = [name for name in names if name != GLOBAL and name not in assigned]
    if empty:
      patterns = self.groups if isinstance(self.groups, Mapping) else {}
      named, _ = leaves_with_paths(params)
      shown = some_paths([path for path, _ in named])
      warn(
        f"with_statistics: {', '.join(f'group {g!r} ({patterns.get(g)!r})' for g in empty)} "
        f"matches no parameter, so its lines will be zeros; the parameters' paths are {shown}. "
        "To fix: give a regex one of them matches, or drop the group."
      )
    values = GroupNorms(jnp.zeros((len(names), len(FIELDS)), jnp.float32), tuple(names))
    return OptimizerState(inner.step, StatisticsState(inner.param_states, values))

  def apply_gradient(
    self, hyper_params: Any, params: PyTree, state: OptimizerState, grads: PyTree, **extra_args: Any
  ) -> tuple[PyTree, OptimizerState]:
    """The wrapped step, then each group's norms of the gradients, of the update (new minus
    old parameters) and of the new parameters; a few reductions, global under sharding.

    Where the wrapped definition is element-wise (`OptimizerDef.why_not_elementwise`), a
    leaf's sums are read before the step writes anything (`_summed_ahead`): one reduction
    reads its gradient, parameter and state once and computes the new parameter inside it
    (XLA fuses the element-wise update into it), and the step that writes waits for the sums
    (`_after`). The old parameters are never read after the write, so a donated step keeps
    no copy of them: 16 bytes a float32 parameter beside an adamw step's 40 (issue 65). Any
    other leaf is summed after the step from new minus old, with a copy of the old
    parameters: 20 bytes.
    """
    own = state.param_states
    inner = OptimizerState(state.step, own.inner)

    def step(params: PyTree, inner: OptimizerState, grads: PyTree) -> tuple[PyTree, Any]:
      return self.optimizer_def.apply_gradient(hyper_params, params, inner, grads, **extra_args)

    assigned, names = self._assignment(params)
    treedef = jax.tree.structure(params)
    olds, gs = jax.tree.leaves(params), treedef.flatten_up_to(grads)
    elementwise = self.optimizer_def.why_not_elementwise() is None
    early = [elementwise and _summed_ahead(old) for old in olds]
    new_params, new_inner = step(params, inner, grads)  # the trial, where any leaf is early
    columns: list[Any] = [None] * len(olds)
    if any(early):
      trial = jax.tree.leaves(new_params)
      which = [i for i, e in enumerate(early) if e]
      sums = _square_sums([_triple(gs[i], olds[i], trial[i]) for i in which])
      columns = _placed(columns, which, sums)
      # the step again, on its inputs made to wait for the sums: the one that is kept (a
      # late leaf's trial is unused, and dropped)
      zero = _zero_after(jnp.stack(sums))
      waiting = [_after(zero, x) if e else x for e, x in zip(early, olds, strict=True)]
      waiting_grads = [_after(zero, x) if e else x for e, x in zip(early, gs, strict=True)]
      new_params, new_inner = step(
        treedef.unflatten(waiting), _after(zero, inner), treedef.unflatten(waiting_grads)
      )
    late = [i for i, e in enumerate(early) if not e]
    if late:
      new = jax.tree.leaves(new_params)
      columns = _placed(
        columns, late, _square_sums([_triple(gs[i], olds[i], new[i]) for i in late])
      )
    # each group's row is its leaves' sums (one segment sum: a reduction a group was a kernel
    # and an output a group), 'global' last is every leaf's; a leaf in no group lands there
    # and is overwritten
    index = {name: i for i, name in enumerate(names)}
    if columns:
      stacked = jnp.stack(columns)  # each leaf's [sum |g|^2, sum |update|^2, sum |new|^2]
      ids = np.array([index.get(str(g), len(names) - 1) for g in assigned], np.int32)
      totals = jax.ops.segment_sum(stacked, ids, num_segments=len(names))
      totals = totals.at[-1].set(jnp.sum(stacked, 0))
    else:
      totals = jnp.zeros((len(names), len(FIELDS)), jnp.float32)
    values = GroupNorms(jnp.sqrt(totals), tuple(names))
    new_own = StatisticsState(new_inner.param_states, values)
    return new_params, OptimizerState(new_inner.step, new_own)

  def __repr__(self) -> str:
    groups = "" if self.groups == 1 else f", groups={self.groups!r}"
    return f"with_statistics({self.optimizer_def!r}{groups})"


def _triple(grad: Any, old: Any, new: Any) -> tuple[Any, jax.Array, Any]:
  """A leaf's ``(gradient, update, new parameter)``, the update new minus old in float32."""
  return grad, jnp.asarray(new, jnp.float32) - jnp.asarray(old, jnp.float32), new


def _placed(columns: list[Any], where: list[int], sums: list[jax.Array]) -> list[Any]:
  """``columns`` with ``sums[k]`` at ``where[k]``."""
  out = list(columns)
  for i, row in zip(where, sums, strict=True):
    out[i] = row
  return out


#: On XLA:CPU a leaf of this many values or more is summed after the step (new minus old,
#: the old parameters copied: 20 bytes a float32 parameter) rather than ahead of it (16
#: bytes). XLA:CPU computes a reduction's fused operands one value at a time on one core, so
#: the element-wise update recomputed inside it costs about 3 ns a value, where the step's
#: own vectorized loops on every core cost less: on 4 matrices of 1024 x 1024 with adamw,
#: ahead x3.9 the plain step, after x2.2 (2-core CPU, both stacks, issue 65). Below it the
#: step's own fixed costs dominate: a transformer-shaped model's matrices of 97k values run
#: ahead at x1.1-1.3. A GPU computes the update inside its reductions at full speed: there
#: every leaf is summed ahead.
SUMMED_AFTER_FROM = 1 << 18


def _summed_ahead(old: Any) -> bool:
  """Whether a leaf's sums are read before the step writes (an element-wise definition)."""
  return jax.default_backend() != "cpu" or jnp.size(old) < SUMMED_AFTER_FROM


def _square(x: Any) -> jax.Array:
  """``|x|^2`` elementwise in float32 (a complex gradient's modulus)."""
  return jnp.abs(jnp.asarray(x)).astype(jnp.float32) ** 2


def _square_sum(x: Any) -> jax.Array:
  """The sum of squares of ``x``'s magnitudes, in float32."""
  return jnp.sum(_square(x))


#: From this many elements a leaf's three sums are one reduction over its rows of `COLUMNS`
#: values (`_column_sums`), with the others of about its size below it. One reduction reads
#: the leaf once; three read it three times (and on jax 0.12 XLA:CPU hands a plain sum to a
#: library kernel that reads its operand from memory: the square written, then read).
#: Measured on an adamw step (2-core CPU, issue 65): a transformer-shaped model (10
#: matrices of 97k values, 300 small leaves) read 71.4 bytes a parameter with three
#: reductions, 60.1 with one (new - old, the old parameters copied).
ONE_REDUCTION_BELOW = 1 << 16

#: On one device, small leaves of about one size (sorted by size, at most twice the smallest)
#: are summed this many at a time: one variadic reduction over their squares padded to one
#: length and stacked, which XLA fuses (it reads each leaf once, as a leaf's own reduction
#: does). Measured on an adamw step at 1M parameters in 310 leaves, one group of all (2-core
#: CPU, issue 52): one leaf a reduction x1.58-1.85 the plain step, 2 x1.33, 4 x1.13-1.28, 8
#: x1.29-1.30; concatenations of 10 leaves or more XLA:CPU writes out (110 against 59 bytes
#: accessed a parameter). On a mesh each leaf keeps its own reduction: a concatenation of
#: differently sharded leaves is an all-gather of each.
LEAVES_PER_REDUCTION = 4


def _one_device() -> bool:
  """Whether this step runs on one device: the only one of every process (inside ``jit`` a
  leaf's sharding is not known; with one device there is no other)."""
  return jax.device_count() == 1


def _square_sums(triples: list[tuple[Any, jax.Array, Any]]) -> list[jax.Array]:
  """Each ``(g, update, new)``'s ``[sum |g|^2, sum |update|^2, sum |new|^2]`` in float32: a
  large leaf's in one reduction along its rows (`_column_sums`), a small one's in one shared
  with others of about its size on one device."""
  out: list[Any] = [None] * len(triples)
  small = []
  for i, (g, update, new) in enumerate(triples):
    if jnp.shape(g) != jnp.shape(new):  # per-example gradients (dpsgd's leading axis)
      out[i] = jnp.stack([_square_sum(g), _square_sum(update), _square_sum(new)])
    elif jnp.size(new) >= ONE_REDUCTION_BELOW:
      out[i] = _column_sums(tuple(_square(x) for x in (g, update, new)))
    else:
      small.append(i)
  if not _one_device():
    for i in small:
      squares = tuple(_square(x) for x in triples[i])
      out[i] = _variadic_sums(squares, tuple(range(squares[0].ndim)))
    return out
  small.sort(key=lambda i: jnp.size(triples[i][2]))
  while small:
    sizes = [jnp.size(triples[i][2]) for i in small[:LEAVES_PER_REDUCTION]]
    chunk = small[: sum(size <= 2 * sizes[0] for size in sizes)]
    small = small[len(chunk) :]
    length = max(sizes[: len(chunk)])
    stacked = tuple(
      jnp.stack([_padded(_square(triples[i][f]), length) for i in chunk]) for f in range(3)
    )
    for i, row in zip(chunk, _variadic_sums(stacked, (1,)), strict=True):
      out[i] = row
  return out


#: A large leaf's sums are taken along rows of this many values: one reduction a row, then
#: the rows' sums added. XLA:CPU emits a reduction that computes its operands (here the
#: element-wise update, recomputed inside it) as a scalar loop; along contiguous rows it
#: reads memory in order (over the flattened leaf, or down the columns, it ran x4.6 and
#: x7.0 the plain step on 4 matrices of 1024 x 1024, against x3.5 along rows; issue 65).
COLUMNS = 128


def _column_sums(squares: tuple[jax.Array, ...]) -> jax.Array:
  """The three arrays' sums in one reduction along rows of `COLUMNS` values (the last padded
  with zeros), then the rows' sums added: float32 sums of 128 values and of the rows', where
  one run over a flattened leaf of 66k values was 2e-6 off float64's (issue 65)."""
  length = -(-squares[0].size // COLUMNS) * COLUMNS
  rows = tuple(_padded(x, length).reshape(-1, COLUMNS) for x in squares)
  return jnp.sum(_variadic_sums(rows, (1,)), 0)


def _zero_after(sums: jax.Array) -> jax.Array:
  """A uint32 zero computed from ``sums`` that XLA cannot fold: the least of their bits and
  0. What `_after` makes a step wait on."""
  bits = jax.lax.bitcast_convert_type(sums, jnp.uint32)
  return jnp.min(jnp.minimum(bits, jnp.uint32(0)))


def _after(zero: jax.Array, tree: PyTree) -> PyTree:
  """``tree`` unchanged, each floating leaf made to wait for ``zero`` (`_zero_after`): OR-ed
  with it bitwise.

  A step that writes the new parameters reading its inputs through it comes after every read
  of the old parameters and state by the sums, which lets a donated step write them in place.
  jax 0.10's XLA drops an `optimization_barrier` before it decides, and copies; a data
  dependency it keeps. Were a later XLA to fold the zero, the step would be the same, with a
  copy again.
  """

  def wait(x: Any) -> Any:
    if not isinstance(x, jax.Array) or not jnp.issubdtype(x.dtype, jnp.floating):
      return x
    bits = _UNSIGNED.get(jnp.dtype(x.dtype).itemsize)
    if bits is None:
      return x
    as_bits = jax.lax.bitcast_convert_type(x, bits)
    return jax.lax.bitcast_convert_type(as_bits | zero.astype(bits), x.dtype)

  return jax.tree.map(wait, tree)


#: The unsigned integer of each floating width, for `_after`'s bitwise OR.
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _padded(x: jax.Array, length: int) -> jax.Array:
  """``x`` flattened and padded with zeros to ``length`` values."""
  return jnp.pad(x.ravel(), (0, length - x.size))


def _variadic_sums(squares: tuple[jax.Array, ...], axes: tuple[int, ...]) -> jax.Array:
  """The three arrays' sums over ``axes`` in one reduction, stacked on the last axis."""
  zero = jnp.zeros((), jnp.float32)
  sums = jax.lax.reduce(
    squares,
    (zero,) * 3,
    lambda x, y: tuple(a + b for a, b in zip(x, y, strict=True)),
    axes,
  )
  return jnp.stack(sums, -1)


def as_flat_dict(values: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """``{'{group}/grad_norm': ..., '{group}/update_norm': ..., '{group}/param_norm': ...,
  '{group}/update_ratio': ...}`` from a `StatisticsState`'s ``values``."""
  out = {}
  for group, row in values.items():
    for i, field in enumerate(FIELDS):
      out[f"{group}/{field}"] = row[i]
    out[f"{group}/update_ratio"] = row[1] / jnp.where(row[2] > 0, row[2], 1.0)
  return out


def with_statistics(
  optimizer_def: OptimizerDef, groups: int | Mapping[str, str] = 1
) -> WithStatistics:
  """Per-layer statistics of every step, computed inside it and kept for logging.

  Each step computes, per group of parameters and for all of them (``'global'``), the L2 norm
  of the gradients, of the update (new minus old parameters) and of the parameters after it:
  a few reductions inside the jitted step, global under any sharding and ZeRO-1 (JAX reduces a
  sharded array whole). `optcore.statistics` returns them as a flat dict of scalars with stable
  names, ``'{group}/grad_norm'``, ``'{group}/update_norm'``, ``'{group}/param_norm'`` and
  ``'{group}/update_ratio'`` (update over parameter norm), for any logger (TensorBoard, CLU,
  W&B: optcore depends on none). The values are the last step's; they are state (replicated,
  in state dicts and checkpoints). A definition without the wrapper compiles to the same step
  as before.

  Under `skip_bad_steps`, ``with_statistics(skip_bad_steps(...))`` shows a skipped step's
  gradient norm with a zero update; under `accumulate`, ``accumulate(with_statistics(...))``
  shows each applied update's, ``with_statistics(accumulate(...))`` every call's.

  Args:
    optimizer_def: the definition whose steps are measured.
    groups: a path depth (1, the default: one group per top-level key; 2: ``'layers/0'``, ...)
      or a dict from group names to path regexes (``{'attention': r'/attn/'}``; a parameter
      joins the first group it matches, and only ``'global'`` if none).

  Returns:
    A `WithStatistics` definition.

  Raises:
    TypeError: ``groups`` is neither a positive depth nor a dict of regexes (``'global'`` is
      taken), or ``optimizer_def`` is not a definition, is grouped, or has statistics already.
    ValueError: a group's pattern is no regex.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> params = {'dense': {'kernel': jnp.ones((2, 2))}, 'head': {'bias': jnp.ones(3)}}
    >>> opt = optcore.with_statistics(optcore.sgd(0.5)).create(params)
    >>> grads = {'dense': {'kernel': jnp.ones((2, 2))}, 'head': {'bias': jnp.zeros(3)}}
    >>> stats = optcore.statistics(opt.apply_gradient(grads))
    >>> [float(stats[k]) for k in ('dense/grad_norm', 'dense/update_norm', 'global/param_norm')]
    [2.0, 1.0, 2.0]
  """
  return WithStatistics(optimizer_def, groups)
