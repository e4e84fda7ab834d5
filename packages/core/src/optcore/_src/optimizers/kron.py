"""PSGD Kron: a Kronecker-factored preconditioner fitted by Xi-Lin Li's PSGD, with the names,
defaults and random draws of its authors' JAX code (evanatyourservice/psgd_jax, ``kron.py``,
psgd-jax 0.2.9 on PyPI).

Per step, with ``g`` the gradient:

    m <- b1 m + (1 - b1) g;   m_hat = m / (1 - b1^t)          (b1 > 0; else m_hat = g)
    every 1/p steps (p the update probability, a number or a schedule of the step):
      fit Q = [Q_1, ..., Q_k] (one per dimension: triangular, or diagonal) so that
      P = Q^T Q whitens m_hat (or g): one step of PSGD's ``Q <- Q - lr [A A^T - B B^T] Q``
      with A = Q m_hat' and B = Q^-T v, m_hat' = m_hat + sqrt(eps_f32) mean|m_hat| v, v ~ N(0, 1)
    u = Q^T Q m_hat, its RMS capped at 1.1;   p <- p - lr (u + wd p)

The draws are the reference's: the step's key is ``fold_in(PRNGKey(5318008), count)``, split
once for the update and, inside it, for the 1% chance of rebalancing the factors' scales and
for the probe vectors ``v`` (one key a leaf). The update probability's default schedule is
theirs (1.0 for 500 steps, then ``exp(-0.001 (t - 500))``, down to 0.03), applied as they
apply it: the preconditioner is updated when a counter reaches ``1 / p``.

A dimension keeps a diagonal factor where its size is 1 or above ``max_size_triangular``,
where the leaf has fewer than ``min_ndim_triangular`` dimensions, or as ``memory_save_mode``
says (``"one_diag"``: the largest, ``"all_diag"``: every one). ``scanned_layers`` (a tree of
booleans, or derived from logical axes: a leaf whose first axis is a ``"batch"`` axis of
`optcore.partitioning.MATRIX_AXIS_RULES`, ``layers``) gives each slice along the first
dimension factors of its own.

State (declared, so partition rules, ZeRO-1, state dicts and low-bit state read it): the
count, the momentum (a first moment), per leaf its factors (each factor on the axis of the
dimension it preconditions, a scanned leaf's batch axis first) and the update counter.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from functools import partial
from typing import Annotated, Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from optcore._src.axes import partition_rules as pr
from optcore._src.axes.matrix_axes import rule_table, single_name
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_real_params
from optcore._src.ground.declarations import PARAM_SHAPED, Count, FirstMoment, Replicated

PyTree = Any
#: The reference's seed of every step's key.
SEED = 5318008
_LETTERS = string.ascii_lowercase + string.ascii_uppercase


def precond_update_prob_schedule(
  max_prob: float = 1.0, min_prob: float = 0.03, decay: float = 0.001, flat_start: float = 500
) -> Callable[[Any], Any]:
  """The reference's schedule of the preconditioner's update probability: ``max_prob`` for
  ``flat_start`` steps, then an exponential anneal down to ``min_prob``.

  Args:
    max_prob: the probability at the start.
    min_prob: the floor.
    decay: the anneal's rate a step.
    flat_start: the steps before it starts.

  Returns:
    ``step -> probability``.

  Example:
    >>> from optcore._src.optimizers.kron import precond_update_prob_schedule
    >>> schedule = precond_update_prob_schedule()
    >>> float(schedule(1)), round(float(schedule(1500)), 4), round(float(schedule(10_000)), 4)
    (1.0, 0.3679, 0.03)
  """

  def schedule(n: Any) -> Any:
    return jnp.minimum(
      jnp.maximum(max_prob * jnp.exp(-decay * (n - flat_start)), min_prob), max_prob
    )

  return schedule


def _factor_axes(field: PyTree, state: Any, params_axes: PyTree, params: PyTree) -> PyTree:
  """Each factor on the axis of the dimension it preconditions (its rows; a triangular one's
  columns replicated), a scanned leaf's first axis leading."""
  del state, params

  def per_param(factors: Any, spec: PartitionSpec | None, keys: tuple) -> Any:
    entries: tuple[Any, ...] = tuple(spec) if spec is not None else ()
    rank = len(entries)
    scanned = rank >= 2 and len(factors) == rank - 1  # a slice's factors, the stack leading
    lead = (entries[0],) if scanned else ()
    out = []
    for i, q in enumerate(factors):
      dim = i + len(lead)
      axis = entries[dim] if dim < rank and q.ndim > len(lead) else None
      body = () if q.ndim == len(lead) else (axis, *(None,) * (q.ndim - len(lead) - 1))
      out.append(PartitionSpec(*lead, *body))
    return out

  return pr.map_params(per_param, field, params_axes)


