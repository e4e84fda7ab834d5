"""Shampoo (Gupta et al. 2018; Anil et al. 2020, arXiv:2002.09018) with the numbers of its
authors' JAX ``distributed_shampoo`` (google-research ``scalable_shampoo/optax``).

Per parameter: its small dimensions merged (``best_effort_shape_interpretation``), its
dimensions above ``block_size`` cut into blocks, and per block and dimension a statistic
(the moving average, or with ``beta2 = 1`` the sum, of the gradient's outer product over
that dimension, started at ``matrix_epsilon`` times the identity) and a preconditioner,
the statistic's inverse ``p``-th root (``p`` twice the number of preconditioned dimensions,
or ``exponent_override``) by coupled Newton iterations, the epsilon relative to the largest
eigenvalue found by power iteration; a root whose error reaches ``inverse_failure_threshold``
keeps the previous preconditioner. The preconditioned gradient is rescaled to the norm of a
first-order "graft" (SGD, AdaGrad, RMSProp, their normalized forms, or the sign), which alone
moves the parameters before ``start_preconditioning_step`` and for parameters Shampoo skips
(scalars, ranks below ``skip_preconditioning_rank_lt``, a dimension above
``skip_preconditioning_dim_size_gt``); both paths keep a (Nesterov) momentum. See
docs/concepts/shampoo.md.

From logical axes (as `soap`): a ``"batch"`` dimension (stacked layers, experts) is a set
of independent copies, each with statistics of its own (stored stacked, with the batch
axis); a parameter with an ``"adam"`` dimension (``vocab``) goes to the graft alone, as the
reference's ``skip_preconditioning_dim_size_gt`` does with vocabulary sizes.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from collections.abc import Mapping
from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optcore._src.axes.matrix_axes import (
  check_rules_with_axes,
  dimension_roles,
  on_copies,
  split_batch,
)
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import require_params
from optcore._src.ground.declarations import (
  PARAM_SHAPED,
  Count,
  FirstMoment,
  SecondMoment,
)
from optcore._src.ground.hyper_params import value_at
from optcore._src.optimizers.matrix_state import Preconditioners, preconditioner_axes

PyTree = Any


class GraftingType(enum.IntEnum):
  """The reference's grafts, with its values (a config may give the lower-case name)."""

  SGD = 1
  ADAGRAD = 2
  RMSPROP = 3
  RMSPROP_NORMALIZED = 4
  SQRT_N = 5
  ADAGRAD_NORMALIZED = 6


class PreconditionerType(enum.IntEnum):
  """The reference's preconditioner types: every dimension, or all but the last (input)."""

  ALL = 1
  INPUT = 2


class ShampooState(NamedTuple):
  """The state of `shampoo`, the reference's per-parameter state as trees.

  Attributes:
    count: calls so far (the reference's ``count``, the step its schedules see).
    diagonal_statistics: per parameter the graft's accumulator (AdaGrad and RMSProp
      grafts), ``optax.MaskedNode()`` where the graft keeps none.
    momentum: the momentum of Shampoo's update.
    diagonal_momentum: the momentum of the graft's update.
    statistics: per parameter, `Preconditioners` holding its statistics, per block and
      preconditioned dimension in the reference's order.
    preconditioners: per parameter, `Preconditioners` holding their inverse roots.
  """

  count: Count
  diagonal_statistics: SecondMoment
  momentum: FirstMoment
  diagonal_momentum: FirstMoment
  statistics: Annotated[PyTree, PARAM_SHAPED.with_axes(preconditioner_axes)]
  preconditioners: Annotated[PyTree, PARAM_SHAPED.with_axes(preconditioner_axes)]


def _merge_small_dims(shape: tuple[int, ...], max_dim: int) -> list[tuple[int, ...]]:
  """The reference's ``merge_small_dims`` as groups of the dimensions merged together:
  neighbours merge while their product stays at most ``max_dim``; size-1 dimensions go
  with their neighbours; an all-ones shape is one dimension of size 1."""
  if shape and all(d == 1 for d in shape):
    return [tuple(range(len(shape)))]
  groups: list[tuple[int, ...]] = []
  members: list[int] = []
  product = 1
  for dim, size in enumerate(shape):
    if product * size <= max_dim:
      product *= size
      members.append(dim)
    else:
      if product > 1:
        groups.append(tuple(members))
      product, members = size, [dim]
  if product > 1:
    groups.append(tuple(members))
  return groups


