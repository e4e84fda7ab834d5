"""SOAP (Vyas et al. 2024, arXiv:2409.11321): Adam in the eigenbasis of Shampoo's preconditioner.

The numbers are those of the authors' PyTorch ``soap.py`` (nikhilvyas/SOAP): per
dimension of each parameter a factor ``GG`` (the moving average of the gradient's
outer product over that dimension) and its eigenbasis ``Q``; Adam's moments kept
in that basis; the first step only sets up ``GG`` and ``Q`` (the parameters do
not move, so the projection never uses the gradient it projects); a new basis
every ``precondition_frequency`` steps by one power iteration and a QR
decomposition, the second moment permuted to the new eigenvalue order and the
first moment rotated into the new basis; decoupled weight decay after the step.
Dimensions above ``max_precond_dim`` (and vectors, unless ``precondition_1d``)
keep the identity. See docs/concepts/soap.md.

From logical axes (``param_logical_axes=``, or those given to ``create_sharded``),
a rule table (`optcore.partitioning.MATRIX_AXIS_RULES`, extended by
``matrix_rules=``) says what each dimension is: a ``"batch"`` dimension (stacked
layers, experts) is a set of independent copies, each with factors of its own
(they are stored stacked, with the batch dimension's axis); an ``"adam"``
dimension (``vocab``) keeps the identity, as the authors' default
``max_precond_dim`` does for vocabulary sizes; a ``"matrix"`` dimension is
preconditioned. Without axes every dimension is preconditioned, as in the
reference.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optcore._src.axes import partition_rules as pr
from optcore._src.axes.matrix_axes import (
  check_rules_with_axes,
  dimension_roles,
  on_copies,
  split_batch,
)
from optcore._src.ground import arguments as a
from optcore._src.ground import paths
from optcore._src.ground.checks import require_params
from optcore._src.ground.declarations import (
  PARAM_SHAPED,
  Count,
  FirstMoment,
  SecondMoment,
)
from optcore._src.ground.hyper_params import value_at
from optcore._src.optimizers.matrix_state import Preconditioners, lerp, preconditioner_axes

PyTree = Any


class SoapState(NamedTuple):
  """The state of `soap`, the reference's per-parameter state as trees.

  Attributes:
    count: calls so far; the first only sets up ``gg`` and ``q``, so Adam's
      step (the reference's ``state['step']``) is ``count`` at the update.
    exp_avg: Adam's first moment, in the eigenbasis ``q``.
    exp_avg_sq: Adam's second moment, in the eigenbasis ``q``.
    gg: per parameter, `Preconditioners` holding the factors (``GG``).
    q: per parameter, `Preconditioners` holding their eigenbases (``Q``).
  """

  count: Count
  exp_avg: FirstMoment
  exp_avg_sq: SecondMoment
  gg: Annotated[PyTree, PARAM_SHAPED.with_axes(preconditioner_axes)]
  q: Annotated[PyTree, PARAM_SHAPED.with_axes(preconditioner_axes)]


@dataclasses.dataclass(frozen=True)
class _Layout:
  """How one parameter is preconditioned (static)."""

  shape: tuple[int, ...]
  batch_dims: tuple[int, ...]
  slice_shape: tuple[int, ...]  # the shape of one copy: the non-batch dimensions
  channels_last: bool  # a 4-D slice merged as NCHW from NHWC
  merged_shape: tuple[int, ...]
  preconditioned: tuple[bool, ...]  # per merged dimension
  dims: tuple[int | None, ...]  # per merged dimension, the parameter's dimension

  @property
  def permuted_shape(self) -> tuple[int, ...]:
    return _as_nchw(self.slice_shape) if self.channels_last else self.slice_shape

  def to_merged(self, x: jax.Array) -> jax.Array:
    if self.channels_last:
      x = jnp.transpose(x, (0, 3, 1, 2))
    return x.reshape(self.merged_shape)

  def from_merged(self, x: jax.Array) -> jax.Array:
    x = x.reshape(self.permuted_shape)
    return jnp.transpose(x, (0, 2, 3, 1)) if self.channels_last else x


def _as_nchw(shape: tuple[int, ...]) -> tuple[int, ...]:
  """An NHWC shape read as NCHW (the reference's ``permute(0, 3, 1, 2)``)."""
  return (shape[0], shape[3], shape[1], shape[2])


def _merge_groups(shape: tuple[int, ...], max_precond_dim: int) -> list[tuple[int, ...]]:
  """Which of ``shape``'s dimensions each merged dimension holds (the reference's rule;
  a merged dimension of size 1 holds those of size 1, or none for a scalar)."""
  groups: list[tuple[int, ...]] = []
  current, members = 1, []
  for dim, size in enumerate(shape):
    if current * size > max_precond_dim:
      if current > 1:
        groups.append(tuple(members))
        current, members = size, [dim]
      else:
        groups.append((*members, dim))
        current, members = 1, []
    else:
      current *= size
      members.append(dim)
  if current > 1 or not groups:
    groups.append(tuple(members))
  return groups


def _layout(
  path: str,
  shape: tuple[int, ...],
  roles: tuple[str, ...] | None,
  *,
  max_precond_dim: int,
  merge_dims: bool,
  precondition_1d: bool,
  data_format: str,
) -> _Layout:
  roles, batch, kept, slice_shape = split_batch(shape, roles)
  slice_roles = tuple(roles[d] for d in kept)
  if len(slice_shape) == 1:
    size = slice_shape[0]
    return _Layout(
      shape, batch, slice_shape, False, slice_shape,
      (precondition_1d and size <= max_precond_dim and slice_roles[0] != "adam",), kept,
    )  # fmt: skip
  if merge_dims:
    if "adam" in slice_roles:
      raise pr.PartitionRuleError(
        f"soap: the parameter at {path!r} (shape {shape}, roles {roles}) has a dimension the "
        "matrix rules leave unpreconditioned ('adam'), and merge_dims=True merges dimensions "
        "by size alone. Pass merge_dims=False, or a rule making that axis 'matrix'."
      )
    channels_last = data_format == "channels_last" and len(slice_shape) == 4
    permuted = _as_nchw(slice_shape) if channels_last else slice_shape
    groups = _merge_groups(permuted, max_precond_dim)
    merged = tuple(math.prod(permuted[d] for d in group) for group in groups)
    read_as = _as_nchw(kept) if channels_last else kept  # the parameter's dims, merge order
    dims = tuple(read_as[group[0]] if len(group) == 1 else None for group in groups)
    return _Layout(
      shape, batch, slice_shape, channels_last, merged,
      tuple(size <= max_precond_dim for size in merged), dims,
    )  # fmt: skip
  pairs = zip(slice_shape, slice_roles, strict=True)
  preconditioned = tuple(size <= max_precond_dim and r != "adam" for size, r in pairs)
  return _Layout(shape, batch, slice_shape, False, slice_shape, preconditioned, kept)


def soap_roles(
  params: PyTree, param_logical_axes: PyTree, rules: Mapping[str, str] | None = None
) -> PyTree:
  """Per parameter, the role of each of its dimensions (``"matrix"``, ``"batch"``
  or ``"adam"``) from its logical axes, as `soap` uses them.

  A parameter of rank 3 or more with a dimension no rule names (or no name)
  raises, naming its path; in a vector or a matrix such a dimension is a matrix
  dimension, as the reference treats every dimension.

  Args:
    params: the parameters (arrays or abstract arrays).
    param_logical_axes: one `PartitionSpec` (or tuple of names, or None) per
      parameter.
    rules: axis name -> role, added to (and overriding) `MATRIX_AXIS_RULES`.

  Returns:
    A tree of the parameters' structure with a tuple of roles at each leaf.

  Raises:
    PartitionRuleError: the axes do not fit the parameters, or a parameter of
      rank 3 or more has a dimension no rule covers.

  Example:
    >>> import jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from optcore.partitioning import soap_roles
    >>> params = {'wi': jnp.zeros((4, 8, 16)), 'emb': jnp.zeros((32, 8))}
    >>> soap_roles(params, {'wi': P('layers', 'embed', 'mlp'), 'emb': P('vocab', 'embed')})
    {'emb': ('adam', 'matrix'), 'wi': ('batch', 'matrix', 'matrix')}
  """
  return dimension_roles("soap", params, param_logical_axes, rules)


def _layouts(params: PyTree, roles: PyTree | None, config: dict) -> list[_Layout]:
  keyed, treedef = jax.tree_util.tree_flatten_with_path(params)
  role_leaves = [None] * len(keyed) if roles is None else treedef.flatten_up_to(roles)
  return [
    _layout(paths.path_str(keys), tuple(leaf.shape), r, **config)
    for (keys, leaf), r in zip(keyed, role_leaves, strict=True)
  ]


# One copy's algorithm: x is a slice (the batch dimensions removed), qs its eigenbases.


def _project(layout: _Layout, x: jax.Array, qs: tuple, back: bool = False) -> jax.Array:
  """The reference's ``project`` (``project_back`` with back=True): each merged
  dimension in turn contracted with its basis (``Q``'s rows, or columns going
  back), or moved last where it keeps the identity."""
  x = layout.to_merged(x)
  for q in qs:
    if q is None:
      x = jnp.moveaxis(x, 0, -1)
    else:
      x = jnp.tensordot(x, q, axes=([0], [1 if back else 0]))
  return layout.from_merged(x)


def _update_factors(layout: _Layout, ggs: tuple, grad: jax.Array, weight: Any) -> tuple:
  g = layout.to_merged(grad.astype(jnp.float32))
  out = []
  for idx, gg in enumerate(ggs):
    if gg is None:
      out.append(None)
      continue
    others = [d for d in range(g.ndim) if d != idx]
    outer = jnp.tensordot(g, g, axes=(others, others))
    out.append(lerp(gg, outer, weight))
  return tuple(out)


def _eigenbasis(gg: jax.Array) -> jax.Array:
  """``eigh(GG + 1e-30 I)``'s eigenvectors, largest eigenvalue first (the lower
  triangle read, as torch and LAPACK read it)."""
  eye = jnp.eye(gg.shape[0], dtype=gg.dtype)
  _, vectors = jnp.linalg.eigh(gg + 1e-30 * eye, UPLO="L", symmetrize_input=False)
  return jnp.flip(vectors, axis=1)


def _refresh(layout: _Layout, ggs: tuple, qs: tuple, exp_avg_sq: jax.Array):
  """The reference's ``get_orthogonal_matrix_QR``: the old basis sorted by its
  estimated eigenvalues (the second moment permuted alike), one power
  iteration, a QR decomposition."""
  v = layout.to_merged(exp_avg_sq)
  new = []
  for ind, (m, o) in enumerate(zip(ggs, qs, strict=True)):
    if m is None:
      new.append(None)
      continue
    estimated = jnp.diagonal((o.T @ m) @ o)
    order = jnp.argsort(estimated, descending=True, stable=True)
    v = jnp.take(v, order, axis=ind)
    o = o[:, order]
    q, _ = jnp.linalg.qr(m @ o)
    new.append(q)
  return tuple(new), layout.from_merged(v)


def _adam_direction(layout, grad, exp_avg, exp_avg_sq, qs, h):
  """One Adam step in the eigenbasis: the new moments and the direction, back in
  the parameter's basis (normalized where ``normalize_grads``)."""
  dtype = exp_avg.dtype
  g = _project(layout, grad.astype(jnp.float32), qs)
  m = exp_avg.astype(jnp.float32) * h["b1"] + g * (1.0 - h["b1"])
  v = exp_avg_sq.astype(jnp.float32) * h["b2"] + jnp.square(g) * (1.0 - h["b2"])
  direction = _project(layout, m / (jnp.sqrt(v) + h["eps"]), qs, back=True)
  if h["normalize_grads"]:
    direction = direction / (1e-30 + jnp.mean(direction**2) ** 0.5)
  return m.astype(dtype), v.astype(dtype), direction


def _on_copies(layout: _Layout, one_copy, grad, param, exp_avg, exp_avg_sq, ggs, qs):
  """``one_copy`` on every copy of a parameter (`on_copies`)."""
  (update, m, v), (new_ggs, new_qs) = on_copies(
    layout.shape, layout.batch_dims,
    lambda per_param, factors: _split(one_copy(*per_param, *factors)),
    (grad, param, exp_avg, exp_avg_sq), (ggs, qs),
  )  # fmt: skip
  return update, m, v, new_ggs, new_qs


def _split(out: tuple) -> tuple[tuple, tuple]:
  return out[:3], out[3:]


@a.declare(weight_decay=a.WEIGHT_DECAY)
def soap(
  learning_rate: optax.ScalarOrSchedule = 3e-3,
  b1: float = 0.95,
  b2: float = 0.95,
  shampoo_beta: float = -1,
  eps: float = 1e-8,
  weight_decay: float = 0.01,
  precondition_frequency: int = 10,
  max_precond_dim: int = 10000,
  merge_dims: bool = False,
  precondition_1d: bool = False,
  normalize_grads: bool = False,
  data_format: str = "channels_first",
  correct_bias: bool = True,
  *,
  param_logical_axes: PyTree = None,
  matrix_rules: Mapping[str, str] | None = None,
) -> optax.GradientTransformation:
  """SOAP, with the numbers of its authors' PyTorch ``soap.py``.

  The reference's arguments under its names (``learning_rate`` for its ``lr``,
  ``b1``, ``b2`` for its ``betas``) with its defaults. The first call only sets
  up the factors and their eigenbases: its updates are zero (weight decay too).
  ``learning_rate`` may be a schedule of the number of Adam steps before this
  one. Weight decay needs the parameters in ``update`` (``params=``).

  Args:
    learning_rate: the step size (the reference's ``lr``).
    b1: Adam's first-moment decay.
    b2: Adam's second-moment decay.
    shampoo_beta: the factors' decay; a negative value means ``b2``.
    eps: added to the square root of the second moment.
    weight_decay: decoupled weight decay, ``p -= learning_rate * weight_decay * p``
      after the step.
    precondition_frequency: a new eigenbasis every this many steps.
    max_precond_dim: dimensions above this size keep the identity.
    merge_dims: merge neighbouring dimensions while their product stays at
      most ``max_precond_dim`` (a convolution's kernel).
    precondition_1d: precondition vectors too.
    normalize_grads: divide each parameter's direction by its RMS.
    data_format: ``"channels_first"`` or ``"channels_last"`` (NHWC kernels,
      read as NCHW when ``merge_dims`` merges them).
    correct_bias: Adam's bias correction.
    param_logical_axes: per parameter a `PartitionSpec` of logical axis names:
      ``"batch"`` dimensions get factors of their own per copy, ``"adam"`` ones
      keep the identity (see `soap_roles`). ``create_sharded`` passes its axes.
    matrix_rules: axis name -> role, added to `MATRIX_AXIS_RULES`.

  Returns:
    As ``optcore.contrib.soap``, an optcore definition (``.as_optax()`` gives the
    optax transformation); its optax state is a `SoapState`.

  Raises:
    ValueError: an argument out of its range.
    PartitionRuleError: (at ``init``) the axes do not fit the parameters.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.contrib.soap(learning_rate=0.1).create({'w': jnp.ones((2, 3))})
    >>> opt = opt.apply_gradient({'w': jnp.ones((2, 3))})  # the first step sets up Q
    >>> opt.target['w']
    Array([[1., 1., 1.],
           [1., 1., 1.]], dtype=float32)
  """
  if data_format not in ("channels_first", "channels_last"):
    raise ValueError(
      f"soap: data_format is 'channels_first' or 'channels_last', not {data_format!r}"
    )
  if not isinstance(precondition_frequency, int) or precondition_frequency < 1:
    raise ValueError(
      f"soap: precondition_frequency is a positive int, not {precondition_frequency!r}"
    )
  if not isinstance(max_precond_dim, int) or max_precond_dim < 1:
    raise ValueError(f"soap: max_precond_dim is a positive int, not {max_precond_dim!r}")
  check_rules_with_axes("soap", param_logical_axes, matrix_rules)
  config = dict(
    max_precond_dim=max_precond_dim,
    merge_dims=merge_dims,
    precondition_1d=precondition_1d,
    data_format=data_format,
  )
  if isinstance(shampoo_beta, (int, float)):
    factor_weight = 1 - (shampoo_beta if shampoo_beta >= 0 else b2)
  else:  # a traced override
    factor_weight = 1 - jnp.where(shampoo_beta >= 0, shampoo_beta, b2)

  def layouts_of(params: PyTree) -> list[_Layout]:
    roles = (
      None if param_logical_axes is None else soap_roles(params, param_logical_axes, matrix_rules)
    )
    return _layouts(params, roles, config)

  def init_fn(params: PyTree) -> SoapState:
    leaves, treedef = jax.tree.flatten(params)
    layouts = layouts_of(params)

    def factors(layout: _Layout) -> Preconditioners:
      batch = tuple(layout.shape[d] for d in layout.batch_dims)
      return Preconditioners(
        tuple(
          jnp.zeros((*batch, size, size), jnp.float32) if on else None
          for size, on in zip(layout.merged_shape, layout.preconditioned, strict=True)
        ),
        layout.dims,
        layout.batch_dims,
      )

    zeros = [jnp.zeros(p.shape, p.dtype) for p in leaves]
    gg = [factors(layout) for layout in layouts]
    return SoapState(
      count=jnp.zeros((), jnp.int32),
      exp_avg=treedef.unflatten(zeros),
      exp_avg_sq=treedef.unflatten([jnp.zeros(p.shape, p.dtype) for p in leaves]),
      gg=treedef.unflatten(gg),
      q=treedef.unflatten([jax.tree.map(jnp.zeros_like, f) for f in gg]),
    )

  def update_fn(updates: PyTree, state: SoapState, params: PyTree = None):
    leaves, treedef = jax.tree.flatten(updates)
    layouts = layouts_of(updates)
    if not _is_zero(weight_decay):
      require_params("soap", params, "weight_decay is applied to them; or weight_decay=0")
    count = state.count
    step = count.astype(jnp.float32)
    lr = value_at(learning_rate, count - 1)
    h = dict(b1=b1, b2=b2, eps=eps, normalize_grads=normalize_grads)
    if correct_bias:  # at the set-up call (count 0) no step is taken: count 1's value
      adam_step = jnp.maximum(step, 1.0)
      step_size = lr * jnp.sqrt(1.0 - b2**adam_step) / (1.0 - b1**adam_step)
    else:
      step_size = lr
    decay = -lr * weight_decay  # in Python's float where both are numbers, as torch's alpha
    param_leaves = [None] * len(leaves) if params is None else treedef.flatten_up_to(params)
    flat = lambda tree: treedef.flatten_up_to(tree)
    gg_old, q_old = flat(state.gg), flat(state.q)
    out = [
      _leaf(layout, g, p, m, v, gg.matrices, q.matrices, count, step_size, decay, h)
      for layout, g, p, m, v, gg, q in zip(
        layouts, leaves, param_leaves, flat(state.exp_avg), flat(state.exp_avg_sq),
        gg_old, q_old, strict=True,
      )
    ]  # fmt: skip
    new_state = SoapState(
      count=count + 1,
      exp_avg=treedef.unflatten([o[1] for o in out]),
      exp_avg_sq=treedef.unflatten([o[2] for o in out]),
      gg=treedef.unflatten(
        [Preconditioners(o[3], f.dims, f.batch_dims) for o, f in zip(out, gg_old, strict=True)]
      ),
      q=treedef.unflatten(
        [Preconditioners(o[4], f.dims, f.batch_dims) for o, f in zip(out, q_old, strict=True)]
      ),
    )
    return treedef.unflatten([o[0] for o in out]), new_state

  def _leaf(layout, grad, param, exp_avg, exp_avg_sq, ggs, qs, count, step_size, decay, h):
    def one_copy(grad, param, exp_avg, exp_avg_sq, ggs, qs):
      first = count == 0  # the set-up call: the eigenbases from the first factors, no step
      m, v, direction = _adam_direction(layout, grad, exp_avg, exp_avg_sq, qs, h)
      update = -step_size * direction
      if param is not None and not _is_zero(weight_decay):
        p = param.astype(jnp.float32)
        moved = p + update
        update = moved + decay * moved - p
      # The preconditioner after the step: the moment back to the parameter's basis, the
      # factors updated with this gradient, the eigenbases set up (first call) or refreshed
      # (every precondition_frequency steps), the moment into the (new) basis. Only the
      # decompositions are branches; their arrays reach them as operands, never as
      # constants (an eager call on NumPy state compiles the arithmetic a jitted one does).
      new_ggs = _update_factors(layout, ggs, grad, factor_weight)
      which = jnp.where(first, 0, jnp.where(count % precondition_frequency == 0, 1, 2))
      rotated = lambda m, qs, new_qs: _project(layout, _project(layout, m, qs, back=True), new_qs)

      def set_up(ggs, qs, v, m):
        new_qs = tuple(None if g is None else _eigenbasis(g) for g in ggs)
        return new_qs, v, rotated(m, qs, new_qs)

      def refresh(ggs, qs, v, m):
        new_qs, v = _refresh(layout, ggs, qs, v)
        return new_qs, v, rotated(m, qs, new_qs)

      # Between refreshes the basis stays, and so does the moment in it: no round trip.
      new_qs, new_v, m = jax.lax.switch(
        which,
        [set_up, refresh, lambda ggs, qs, v, m: (qs, v, m)],
        new_ggs,
        qs,
        v,
        m.astype(jnp.float32),
      )
      return (
        jnp.where(first, jnp.zeros_like(update), update).astype(grad.dtype),
        jnp.where(first, exp_avg, m.astype(exp_avg.dtype)),
        jnp.where(first, exp_avg_sq, new_v.astype(exp_avg_sq.dtype)),
        new_ggs,
        new_qs,
      )

    if not layout.batch_dims:
      return one_copy(grad, param, exp_avg, exp_avg_sq, ggs, qs)
    return _on_copies(layout, one_copy, grad, param, exp_avg, exp_avg_sq, ggs, qs)

  return optax.GradientTransformation(init_fn, update_fn)  # pyright: ignore[reportArgumentType]  # its own state type, optax's protocol says OptState


def _is_zero(x: Any) -> bool:
  return isinstance(x, (int, float)) and x == 0


__all__ = ["Preconditioners", "SoapState", "soap", "soap_roles"]