class KronState(NamedTuple):
  """The state of `kron` (the reference's state dict, its keys as fields).

  Attributes:
    count: int32, the steps taken.
    mu: the momentum (None where ``b1 == 0``).
    Qs_preconditioners: per leaf, its factors (a list: a ``(d, d)`` upper-triangular matrix or
      a ``(d,)`` diagonal per dimension; a scanned leaf's lead with its first dimension).
    update_counter: int32, the steps since the preconditioner was last updated.
  """

  count: Count
  mu: FirstMoment
  Qs_preconditioners: Annotated[PyTree, PARAM_SHAPED.with_axes(_factor_axes)]
  update_counter: Replicated


def _expressions(shape: tuple[int, ...], diagonal: list[bool]) -> tuple[str, tuple[str, ...], str]:
  """The einsum contractions of one leaf (its factors ``Q``): ``A = Q g`` (``exprA``), each
  factor's ``A A^H`` and ``B^H B`` (``exprGs``) and the preconditioned ``Q^H Q g`` (``exprP``).
  A dimension ``i`` is named ``L[i]``, its factor's other side ``L[i + 13]`` (and
  ``L[i + 26]``), the reference's letters, so that each contraction is the reference's."""
  if not shape:
    return ",->", (",->",), ",,->"
  n = len(shape)
  L = _LETTERS
  a_in, a_g, a_out = [], "", ""
  gs: list[str] = []
  p_q, p_qh, p_g, p_out = [], [], "", ""
  for i, diag in enumerate(diagonal):
    swapped = "".join(L[i + 13] if j == i else L[j] for j in range(n))
    if diag:
      a_in.append(L[i])
      a_g += L[i]
      a_out += L[i]
      gs.append(f"{swapped},{swapped}->{L[i + 13]}")
      p_q.append(L[i + 13])
      p_qh.append(L[i + 13])
      p_g += L[i + 13]
      p_out += L[i + 13]
    else:
      other = "".join(L[i + 26] if j == i else L[j] for j in range(n))
      a_in.append(L[i] + L[i + 13])
      a_g += L[i + 13]
      a_out += L[i]
      gs.append(f"{swapped},{other}->{L[i + 13]}{L[i + 26]}")
      p_q.append(L[i] + L[i + 13])
      p_qh.append(L[i] + L[i + 26])
      p_g += L[i + 26]
      p_out += L[i + 13]
  expr_a = ",".join(a_in) + "," + a_g + "->" + a_out
  expr_p = ",".join(p_q) + "," + ",".join(p_qh) + "," + p_g + "->" + p_out
  return expr_a, tuple(gs), expr_p


def _diagonal_dims(
  shape: tuple[int, ...], max_size: int, min_ndim: int, memory_save_mode: str | None
) -> list[bool]:
  """Which dimensions keep a diagonal factor."""
  if not shape:  # a scalar: one factor, its own
    return []
  if memory_save_mode is None:
    chosen = [False] * len(shape)
  elif memory_save_mode == "one_diag":
    chosen = [False] * len(shape)
    chosen[int(np.argsort(shape)[::-1][0])] = True
  elif memory_save_mode == "all_diag":
    chosen = [True] * len(shape)
  else:
    raise ValueError(
      f"kron: memory_save_mode must be None, 'one_diag' or 'all_diag'; got {memory_save_mode!r}"
    )
  return [
    d or size == 1 or size > max_size or len(shape) < min_ndim
    for size, d in zip(shape, chosen, strict=True)
  ]


def _initial_factors(
  shape: tuple[int, ...], diagonal: list[bool], scale: float, dtype: Any
) -> list[jax.Array]:
  if not shape:
    return [scale * jnp.ones(shape, dtype=dtype)]
  scale = scale ** (1 / len(shape))
  return [
    scale * jnp.ones(size, dtype=dtype) if diag else scale * jnp.eye(size, dtype=dtype)
    for size, diag in zip(shape, diagonal, strict=True)
  ]


def _tiny_added(x: jax.Array) -> jax.Array:
  return x + jnp.finfo(x.dtype).tiny


