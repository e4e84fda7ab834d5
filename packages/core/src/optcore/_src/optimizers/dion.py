"""Dion (Ahn et al., arXiv 2504.05295): low-rank orthonormalised updates with error feedback,
its numbers those of the authors' ``Dion`` on one device (github.com/microsoft/dion,
``dion_reference.py``, the version that follows the paper).

Per matrix ``X`` (``m x n``; worked on transposed where ``m < n``, so ``B`` is tall), with
``Q`` its right factor (``min(m, n) x r``) and ``M`` its momentum:

    M <- M + G
    P = orthonormal(B Q);  R = B^T P           (``power_iters`` times; B is M or M^T)
    M <- M - (1 - mu) P R^T                     (error feedback)
    Q <- R / (||R||_columns + epsilon)
    X <- X (1 - lr wd) - lr sqrt(m / n) P Q^T

``orthonormal`` is Householder QR (``'qr'``), randomized Cholesky QR (``'rcqr'``, a fresh
Gaussian sketch per step, its key in the state) or Cholesky QR after ``cqr_warmup_steps``
(``'cqr'``, randomized where Cholesky fails). The three differ by rounding and by the signs
of ``P``'s columns, which the update does not see (``P Q^T`` and ``P R^T`` keep them).

Every other leaf takes the reference's scalar algorithm, AdamW or Lion, with its names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optcore._src.axes.matrix_axes import on_copies
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import require_params
from optcore._src.ground.declarations import Count, FirstMoment, Replicated, SecondMoment
from optcore._src.ground.hyper_params import value_at
from optcore._src.optimizers.matrix_state import kept_dtypes, lerp, matrix_layouts_of

PyTree = Any

QR_METHODS = ("qr", "cqr", "rcqr")
SCALAR_ALGORITHMS = ("adamw", "lion")


class DionState(NamedTuple):
  """The optax state of `dion`.

  Attributes:
    count: int32, the steps taken.
    momentum: each leaf's momentum (a matrix's ``M``; the scalar algorithm's first moment).
    variance: AdamW's second moment on the other leaves; a zero scalar on the matrices and
      under Lion.
    q: a matrix's right factor, ``(*batch, min(rows, cols), rank)``; a zero scalar elsewhere.
    key: the random key of the next step's sketches (``'rcqr'``, ``'cqr'``).
  """

  count: Count
  momentum: FirstMoment
  variance: SecondMoment
  q: Replicated
  key: Replicated


def rank_of(rows: int, cols: int, rank_fraction: float, rank_multiple_of: int) -> int:
  """The reference's low rank: ``rank_fraction * min(rows, cols)`` rounded up to a multiple
  of ``rank_multiple_of``, at most ``min(rows, cols)``.

  Example:
    >>> from optcore._src.optimizers.dion import rank_of
    >>> rank_of(96, 64, 0.25, 1), rank_of(96, 64, 0.25, 24), rank_of(8, 4, 1.0, 3)
    (16, 24, 4)
  """
  r = rank_fraction * min(rows, cols)
  r = rank_multiple_of * math.ceil(r / rank_multiple_of)
  return min(r, rows, cols)


def _mm(a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def _right_solve(p: jax.Array, r: jax.Array, *, lower: bool, transpose: bool) -> jax.Array:
  """``p @ inv(r)`` (``inv(r.T)`` with ``transpose``) for a triangular ``r``."""
  return jax.lax.linalg.triangular_solve(r, p, left_side=False, lower=lower, transpose_a=transpose)


def _householder(p: jax.Array) -> jax.Array:
  return jnp.linalg.qr(p.astype(jnp.float32))[0]


def _randomized_cholesky(p: jax.Array, key: jax.Array, oversample: float) -> jax.Array:
  """The reference's RCQR: ``R`` of a Gaussian sketch's QR, ``P R^-1``, then one Cholesky QR
  step; ``p`` is tall (``rows > r``)."""
  rows, r = p.shape
  k = math.ceil(oversample * r / 128.0) * 128
  sketch = jax.random.normal(key, (k, rows), p.dtype) * math.sqrt(1.0 / k)
  upper = jnp.linalg.qr(_mm(sketch, p).astype(jnp.float32), mode="r")
  q = _right_solve(p.astype(jnp.float32), upper, lower=False, transpose=False)
  lower = jnp.linalg.cholesky(_mm(q.T, q))
  return _right_solve(q, lower, lower=True, transpose=True)


def orthonormalize(
  p: jax.Array, method: str, key: jax.Array, oversample: float, use_cholesky: Any
) -> jax.Array:
  """An orthonormal basis of ``p``'s columns (``rows >= r``) by the reference's methods.

  ``'qr'``: Householder. ``'rcqr'``: Householder where ``p`` is square, else randomized
  Cholesky QR. ``'cqr'``: Cholesky QR (of any shape) where ``use_cholesky`` (past the
  warm-up) and the factorization succeeds, else as ``'rcqr'``: the reference's order.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from optcore._src.optimizers.dion import orthonormalize
    >>> p = jnp.array([[3.0, 1.0], [4.0, 2.0], [0.0, 2.0]])
    >>> q = orthonormalize(p, "rcqr", jax.random.key(0), 1.25, False)
    >>> bool(jnp.allclose(q.T @ q, jnp.eye(2), atol=1e-5))
    True
  """
  rows, r = p.shape
  if method == "qr":
    return _householder(p).astype(p.dtype)
  if rows <= r:
    randomized = lambda: _householder(p)
  else:
    randomized = lambda: _randomized_cholesky(p, key, oversample)
  if method == "rcqr":
    return randomized().astype(p.dtype)
  p32 = p.astype(jnp.float32)
  lower = jnp.linalg.cholesky(_mm(p32.T, p32))
  ok = jnp.logical_and(use_cholesky, jnp.all(jnp.isfinite(lower)))
  cholesky = lambda: _right_solve(p32, lower, lower=True, transpose=True)
  return jax.lax.cond(ok, cholesky, randomized).astype(p.dtype)


# rcqr_oversample: the sketch has at least the rank's rows, or its Cholesky factor is singular
@a.declare(
  learning_rate=a.RATE, mu=a.NONNEGATIVE, b1=a.NONNEGATIVE, b2=a.NONNEGATIVE,
  weight_decay=a.WEIGHT_DECAY, epsilon=a.NONNEGATIVE, rank_fraction=a.Number(0, 1, low_open=True),
  rank_multiple_of=a.COUNT, power_iters=a.COUNT, qr_method=a.OneOf(QR_METHODS),
  cqr_warmup_steps=a.Number(0, integer=True), rcqr_oversample=a.Number(1),
  scalar_algorithm=a.OneOf(SCALAR_ALGORITHMS), seed=a.Number(integer=True),
)  # fmt: skip
def dion(
  learning_rate: optax.ScalarOrSchedule = 0.01,
  *,
  mu: float = 0.95,
  b1: float = 0.9,
  b2: float = 0.95,
  weight_decay: float = 0.01,
  epsilon: float = 1e-8,
  rank_fraction: float = 1.0,
  rank_multiple_of: int = 1,
  power_iters: int = 1,
  qr_method: str = "rcqr",
  cqr_warmup_steps: int = 150,
  rcqr_oversample: float = 1.25,
  scalar_algorithm: str = "adamw",
  seed: int = 0,
  # which leaves are matrices (none: the 2-D ones)
  param_logical_axes: PyTree = None,
  matrix_rules: Mapping[str, str] | None = None,
) -> optax.GradientTransformation:
  """Dion, as the authors' ``Dion`` on one device: their names (``lr`` is
  ``learning_rate``, ``betas`` is ``b1, b2``) and every default theirs; all but the rate by
  keyword, as torch's optimizers are configured.

  The matrices take Dion; every other leaf the scalar algorithm (``'adamw'`` or ``'lion'``,
  the reference's ``algorithm=`` of a group) with the same rate, betas and decay, as one
  group of the reference. Give embeddings and output heads, which the authors keep out of
  Dion, their own group (`optcore.MultiOptimizer`). Which leaves are matrices: without
  logical axes the 2-D ones; with ``param_logical_axes``, each leaf with exactly two matrix
  dimensions by `optcore.partitioning.soap_roles`' rules (``matrix_rules`` adds to them),
  ``'batch'`` dimensions taken as separate matrices. States take their parameter's dtype
  (the reference's default mixed-precision configuration).

  Args:
    learning_rate: the rate; a matrix's is scaled by ``sqrt(rows / cols)``.
    mu: the momentum kept after error feedback.
    b1: AdamW's first-moment decay; Lion's interpolation.
    b2: AdamW's second-moment decay; Lion's momentum decay.
    weight_decay: decoupled weight decay (multiplied by the rate).
    epsilon: added to the column norms of ``R`` and to AdamW's root.
    rank_fraction: the low rank over ``min(rows, cols)``, in ``(0, 1]``.
    rank_multiple_of: the rank rounded up to a multiple of this.
    power_iters: power iterations per step.
    qr_method: ``'rcqr'``, ``'cqr'`` or ``'qr'`` (see `orthonormalize`).
    cqr_warmup_steps: steps of ``'rcqr'`` before ``'cqr'`` starts.
    rcqr_oversample: the sketch's rows over the rank (rounded up to 128).
    scalar_algorithm: ``'adamw'`` or ``'lion'``, for the leaves that are not matrices.
    seed: the key of the initial ``Q`` (``N(0, 1)``, as the reference's) and the sketches.
    param_logical_axes: a `PartitionSpec` of logical axis names per parameter, or None.
    matrix_rules: axis name -> ``'matrix'``, ``'batch'`` or ``'adam'``.

  Returns:
    An optax transformation whose state is a `DionState`.

  Raises:
    ValueError: a setting out of the reference's range, naming it.
    TypeError: ``matrix_rules`` without ``param_logical_axes``.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.contrib.dion(learning_rate=0.1, rank_fraction=0.5)
    >>> grad = {'w': jnp.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])}
    >>> opt = opt.create({'w': jnp.zeros((3, 2))}).apply_gradient(grad)
    >>> opt.state.param_states.q['w'].shape  # min(3, 2) x the rank, 0.5 * 2
    (2, 1)
    >>> opt.target['w'][2]  # the update lies in the momentum's column space
    Array([0., 0.], dtype=float32)
  """
  layouts = matrix_layouts_of("dion", param_logical_axes, matrix_rules)

  def init_fn(params: PyTree) -> DionState:
    leaves, treedef = jax.tree.flatten(params)
    key = jax.random.PRNGKey(seed)
    init_key, step_key = jax.random.split(key)
    variance, qs = [], []
    for index, (p, dims) in enumerate(zip(leaves, layouts(params), strict=True)):
      if dims is None:
        shape = p.shape if scalar_algorithm == "adamw" else ()
        variance.append(jnp.zeros(shape, p.dtype))
        qs.append(jnp.zeros((), p.dtype))
        continue
      batch, rows, cols = dims
      m, n = p.shape[rows], p.shape[cols]
      rank = rank_of(m, n, rank_fraction, rank_multiple_of)
      shape = (*(p.shape[d] for d in batch), min(m, n), rank)
      variance.append(jnp.zeros((), p.dtype))
      qs.append(jax.random.normal(jax.random.fold_in(init_key, index), shape, p.dtype))
    return DionState(
      jnp.zeros((), jnp.int32),
      jax.tree.map(jnp.zeros_like, params),
      treedef.unflatten(variance),
      treedef.unflatten(qs),
      step_key,
    )

  def matrix_step(g, m, p, q, dims, lr, key, use_cholesky):
    batch, rows, cols = dims
    fan_out, fan_in = p.shape[rows], p.shape[cols]
    transpose = fan_out < fan_in
    copies = math.prod(p.shape[d] for d in batch)
    keys = jax.random.split(key, copies * power_iters).reshape(
      *(p.shape[d] for d in batch), power_iters, *key.shape
    )

    def one_copy(per_param, per_factor):
      (g, m, x), (q, keys) = per_param, per_factor
      m = m + g.astype(m.dtype)
      b = m.T if transpose else m
      q_init = q.astype(m.dtype)
      q_now = q_init
      pm = q_init  # power_iters >= 1 (checked): the loop sets it
      for i in range(power_iters):
        pm = orthonormalize(_mm(b, q_now), qr_method, keys[i], rcqr_oversample, use_cholesky)
        q_now = _mm(b.T, pm)
      zero = jnp.all(b == 0)
      pm = jnp.nan_to_num(pm) * ~zero
      r = jnp.nan_to_num(q_now) * ~zero + q_init * zero
      feedback = _mm(pm, r.T)
      m = m - (1 - mu) * (feedback.T if transpose else feedback)
      r32 = r.astype(jnp.float32)
      q_new = (r32 / (jnp.linalg.norm(r32, axis=0, keepdims=True) + epsilon)).astype(pm.dtype)
      direction = _mm(pm, q_new.T)
      direction = direction.T if transpose else direction
      u = -(lr * weight_decay) * x - (math.sqrt(fan_out / fan_in) * lr) * direction
      # A NaN or infinity that reached the momentum shows in the parameters, as in every
      # optax optimizer: the QR's clean-up above (nan_to_num, for a rank-deficient or zero
      # momentum) would otherwise hide it, and the matrix would stop moving for good.
      u = jnp.where(jnp.all(jnp.isfinite(m)), u, jnp.nan).astype(x.dtype)
      return (u, m), (q_new.astype(q.dtype),)

    (u, m), (q,) = on_copies(p.shape, batch, one_copy, (g, m, p), (q, keys))
    return u, m, q

  def scalar_step(g, m, v, p, lr, count):
    if scalar_algorithm == "lion":
      u = jnp.sign(lerp(m, g, 1 - b1))
      m = lerp(m, g, 1 - b2)
      return -(lr * weight_decay) * p - lr * u, m, v
    m = lerp(m, g, 1 - b1)
    v = v * b2 + (1 - b2) * g * g
    t = count.astype(jnp.float32)
    denom = jnp.sqrt(v) / jnp.sqrt(1 - b2**t) + epsilon
    return -(lr * weight_decay) * p - (lr / (1 - b1**t)) * (m / denom), m, v

  def update_fn(updates: PyTree, state: DionState, params: PyTree = None):
    require_params("dion", params, "the weight decay and the matrices' shapes read them")
    count = state.count + 1
    lr = value_at(learning_rate, state.count)
    key, step_key = jax.random.split(state.key)
    use_cholesky = count > cqr_warmup_steps
    leaves, treedef = jax.tree.flatten(updates)
    flat = [treedef.flatten_up_to(x) for x in (params, state.momentum, state.variance, state.q)]
    out = []
    for index, (g, p, m, v, q, dims) in enumerate(zip(leaves, *flat, layouts(params), strict=True)):
      if dims is None:
        u, m, v = scalar_step(g, m, v, p, lr, count)
      else:
        leaf_key = jax.random.fold_in(step_key, index)
        u, m, q = matrix_step(g, m, p, q, dims, lr, leaf_key, use_cholesky)
      out.append((u.astype(p.dtype), m, v, q))
    new, m, v, q = (treedef.unflatten(list(col)) for col in zip(*out, strict=True))
    # Each field keeps the dtype `init` gave it (the parameters'), whatever the gradients'.
    m, v, q = (
      kept_dtypes(m, state.momentum),
      kept_dtypes(v, state.variance),
      kept_dtypes(q, state.q),
    )
    return new, DionState(count, m, v, q, key)

  return optax.GradientTransformation(init_fn, update_fn)  # pyright: ignore[reportArgumentType]  # its own state type, optax's protocol says OptState


__all__ = ["DionState", "dion", "orthonormalize", "rank_of"]