@dataclasses.dataclass(frozen=True)
class _Layout:
  """How one parameter is preconditioned (static): one copy's shape (the batch dimensions
  removed) merged into ``merged_shape``, cut into blocks of ``block_shapes``."""

  shape: tuple[int, ...]
  batch_dims: tuple[int, ...]
  slice_shape: tuple[int, ...]
  skip: bool  # the graft alone
  merged_shape: tuple[int, ...]
  merged_dims: tuple[int | None, ...]  # per merged dimension, the parameter's own (or None)
  splits: tuple[tuple[int, tuple[int, ...]], ...]  # (merged dim, split indices)
  block_shapes: tuple[tuple[int, ...], ...]
  preconditioned: tuple[bool, ...]  # per merged dimension
  exponent: int

  @property
  def statistic_sizes(self) -> tuple[int, ...]:
    return tuple(
      size
      for block in self.block_shapes
      for size, on in zip(block, self.preconditioned, strict=True)
      if on
    )

  @property
  def statistic_dims(self) -> tuple[int | None, ...]:
    """Per statistic, the parameter's dimension it preconditions where that dimension is
    neither merged with another nor cut into blocks (its rows can follow the dimension's
    sharding), else None."""
    cut = {dim for dim, _ in self.splits}
    whole = tuple(None if d in cut else self.merged_dims[d] for d in range(len(self.merged_shape)))
    return tuple(
      whole[d] for _ in self.block_shapes for d, on in enumerate(self.preconditioned) if on
    )


def _layout(
  shape: tuple[int, ...],
  roles: tuple[str, ...] | None,
  *,
  block_size: int,
  merge_small_dims_block_size: int,
  best_effort_shape_interpretation: bool,
  skip_preconditioning_rank_lt: int,
  skip_preconditioning_dim_size_gt: int,
  precondtioner_type: int,
  exponent_override: int,
) -> _Layout:
  roles, batch, kept, slice_shape = split_batch(shape, roles)
  skip = (
    len(slice_shape) < skip_preconditioning_rank_lt
    or any(s > skip_preconditioning_dim_size_gt for s in slice_shape)
    or any(roles[d] == "adam" for d in kept)
  )
  if best_effort_shape_interpretation:
    groups = _merge_small_dims(slice_shape, merge_small_dims_block_size)
  else:
    groups = [(d,) for d in range(len(slice_shape))]
  merged = tuple(math.prod(slice_shape[d] for d in group) for group in groups)

  def own(group: tuple[int, ...]) -> int | None:
    sized = [d for d in group if slice_shape[d] > 1]
    return kept[sized[0]] if len(sized) == 1 else kept[group[0]] if len(group) == 1 else None

  splits, split_sizes = [], []
  for dim, size in enumerate(merged):
    if 0 < block_size < size:
      count = (size - 1) // block_size
      indices = tuple(int(i) for i in (np.arange(count) + 1) * block_size)
      splits.append((dim, indices))
      split_sizes.append((block_size,) * count + (size - indices[-1],))
    else:
      split_sizes.append((size,))
  rank = len(merged)
  if precondtioner_type == PreconditionerType.ALL or rank <= 1:
    preconditioned = (True,) * rank
  else:
    preconditioned = (True,) * (rank - 1) + (False,)
  exponent = exponent_override or 2 * sum(preconditioned)
  return _Layout(
    shape, batch, slice_shape, skip, merged, tuple(own(g) for g in groups), tuple(splits),
    tuple(itertools.product(*split_sizes)), preconditioned, exponent,
  )  # fmt: skip


def shampoo_roles(
  params: PyTree, param_logical_axes: PyTree, rules: Mapping[str, str] | None = None
) -> PyTree:
  """Per parameter, the role of each of its dimensions (``"matrix"``, ``"batch"`` or
  ``"adam"``) from its logical axes, as `shampoo` uses them: ``"batch"`` dimensions are
  copies with statistics of their own; a parameter with an ``"adam"`` dimension is moved
  by the graft alone.

  Args:
    params: the parameters (arrays or abstract arrays).
    param_logical_axes: one `PartitionSpec` (or tuple of names, or None) per parameter.
    rules: axis name -> role, added to (and overriding) `MATRIX_AXIS_RULES`.

  Returns:
    A tree of the parameters' structure with a tuple of roles at each leaf.

  Raises:
    PartitionRuleError: as `soap_roles`, whose reading this is, naming ``shampoo``.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore.partitioning import shampoo_roles
    >>> shampoo_roles({'experts': jnp.zeros((8, 16, 4))}, {'experts': ('expert', 'embed', 'mlp')},
    ...               rules={'expert': 'batch'})  # one Shampoo per expert
    {'experts': ('batch', 'matrix', 'matrix')}
  """
  return dimension_roles("shampoo", params, param_logical_axes, rules)