def _spectral_lower_bound(m: jax.Array) -> jax.Array:
  """PSGD's cheap lower bound of a matrix's spectral norm (within sqrt(2) of it): the norm of
  ``m`` applied to its own heaviest row or column, normalised."""
  top = jnp.max(jnp.abs(m))

  def bound(m: jax.Array) -> jax.Array:
    m = m / top
    squares = jnp.real(m * m.conj())
    columns, rows = jnp.sum(squares, axis=0), jnp.sum(squares, axis=1)
    i, j = jnp.argmax(columns, 0), jnp.argmax(rows, 0)
    column_weight = jax.lax.dynamic_index_in_dim(columns, i, 0, keepdims=False)
    row_weight = jax.lax.dynamic_index_in_dim(rows, j, 0, keepdims=False)

    def by_column() -> jax.Array:
      x = jax.lax.dynamic_index_in_dim(m, i, 1, keepdims=False).conj() @ m
      return top * jnp.linalg.norm((x / jnp.linalg.norm(x)) @ m.conj().T)

    def by_row() -> jax.Array:
      x = m @ jax.lax.dynamic_index_in_dim(m, j, 0, keepdims=False).conj()
      return top * jnp.linalg.norm(m.conj().T @ (x / jnp.linalg.norm(x)))

    return jax.lax.cond(column_weight > row_weight, by_column, by_row)

  return jax.lax.cond(top > 0, bound, lambda _: top, m)


def _solved_right(x: jax.Array, upper: jax.Array) -> jax.Array:
  """``x @ inv(upper)``, ``upper`` upper-triangular (over ``x``'s last two dimensions)."""
  vector = x.ndim < 2
  if vector:
    x = x[None, :]
  dtype = jnp.promote_types(upper.dtype, x.dtype)
  upper, x = upper.astype(dtype), x.astype(dtype)
  solve = partial(jax.lax.linalg.triangular_solve, left_side=False, lower=False)
  for _ in range(max(0, x.ndim - 2)):
    solve = jax.vmap(solve, in_axes=(None, 0))
  out = solve(upper, x)
  return out[0] if vector else out


def _conj_b(factors: list[jax.Array], v: jax.Array) -> jax.Array:
  """``B = Q^-H v`` laid out as the factor updates read it (the reference's ``conjB``)."""
  order = v.ndim
  perm = list(range(order))
  b = jnp.transpose(v.conj(), perm[1:] + perm[:1])
  for i, q in enumerate(factors):
    # a diagonal factor divides the last dimension (broadcast as the reference's rank promotion)
    b = b / q.reshape((1,) * (b.ndim - 1) + q.shape) if q.ndim < 2 else _solved_right(b, q)
    if i < order - 1:
      b = jnp.swapaxes(b, i, order - 1)
  return b


def _fitted(
  factors: list[jax.Array], g: jax.Array, conj_b: jax.Array, exprs: tuple, lr: Any
) -> list[jax.Array]:
  """One PSGD step of each factor towards whitening ``g``."""
  expr_a, expr_gs, _ = exprs
  big_a = jnp.einsum(expr_a, *factors, g)
  a_conj, b_conj = big_a.conj(), conj_b.conj()

  def one(i: int, q: jax.Array) -> jax.Array:
    term1 = jnp.einsum(expr_gs[i], big_a, a_conj)
    term2 = jnp.einsum(expr_gs[i], b_conj, conj_b)
    step = (term1 - term2) * lr
    if q.ndim < 2:
      step = step * q
      step = step / _tiny_added(jnp.max(jnp.abs(term1 + term2)))
    else:
      step = jnp.triu(step)
      step = step / _tiny_added(_spectral_lower_bound(term1 + term2))
      step = step @ q
    return q - step

  return [one(i, q) for i, q in enumerate(factors)]


def _preconditioned(factors: list[jax.Array], g: jax.Array, exprs: tuple) -> jax.Array:
  return jnp.einsum(exprs[-1], *[q.conj() for q in factors], *factors, g)


def _rebalanced(factors: list[jax.Array]) -> list[jax.Array]:
  """The factors' scales evened out (their product unchanged): each times the geometric mean
  of their largest magnitudes over its own."""
  norms = jnp.array([jnp.max(jnp.abs(q)) for q in factors], dtype=jnp.float32)
  mean = jnp.prod(norms) ** (1 / len(norms))
  return [q * x.astype(q.dtype) for q, x in zip(factors, mean / norms, strict=True)]


def _scanned_from_axes(params: PyTree, param_logical_axes: PyTree, rules: Any) -> PyTree:
  """A leaf is scanned where its first logical axis is a ``"batch"`` axis."""
  table = rule_table(rules)
  keyed, treedef = jax.tree_util.tree_flatten_with_path(params)
  specs = treedef.flatten_up_to(param_logical_axes)
  out = []
  for (keys, leaf), spec in zip(keyed, specs, strict=True):
    entries = tuple(spec) if spec is not None else ()
    first = single_name("kron", jax.tree_util.keystr(keys), entries[0]) if entries else None
    out.append(bool(jnp.ndim(leaf) > 1 and first is not None and table.get(first) == "batch"))
  return treedef.unflatten(out)


#: The ranges of the arguments `scale_by_kron` and `kron` share.
_SHARED_RANGES = {
  "b1": a.DECAY,
  "max_size_triangular": a.COUNT,
  "min_ndim_triangular": a.COUNT,
  "preconditioner_lr": a.POSITIVE,
  "preconditioner_init_scale": a.POSITIVE,
  "lax_map_batch_size": a.COUNT,
}


@a.declare(**_SHARED_RANGES)
def scale_by_kron(
  b1: float = 0.9,
  preconditioner_update_probability: Any = None,
  max_size_triangular: int = 8192,
  min_ndim_triangular: int = 2,
  memory_save_mode: str | None = None,
  momentum_into_precond_update: bool = True,
  preconditioner_lr: float = 0.1,
  preconditioner_init_scale: float = 1.0,
  mu_dtype: Any = None,
  precond_dtype: Any = None,
  precond_update_precision: str | None = "tensorfloat32",
  precond_grads_precision: str | None = None,
  scanned_layers: PyTree = None,
  lax_map_scanned_layers: bool = False,
  lax_map_batch_size: int = 8,
) -> optax.GradientTransformation:
  """PSGD Kron's preconditioned direction (the reference's ``scale_by_kron``, its arguments);
  `kron` adds the weight decay and the rate. ``scanned_layers`` may also be a function of the
  parameters."""
  if preconditioner_update_probability is None:
    preconditioner_update_probability = precond_update_prob_schedule()
  mu_dtype = None if mu_dtype is None else jax.dtypes.canonicalize_dtype(mu_dtype)
  precond_dtype = None if precond_dtype is None else jax.dtypes.canonicalize_dtype(precond_dtype)
  if memory_save_mode not in (None, "one_diag", "all_diag"):
    raise ValueError(
      f"kron: memory_save_mode must be None, 'one_diag' or 'all_diag'; got {memory_save_mode!r}"
    )

  def mapped(scanned: bool, fn: Callable[..., Any], *args: Any) -> Any:
    if not scanned:
      return fn(*args)
    if lax_map_scanned_layers:
      size = lax_map_batch_size if lax_map_batch_size > 1 else None
      return jax.lax.map(lambda xs: fn(*xs), xs=args, batch_size=size)
    return jax.vmap(fn)(*args)

  def layout(leaf: Any, scanned: bool) -> tuple[tuple[int, ...], list[bool]]:
    shape = tuple(leaf.shape[1:] if scanned else leaf.shape)
    if len(shape) > 13:
      raise ValueError(f"kron: a leaf of {len(shape)} dimensions (shape {leaf.shape}); at most 13")
    diagonal = _diagonal_dims(shape, max_size_triangular, min_ndim_triangular, memory_save_mode)
    return shape, diagonal

  def scanned_of(tree: PyTree) -> list[bool]:
    if scanned_layers is None:
      return [False] * len(jax.tree.leaves(tree))
    given = scanned_layers(tree) if callable(scanned_layers) else scanned_layers
    return [bool(s) for s in jax.tree.structure(tree).flatten_up_to(given)]

  def init_fn(params: PyTree) -> KronState:
    check_real_params("kron", params)
    leaves, treedef = jax.tree.flatten(params)
    factors = []
    for leaf, scanned in zip(leaves, scanned_of(params), strict=True):
      shape, diagonal = layout(leaf, scanned)
      qs = _initial_factors(shape, diagonal, preconditioner_init_scale, precond_dtype)
      if scanned:
        qs = [jnp.repeat(q[None], leaf.shape[0], axis=0) for q in qs]
      factors.append(qs)
    mu = None
    if b1 > 0:
      mu = jax.tree.map(lambda x: jnp.zeros_like(x, dtype=mu_dtype), params)
    # two arrays, never one twice: a step that donates the state donates each buffer once
    return KronState(
      jnp.zeros([], jnp.int32), mu, treedef.unflatten(factors), jnp.zeros([], jnp.int32)
    )

  def update_fn(updates: PyTree, state: KronState, params: PyTree = None) -> tuple:
    del params
    count = optax.safe_increment(state.count)
    key = jax.random.fold_in(jax.random.PRNGKey(SEED), state.count)
    probability = preconditioner_update_probability
    if callable(probability):
      probability = probability(count)
    mu = None
    momentum = updates
    if state.mu is not None:
      mu = optax.tree.update_moment(updates, state.mu, b1, 1)
      momentum = optax.tree.bias_correction(mu, b1, count)
    grads, treedef = jax.tree.flatten(updates)
    momentum = treedef.flatten_up_to(momentum)
    factors = treedef.flatten_up_to(state.Qs_preconditioners)
    scanned = scanned_of(updates)
    exprs = [_expressions(*layout(g, s)) for g, s in zip(grads, scanned, strict=True)]

    def update_factors(key: jax.Array, factors: list) -> list:
      with jax.default_matmul_precision(precond_update_precision):
        fitted_to = momentum if momentum_into_precond_update else grads
        key, sub = jax.random.split(key)
        rebalance = jax.random.uniform(sub) < 0.01

        def balanced(factors: list) -> list:
          return [
            mapped(s, _rebalanced, qs) if len(qs) > 1 else qs
            for qs, s in zip(factors, scanned, strict=True)
          ]

        factors = jax.lax.cond(rebalance, balanced, lambda qs: qs, factors)
        key, sub = jax.random.split(key)
        keys = jax.random.split(sub, len(fitted_to))
        probes = [
          jax.random.normal(k, g.shape, g.dtype) for k, g in zip(keys, fitted_to, strict=False)
        ]
        damping = jnp.sqrt(jnp.finfo(jnp.float32).eps)
        fitted_to = [
          g + damping.astype(g.dtype) * jnp.mean(jnp.abs(g)) * v
          for g, v in zip(fitted_to, probes, strict=True)
        ]
        conj_bs = [
          mapped(s, _conj_b, qs, v) for s, qs, v in zip(scanned, factors, probes, strict=True)
        ]
        new = [
          mapped(s, partial(_fitted, exprs=e, lr=preconditioner_lr), qs, g, b)
          for s, e, qs, g, b in zip(scanned, exprs, factors, fitted_to, conj_bs, strict=True)
        ]
        return list(optax.tree.cast(new, precond_dtype))  # pyright: ignore[reportArgumentType]

    counter = optax.safe_increment(state.update_counter)
    due = counter >= 1 / cast(Any, probability)  # as the reference divides: a number stays one
    counter = jnp.where(due, 0, counter)
    key, sub = jax.random.split(key)
    factors = jax.lax.cond(due, update_factors, lambda _, qs: qs, sub, factors)
    with jax.default_matmul_precision(precond_grads_precision):
      directions = [
        mapped(s, partial(_preconditioned, exprs=e), qs, m)
        for s, e, qs, m in zip(scanned, exprs, factors, momentum, strict=True)
      ]

    def capped(u: jax.Array) -> jax.Array:  # the RMS of a preconditioned step is ~1: cap 1.1
      return u / jnp.maximum(1.0, jnp.sqrt(jnp.mean(jnp.real(u.conj() * u))) / 1.1)

    directions = [capped(u) for u in directions]
    new_state = KronState(
      count,
      None if mu is None else optax.tree.cast(mu, mu_dtype),
      optax.tree.cast(treedef.unflatten(factors), precond_dtype),
      counter,
    )
    return treedef.unflatten(directions), new_state

  # its own state type, where optax's protocol says OptState
  return optax.GradientTransformationExtraArgs(init_fn, update_fn)  # pyright: ignore[reportArgumentType]