# The inverse root: the reference's power iteration, matrix power and coupled Newton
# iterations, in float64 where JAX has it enabled (as the reference asks), else float32.


def _root_dtype() -> Any:
  return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def _largest_eigenvalue(matrix: jax.Array, start: jax.Array, precision: Any) -> jax.Array:
  """Power iteration (at most 100 steps, tolerance 1e-6) from ``start``."""

  def cond(state):
    i, _, _, running = state
    return jnp.logical_and(i < 100, running)

  def body(state):
    i, v, s, _ = state
    v = v / jnp.linalg.norm(v)
    mv = jnp.einsum("ij,j->i", matrix, v, precision=precision)
    s_new = jnp.einsum("i,i->", v, mv, precision=precision)
    return i + 1, mv, s_new, jnp.abs(s_new - s) > 1e-6

  init = (0, start, jnp.zeros((), matrix.dtype), True)
  return jax.lax.while_loop(cond, body, init)[2]


def _power(m: jax.Array, p: jax.Array, precision: Any) -> jax.Array:
  """``m ** p`` by squaring (``p`` traced: one program for every exponent)."""

  def body(state):
    i, result, m = state
    result = jax.lax.cond(
      i % 2 == 1, lambda: jnp.matmul(m, result, precision=precision), lambda: result
    )
    return i // 2, result, jnp.matmul(m, m, precision=precision)

  init = (p, jnp.eye(m.shape[0], dtype=m.dtype), m)
  return jax.lax.while_loop(lambda state: state[0] > 0, body, init)[1]


def _inverse_pth_root(
  statistic: jax.Array, p: jax.Array, size: jax.Array, *, ridge: float, relative: bool,
  precision: Any,
) -> tuple[jax.Array, jax.Array]:  # fmt: skip
  """``(statistic + eps)^(-1/p)`` and its error (the reference's
  ``matrix_inverse_pth_root``) of a statistic padded to the largest of the tree, its
  first ``size`` rows and columns its own."""
  dtype = _root_dtype()
  n = statistic.shape[0]
  matrix = statistic.astype(dtype)
  alpha = jnp.asarray(-1.0 / p, dtype)
  own = (jnp.arange(n, dtype=jnp.int32) < size).astype(dtype)
  matrix = matrix * own[None, :] * own[:, None]
  identity = jnp.eye(n, dtype=dtype) * own[None, :]
  if relative:
    start = np.random.RandomState(1729).uniform(-1.0, 1.0, n).astype(np.dtype(dtype))
    largest = _largest_eigenvalue(matrix, jnp.asarray(start) * own, precision)
  else:
    largest = 1.0
  epsilon = ridge * jnp.maximum(largest, 1e-6)
  if n == 1:  # every statistic of the tree is 1x1: the closed form
    root = (matrix + epsilon) ** alpha
    return root.astype(statistic.dtype), jnp.zeros((), jnp.float32)

  def cond(state):
    i, _, _, _, error, ratio = state
    return jnp.logical_and(i < 100, jnp.logical_and(error > 1e-6, ratio < 1.2))

  def body(state):
    i, mat_m, mat_h, _, error, _ = state
    mat_m_i = (1 - alpha) * identity + alpha * mat_m
    new_m = jnp.matmul(_power(mat_m_i, p, precision), mat_m, precision=precision)
    new_h = jnp.matmul(mat_h, mat_m_i, precision=precision)
    new_error = jnp.max(jnp.abs(new_m - identity))
    return i + 1, new_m, new_h, mat_h, new_error, new_error / error

  damped = matrix + epsilon * identity
  z = (1 + p) / (2 * jnp.linalg.norm(damped))
  m0 = damped * z
  h0 = identity * jnp.power(z, 1.0 / p)
  init = (0, m0, h0, h0, jnp.max(jnp.abs(m0 - identity)), jnp.ones((), dtype))
  _, mat_m, mat_h, old_h, _, ratio = jax.lax.while_loop(cond, body, init)
  error = jnp.max(jnp.abs(mat_m - identity)).astype(jnp.float32)
  converged = (ratio < 1.2).astype(dtype)
  root = converged * mat_h + (1 - converged) * old_h
  return root.astype(statistic.dtype), error


def _pad(statistic: jax.Array, n: int) -> jax.Array:
  """``[[statistic, 0], [0, I]]`` of size ``n``."""
  k = statistic.shape[0]
  if k == n:
    return statistic
  top = jnp.concatenate([statistic, jnp.zeros((k, n - k), statistic.dtype)], 1)
  eye = jnp.eye(n - k, dtype=statistic.dtype)
  bottom = jnp.concatenate([jnp.zeros((n - k, k), statistic.dtype), eye], 1)
  return jnp.concatenate([top, bottom], 0)