@a.declare(**_SHARED_RANGES, weight_decay=a.OPTAX_WEIGHT_DECAY, learning_rate=a.RATE)
def kron(
  learning_rate: optax.ScalarOrSchedule = 0.001,
  b1: float = 0.9,
  weight_decay: float = 0.0,
  weight_decay_mask: Any = None,
  preconditioner_update_probability: float | Callable[[Any], Any] | None = None,
  max_size_triangular: int = 8192,
  min_ndim_triangular: int = 2,
  memory_save_mode: str | None = None,
  momentum_into_precond_update: bool = True,
  preconditioner_lr: float = 0.1,
  preconditioner_init_scale: float = 1.0,
  mu_dtype: Any = None,
  precond_dtype: Any = None,
  precond_update_precision: str | None = "tensorfloat32",
  precond_grads_precision: str | None = None,
  scanned_layers: PyTree = None,
  lax_map_scanned_layers: bool = False,
  lax_map_batch_size: int = 8,
  param_logical_axes: PyTree = None,
  matrix_rules: Mapping[str, str] | None = None,
) -> optax.GradientTransformation:
  """PSGD Kron (the authors' JAX ``kron``: its names, defaults, draws and numbers).

  Args:
    learning_rate: the rate, a number or a schedule.
    b1: the momentum's decay (0: none).
    weight_decay: decoupled weight decay (times the rate), added after preconditioning.
    weight_decay_mask: optax's mask of it.
    preconditioner_update_probability: a number or a schedule of the step; None: the
      reference's (`precond_update_prob_schedule`).
    max_size_triangular: the largest dimension that gets a triangular factor.
    min_ndim_triangular: leaves with fewer dimensions get diagonal factors.
    memory_save_mode: None, ``"one_diag"`` (the largest dimension diagonal) or ``"all_diag"``.
    momentum_into_precond_update: fit the preconditioner to the momentum (else the gradient).
    preconditioner_lr: the factors' step.
    preconditioner_init_scale: the preconditioner's initial scale.
    mu_dtype: the momentum's dtype.
    precond_dtype: the factors' dtype.
    precond_update_precision: matmul precision of the factors' fit.
    precond_grads_precision: matmul precision of preconditioning.
    scanned_layers: a tree of booleans: leaves whose slices along the first dimension get
      factors of their own (stacked layers).
    lax_map_scanned_layers: map over those slices with ``lax.map`` instead of ``vmap``.
    lax_map_batch_size: its batch size.
    param_logical_axes: the parameters' logical axes: a leaf whose first axis is a
      ``"batch"`` axis (``layers``) is scanned (instead of ``scanned_layers``).
    matrix_rules: axis name -> role, over `optcore.partitioning.MATRIX_AXIS_RULES`.

  Returns:
    An optax transformation whose first state is a `KronState`.

  Raises:
    optcore.ArgumentError: an argument out of its range.
    ValueError: an unknown ``memory_save_mode``.
    TypeError: ``scanned_layers`` and ``param_logical_axes`` both.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.contrib.kron(learning_rate=0.1).create({'w': jnp.ones((2, 3))})
    >>> opt = opt.apply_gradient({'w': jnp.ones((2, 3))})
    >>> bool(jnp.all(opt.target['w'] < 1.0)), opt.state.param_states[0].count.item()
    (True, 1)
  """
  if param_logical_axes is not None and scanned_layers is not None:
    raise TypeError(
      "kron: pass scanned_layers (by hand) or param_logical_axes (scanned where the first axis "
      "is a 'batch' axis), not both"
    )
  if matrix_rules is not None and param_logical_axes is None:
    raise TypeError("kron: matrix_rules apply to param_logical_axes; pass those too")
  scanned: Any = scanned_layers
  if param_logical_axes is not None:  # resolved against the parameters when they are seen
    scanned = partial(_scanned_from_axes, param_logical_axes=param_logical_axes, rules=matrix_rules)
  direction = scale_by_kron(
    b1=b1,
    preconditioner_update_probability=preconditioner_update_probability,
    max_size_triangular=max_size_triangular,
    min_ndim_triangular=min_ndim_triangular,
    memory_save_mode=memory_save_mode,
    momentum_into_precond_update=momentum_into_precond_update,
    preconditioner_lr=preconditioner_lr,
    preconditioner_init_scale=preconditioner_init_scale,
    mu_dtype=mu_dtype,
    precond_dtype=precond_dtype,
    precond_update_precision=precond_update_precision,
    precond_grads_precision=precond_grads_precision,
    scanned_layers=scanned,
    lax_map_scanned_layers=lax_map_scanned_layers,
    lax_map_batch_size=lax_map_batch_size,
  )
  parts = [direction]
  if not isinstance(weight_decay, (int, float)) or weight_decay > 0.0:
    parts.append(optax.add_decayed_weights(weight_decay, weight_decay_mask))
  parts.append(optax.scale_by_learning_rate(learning_rate))
  return optax.chain(*parts)