def _all_roots(statistics: list, exponents: list[int], previous: list, root: dict) -> list:
  """The inverse roots of every statistic of the tree (each one matrix), as the reference
  computes them: padded to the largest, one vmapped program; a root whose error reaches
  the threshold (or is NaN) keeps its previous value."""
  if not statistics:
    return []
  n = max(s.shape[0] for s in statistics)
  stack = jnp.stack([_pad(s, n) for s in statistics])
  ps = jnp.asarray(exponents, jnp.int32)
  sizes = jnp.asarray([s.shape[0] for s in statistics], jnp.int32)
  settings = {k: v for k, v in root.items() if k != "threshold"}
  roots, errors = jax.vmap(lambda x, p, k: _inverse_pth_root(x, p, k, **settings))(stack, ps, sizes)
  # One select over the stack where the reference has a cond per root (the same values): a
  # hundred conds made a program XLA's compiler once crashed on under ZeRO-1.
  failed = jnp.logical_or(jnp.isnan(errors), errors >= root["threshold"])
  kept = jnp.where(failed[:, None, None], jnp.stack([_pad(p, n) for p in previous]), roots)
  return [kept[i, : s.shape[0], : s.shape[0]] for i, s in enumerate(statistics)]


# One copy: the parameter's slice (batch dimensions removed) reshaped and cut into blocks.


def _blocks(layout: _Layout, x: jax.Array) -> list[jax.Array]:
  blocks = [x.reshape(layout.merged_shape)]
  for dim, indices in layout.splits:
    blocks = [piece for b in blocks for piece in jnp.split(b, indices, axis=dim)]
  return blocks


def _unblock(layout: _Layout, blocks: list[jax.Array]) -> jax.Array:
  for dim, indices in reversed(layout.splits):
    n = len(indices) + 1
    blocks = [jnp.concatenate(blocks[i : i + n], axis=dim) for i in range(0, len(blocks), n)]
  return blocks[0].reshape(layout.slice_shape)


def _updated_statistics(layout, statistics, grad, beta2, precision) -> tuple:
  w2 = jnp.where(beta2 == 1.0, beta2, 1.0 - beta2)
  out, index = [], 0
  for g in _blocks(layout, grad):
    for axis, on in enumerate(layout.preconditioned):
      if on:
        others = [d for d in range(g.ndim) if d != axis]
        gram = jnp.tensordot(g, g, axes=(others, others), precision=precision)
        out.append(beta2 * statistics[index] + w2 * gram)
        index += 1
  return tuple(out)


def _preconditioned(layout: _Layout, grad: jax.Array, preconditioners: tuple) -> jax.Array:
  out, index = [], 0
  for g in _blocks(layout, grad):
    for on in layout.preconditioned:
      if on:
        g = jnp.tensordot(g, preconditioners[index], axes=[[0], [0]])
        index += 1
      else:
        g = jnp.transpose(g, (*range(1, g.ndim), 0))
    out.append(g)
  return _unblock(layout, out)


def _graft(graft_type, grad, diagonal, h):
  """(the graft's update, its new accumulator) of one copy."""
  if graft_type in (GraftingType.ADAGRAD, GraftingType.ADAGRAD_NORMALIZED):
    scaled = grad
    if graft_type == GraftingType.ADAGRAD_NORMALIZED:
      scaled = grad / (jnp.linalg.norm(grad) + 1e-16)
    diagonal = diagonal + jnp.square(scaled)
    return scaled / (jnp.sqrt(diagonal) + h["diagonal_epsilon"]), diagonal
  if graft_type in (GraftingType.RMSPROP, GraftingType.RMSPROP_NORMALIZED):
    scaled = grad
    if graft_type == GraftingType.RMSPROP_NORMALIZED:
      scaled = grad / (jnp.linalg.norm(grad) + 1e-16)
    beta2 = h["beta2"]
    w2 = jnp.where(beta2 == 1.0, beta2, 1.0 - beta2)
    diagonal = beta2 * diagonal + w2 * jnp.square(scaled)
    update = scaled / (jnp.sqrt(diagonal) + h["diagonal_epsilon"])
    clip = h["clip_by_scaled_gradient_norm"]
    if clip:
      scaled_norm = jnp.linalg.norm(update) / jnp.sqrt(float(update.size))
      update = update / jnp.maximum(1.0, scaled_norm / clip)
    return update, diagonal
  if graft_type == GraftingType.SGD:
    return grad, diagonal
  return jnp.ones_like(grad) * jnp.sign(grad), diagonal  # SQRT_N


def _graft_type(value: Any) -> GraftingType:
  if isinstance(value, str):
    try:
      return GraftingType[value.upper()]
    except KeyError:
      pass
  else:
    try:
      return GraftingType(value)
    except ValueError:
      pass
  raise ValueError(
    f"shampoo: graft_type is one of {[g.name.lower() for g in GraftingType]} (or "
    f"GraftingType, or its value), not {value!r}"
  )


def _preconditioner_type(value: Any) -> PreconditionerType:
  if isinstance(value, str) and value.upper() in PreconditionerType.__members__:
    return PreconditionerType[value.upper()]
  if not isinstance(value, str) and value in tuple(PreconditionerType):
    return PreconditionerType(value)
  raise ValueError(f"shampoo: precondtioner_type is 'all' or 'input', not {value!r}")


@a.declare(weight_decay=a.WEIGHT_DECAY)
def shampoo(
  learning_rate: optax.ScalarOrSchedule,
  block_size: int,
  beta1: float = 0.9,
  beta2: float = 0.999,
  diagonal_epsilon: float = 1e-10,
  matrix_epsilon: float = 1e-6,
  weight_decay: float = 0.0,
  start_preconditioning_step: int = 5,
  preconditioning_compute_steps: int = 1,
  statistics_compute_steps: int = 1,
  best_effort_shape_interpretation: bool = True,
  graft_type: GraftingType | int | str = GraftingType.SGD,
  nesterov: bool = True,
  exponent_override: int = 0,
  batch_axis_name: Any = None,
  statistics_partition_spec: Any = None,
  preconditioner_partition_spec: Any = None,
  num_devices_for_pjit: Any = None,
  shard_optimizer_states: bool = False,
  best_effort_memory_usage_reduction: bool = False,
  inverse_failure_threshold: float = 0.1,
  moving_average_for_momentum: bool = False,
  skip_preconditioning_dim_size_gt: int = 4096,
  clip_by_scaled_gradient_norm: float | None = None,
  precision: Any = jax.lax.Precision.HIGHEST,
  tensordot_precision: Any = None,
  relative_matrix_epsilon: bool = True,
  merge_small_dims_block_size: int = 4096,
  lobpcg_topk_precondition: int = 0,
  lobpcg_max_iter: int = 0,
  precondtioner_type: PreconditionerType | int | str = PreconditionerType.ALL,
  skip_preconditioning_rank_lt: int = 1,
  decoupled_learning_rate: bool = True,
  decoupled_weight_decay: bool = False,
  generate_training_metrics: bool = True,
  *,
  param_logical_axes: PyTree = None,
  matrix_rules: Mapping[str, str] | None = None,
) -> optax.GradientTransformation:
  """Shampoo, with the numbers of its authors' JAX ``distributed_shampoo``.

  The reference's arguments in its order, under its names and with its defaults
  (``precondtioner_type`` spelled as it spells it). Its pmap/pjit options
  (``batch_axis_name``, the partition specs, ``num_devices_for_pjit``,
  ``shard_optimizer_states``), its int8/int16 state (``best_effort_memory_usage_reduction``)
  and LOBPCG (``lobpcg_*``) are accepted at their defaults only: optcore shards and places
  the state from the parameters' logical axes, and ``low_bit_state`` stores state in fewer
  bits. Its training metrics are not kept (``generate_training_metrics`` changes nothing).
  The update needs the parameters (``params=``) for weight decay.

  Args:
    learning_rate: the step size, or a schedule of ``count``.
    block_size: dimensions above this are cut into blocks of this size (128 is the
      reference's advice; 0 or less: no blocks).
    beta1: the momentum.
    beta2: the statistics' (and RMSProp graft's) decay; 1 sums them (AdaGrad).
    diagonal_epsilon: added to the AdaGrad/RMSProp graft's denominator.
    matrix_epsilon: added to each statistic before its inverse root (times its largest
      eigenvalue where ``relative_matrix_epsilon``); the statistics start at it.
    weight_decay: added to the update times the parameters (coupled), or after the
      momentum times the learning rate (``decoupled_weight_decay``).
    start_preconditioning_step: the graft alone moves the parameters before this count.
    preconditioning_compute_steps: new inverse roots every this many steps.
    statistics_compute_steps: new statistics every this many steps.
    best_effort_shape_interpretation: merge small neighbouring dimensions while their
      product is at most ``merge_small_dims_block_size``.
    graft_type: the first-order method whose per-parameter norm Shampoo's update takes:
      `GraftingType` (``sgd``, ``adagrad``, ``rmsprop``, ``rmsprop_normalized``,
      ``sqrt_n``, ``adagrad_normalized``), its value or its lower-case name.
    nesterov: Nesterov momentum.
    exponent_override: the root's ``p`` for every statistic (0: twice the number of
      preconditioned dimensions).
    batch_axis_name: the reference's pmap axis; None only.
    statistics_partition_spec: the reference's pjit layout; None only.
    preconditioner_partition_spec: the reference's pjit layout; None only.
    num_devices_for_pjit: the reference's pjit layout; None only.
    shard_optimizer_states: the reference's pjit layout; False only.
    best_effort_memory_usage_reduction: the reference's int8/int16 state; False only.
    inverse_failure_threshold: a root whose error reaches this keeps the previous one.
    moving_average_for_momentum: weight the new update by ``1 - beta1``.
    skip_preconditioning_dim_size_gt: a parameter with a dimension above this gets the
      graft alone.
    clip_by_scaled_gradient_norm: clip the RMSProp graft's update to this RMS.
    precision: the precision of the inverse root's products.
    tensordot_precision: the precision of the statistics' products.
    relative_matrix_epsilon: scale ``matrix_epsilon`` by the largest eigenvalue.
    merge_small_dims_block_size: the largest product ``best_effort_shape_interpretation``
      merges.
    lobpcg_topk_precondition: the reference's LOBPCG deflation; 0 only.
    lobpcg_max_iter: the reference's LOBPCG iterations; 0 only.
    precondtioner_type: `PreconditionerType`: ``all`` dimensions, or all but the last
      (``input``).
    skip_preconditioning_rank_lt: parameters of a lower rank get the graft alone.
    decoupled_learning_rate: apply the learning rate after the momentum (else to both
      updates before it).
    decoupled_weight_decay: see ``weight_decay``.
    generate_training_metrics: accepted, changes nothing (no metrics are kept).
    param_logical_axes: per parameter a `PartitionSpec` of logical axis names:
      ``"batch"`` dimensions get statistics of their own per copy, a parameter with an
      ``"adam"`` one gets the graft alone (see `shampoo_roles`). ``create_sharded``
      passes its axes.
    matrix_rules: axis name -> role, added to `MATRIX_AXIS_RULES`.

  Returns:
    As ``optcore.contrib.shampoo``, an optcore definition (``.as_optax()`` gives the
    optax transformation); its optax state is a `ShampooState`.

  Raises:
    ValueError: an argument out of its range, or one of the reference's pmap/pjit,
      quantization or LOBPCG options away from its default.
    PartitionRuleError: (at ``init``) the axes do not fit the parameters.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.contrib.shampoo(learning_rate=0.1, block_size=128)
    >>> opt = opt.create({'w': jnp.ones((2, 3))})
    >>> opt = opt.apply_gradient({'w': jnp.ones((2, 3))})  # SGD graft, Nesterov: 0.19
    >>> opt.target['w']
    Array([[0.81, 0.81, 0.81],
           [0.81, 0.81, 0.81]], dtype=float32)
  """
  graft = _graft_type(graft_type)
  kind = _preconditioner_type(precondtioner_type)
  instead = "shard and place the state from logical axes (create_sharded, state_axis=)"
  for name, value, default, use in (
    ("batch_axis_name", batch_axis_name, None, instead),
    ("statistics_partition_spec", statistics_partition_spec, None, instead),
    ("preconditioner_partition_spec", preconditioner_partition_spec, None, instead),
    ("num_devices_for_pjit", num_devices_for_pjit, None, instead),
    ("shard_optimizer_states", shard_optimizer_states, False, instead),
    ("best_effort_memory_usage_reduction", best_effort_memory_usage_reduction, False,
     "store the momenta in fewer bits with optcore.low_bit_state"),
    ("lobpcg_topk_precondition", lobpcg_topk_precondition, 0, "leave it at 0"),
    ("lobpcg_max_iter", lobpcg_max_iter, 0, "leave it at 0"),
  ):  # fmt: skip
    if value is not default and value != default:
      raise ValueError(
        f"shampoo: {name}={value!r} is the reference's and not optcore's (only {default!r}); {use}"
      )
  del generate_training_metrics  # the reference's metrics are not kept
  for name, value, low in (
    ("block_size", block_size, None),
    ("preconditioning_compute_steps", preconditioning_compute_steps, 1),
    ("statistics_compute_steps", statistics_compute_steps, 1),
    ("merge_small_dims_block_size", merge_small_dims_block_size, 1),
    ("exponent_override", exponent_override, 0),
  ):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
      raise ValueError(f"shampoo: {name} is an int, not {value!r}")
    if low is not None and value < low:
      raise ValueError(f"shampoo: {name} is at least {low}, not {value!r}")
  check_rules_with_axes("shampoo", param_logical_axes, matrix_rules)
  config: dict[str, Any] = dict(
    block_size=int(block_size),
    merge_small_dims_block_size=int(merge_small_dims_block_size),
    best_effort_shape_interpretation=bool(best_effort_shape_interpretation),
    skip_preconditioning_rank_lt=skip_preconditioning_rank_lt,
    skip_preconditioning_dim_size_gt=skip_preconditioning_dim_size_gt,
    precondtioner_type=kind,
    exponent_override=int(exponent_override),
  )
  diagonal = graft not in (GraftingType.SGD, GraftingType.SQRT_N)
  decays = not (isinstance(weight_decay, (int, float)) and weight_decay == 0)  # or traced
  root = dict(
    ridge=matrix_epsilon, relative=relative_matrix_epsilon, precision=precision,
    threshold=inverse_failure_threshold,
  )  # fmt: skip
  h = dict(
    beta2=beta2,
    diagonal_epsilon=diagonal_epsilon,
    clip_by_scaled_gradient_norm=clip_by_scaled_gradient_norm,
  )

  def layouts_of(params: PyTree) -> list[_Layout]:
    roles = None
    if param_logical_axes is not None:
      roles = shampoo_roles(params, param_logical_axes, matrix_rules)
    leaves, treedef = jax.tree.flatten(params)
    role_leaves = [None] * len(leaves) if roles is None else treedef.flatten_up_to(roles)
    return [
      _layout(tuple(leaf.shape), r, **config) for leaf, r in zip(leaves, role_leaves, strict=True)
    ]

  def init_fn(params: PyTree) -> ShampooState:
    leaves, treedef = jax.tree.flatten(params)
    layouts = layouts_of(params)

    def matrices(layout: _Layout, scale: float) -> Preconditioners:
      batch = tuple(layout.shape[d] for d in layout.batch_dims)
      sizes = () if layout.skip else layout.statistic_sizes
      dims = () if layout.skip else layout.statistic_dims
      eye = lambda n: jnp.broadcast_to(scale * jnp.eye(n, dtype=jnp.float32), (*batch, n, n))
      return Preconditioners(tuple(eye(n) for n in sizes), dims, layout.batch_dims)

    zeros = lambda: treedef.unflatten([jnp.zeros(p.shape, p.dtype) for p in leaves])
    return ShampooState(
      count=jnp.zeros((), jnp.int32),
      diagonal_statistics=zeros()
      if diagonal
      else treedef.unflatten([optax.MaskedNode() for _ in leaves]),
      momentum=zeros(),
      diagonal_momentum=zeros(),
      statistics=treedef.unflatten([matrices(layout, matrix_epsilon) for layout in layouts]),
      preconditioners=treedef.unflatten([matrices(layout, 1.0) for layout in layouts]),
    )

  def update_fn(updates: PyTree, state: ShampooState, params: PyTree = None):
    leaves, treedef = jax.tree.flatten(updates)
    layouts = layouts_of(updates)
    if decays:
      require_params("shampoo", params, "weight_decay is applied to them; or weight_decay=0")
    step = state.count
    lr = value_at(learning_rate, step)
    flat = treedef.flatten_up_to
    param_leaves = [None] * len(leaves) if params is None else flat(params)
    stats_old, precs_old = flat(state.statistics), flat(state.preconditioners)
    # 1. The statistics, every statistics_compute_steps.
    stats_new = [
      _statistics(layout, g, s.matrices, step)
      for layout, g, s in zip(layouts, leaves, stats_old, strict=True)
    ]
    # 2. Their inverse roots, every preconditioning_compute_steps, all in one program.
    precs_new = _roots(layouts, stats_new, [pc.matrices for pc in precs_old], step)
    # 3. The updates.
    out = [
      _leaf(layout, g, p, d, m, dm, pc, step, lr)
      for layout, g, p, d, m, dm, pc in zip(
        layouts, leaves, param_leaves, flat(state.diagonal_statistics), flat(state.momentum),
        flat(state.diagonal_momentum), precs_new, strict=True,
      )
    ]  # fmt: skip
    node = lambda matrices, old: Preconditioners(matrices, old.dims, old.batch_dims)
    new_state = ShampooState(
      count=step + 1,
      diagonal_statistics=treedef.unflatten([o[1] for o in out]),
      momentum=treedef.unflatten([o[2] for o in out]),
      diagonal_momentum=treedef.unflatten([o[3] for o in out]),
      statistics=treedef.unflatten([node(m, s) for m, s in zip(stats_new, stats_old, strict=True)]),
      preconditioners=treedef.unflatten(
        [node(m, s) for m, s in zip(precs_new, precs_old, strict=True)]
      ),
    )
    return treedef.unflatten([o[0] for o in out]), new_state

  def _statistics(layout: _Layout, grad: jax.Array, stats: tuple, step: jax.Array) -> tuple:
    if layout.skip:
      return stats

    def one_copy(grad, stats):
      return _updated_statistics(layout, stats, grad, beta2, tensordot_precision)

    def update(stats):
      if not layout.batch_dims:
        return one_copy(grad, stats)
      return on_copies(
        layout.shape,
        layout.batch_dims,
        lambda g, f: ((), one_copy(g[0], f)),
        (grad,),
        stats,
        unrolled=True,
      )[1]

    if statistics_compute_steps > 1:
      return jax.lax.cond(step % statistics_compute_steps == 0, update, lambda s: s, stats)
    return update(stats)

  def _roots(layouts: list[_Layout], stats: list[tuple], precs: list[tuple], step) -> list:
    """Every parameter's (and copy's) preconditioners from its statistics."""
    matrices, exponents, previous, where = [], [], [], []
    for i, (layout, ss, ps) in enumerate(zip(layouts, stats, precs, strict=True)):
      copies = math.prod(layout.shape[d] for d in layout.batch_dims)
      for j, (s, p) in enumerate(zip(ss, ps, strict=True)):
        s = s.reshape(copies, *s.shape[-2:])
        p = p.reshape(copies, *p.shape[-2:])
        for c in range(copies):
          matrices.append(s[c])
          previous.append(p[c])
          exponents.append(layout.exponent)
          where.append((i, j))

    def compute(matrices, previous):
      return _all_roots(matrices, exponents, previous, root)

    if preconditioning_compute_steps > 1:
      computed = jax.lax.cond(
        step % preconditioning_compute_steps == 0, compute, lambda m, p: p, matrices, previous
      )
    else:
      computed = compute(matrices, previous)
    out = [[[] for _ in ps] for ps in precs]
    for (i, j), r in zip(where, computed, strict=True):
      out[i][j].append(r)
    return [
      tuple(jnp.stack(rs).reshape(p.shape) for rs, p in zip(rows, ps, strict=True))
      for rows, ps in zip(out, precs, strict=True)
    ]

  def _leaf(layout, grad, param, diag, momentum, diag_momentum, precs, step, lr):
    def one_copy(per_param, precs):
      grad, param, diag, momentum, diag_momentum = per_param
      dtype = grad.dtype
      graft_update, new_diag = _graft(graft, grad, None if not diagonal else diag, h)
      graft_update = graft_update * (1.0 if decoupled_learning_rate else lr)
      if layout.skip:
        precond = graft_update
      else:
        precond = _preconditioned(layout, grad, precs)
      multiplier = jnp.linalg.norm(graft_update) / (jnp.linalg.norm(precond) + 1e-16)
      shampoo_update = precond * multiplier
      graft_wd = graft_update
      if decays and not decoupled_weight_decay:
        shampoo_update = shampoo_update + weight_decay * param
        graft_wd = graft_update + weight_decay * param
      w = (1.0 - beta1) if moving_average_for_momentum else 1.0
      new_momentum = momentum * beta1 + w * shampoo_update
      new_diag_momentum = diag_momentum * beta1 + w * graft_wd
      run = (step >= start_preconditioning_step).astype(new_diag_momentum.dtype)
      momentum_update = run * new_momentum + (1.0 - run) * new_diag_momentum
      if nesterov:
        wd_update = run * shampoo_update + (1.0 - run) * graft_wd
        momentum_update = w * wd_update + beta1 * momentum_update
      if decays and decoupled_weight_decay:
        momentum_update = momentum_update + lr * weight_decay * param
      update = -1.0 * (lr if decoupled_learning_rate else 1.0) * momentum_update
      return (
        update.astype(dtype),
        diag if new_diag is None else new_diag.astype(diag.dtype),
        new_momentum.astype(momentum.dtype),
        new_diag_momentum.astype(diag_momentum.dtype),
      ), ()

    per_param = (grad, param, diag, momentum, diag_momentum)
    if not layout.batch_dims:
      return one_copy(per_param, precs)[0]
    return on_copies(layout.shape, layout.batch_dims, one_copy, per_param, precs, unrolled=True)[0]

  # One program even when called eagerly: op by op, XLA rounds the update's arithmetic
  # differently, and the inverse roots amplify the difference (1e-5 after a dozen steps).
  return optax.GradientTransformation(init_fn, jax.jit(update_fn))


__all__ = ["GraftingType", "PreconditionerType", "ShampooState", "shampoo", "shampoo_roles"]
