"""NorMuon (Li et al., arXiv 2510.05491): Muon's orthogonalised momentum with a per-row second
moment, its numbers those of the authors' ``SingleDeviceNorMuonWithAuxAdam``
(github.com/zichongli5/NorMuon), Newton-Schulz in float32.

Per matrix, with ``g`` its gradient (rows are the first matrix dimension):

    m <- lerp(m, g, 1 - momentum);      u = lerp(g, m, momentum)       (Nesterov)
    O = NS5(u)                           (five quintic Newton-Schulz steps)
    s <- lerp(s, mean(O^2, columns), 1 - beta2)
    O' = O / (sqrt(s) + 1e-10);          O'' = O' ||O|| / (||O'|| + 1e-10)
    p <- p (1 - lr wd) - lr sqrt(max(1, rows / cols)) O''

Every other leaf takes the reference's auxiliary Adam (``adam_*``), with torch's ``lerp``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from optcore._src.axes import partition_rules as pr
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import require_params
from optcore._src.ground.declarations import SECOND_MOMENT, Count, FirstMoment
from optcore._src.ground.hyper_params import value_at
from optcore._src.optimizers.matrix_state import (
  kept_dtypes,
  lerp,
  matrix_layouts_of,
  newton_schulz5,
)

PyTree = Any


def _second_axes(field: PyTree, state: Any, params_axes: PyTree, params: PyTree) -> PyTree:
  """Partition rule of ``second_momentum``: the parameter's axes, with the size-1 column
  dimension of a matrix's per-row moment replicated."""

  def per_param(leaf: Any, spec: PartitionSpec, keys: tuple) -> PartitionSpec:
    entries = tuple(spec) + (None,) * (leaf.ndim - len(tuple(spec)))
    return PartitionSpec(*(None if n == 1 else e for n, e in zip(leaf.shape, entries, strict=True)))

  return pr.map_params(per_param, field, params_axes)


class NorMuonState(NamedTuple):
  """The optax state of `normuon`.

  Attributes:
    count: int32, the steps taken.
    momentum: each leaf's first moment (the auxiliary Adam's ``exp_avg`` on its leaves).
    second_momentum: a matrix's per-row second moment, in its parameter's layout with the
      column dimension of size 1; the auxiliary Adam's ``exp_avg_sq`` (whole) on its leaves.
  """

  count: Count
  momentum: FirstMoment
  second_momentum: Annotated[PyTree, SECOND_MOMENT.with_axes(_second_axes)]


@a.declare(
  learning_rate=a.RATE, weight_decay=a.WEIGHT_DECAY, momentum=a.DECAY, beta2=a.DECAY,
  adam_learning_rate=a.RATE, adam_b1=a.DECAY, adam_b2=a.DECAY, adam_eps=a.NONNEGATIVE,
  adam_weight_decay=a.WEIGHT_DECAY,
)  # fmt: skip
def normuon(
  learning_rate: optax.ScalarOrSchedule = 0.02,
  *,
  weight_decay: float = 0.0,
  momentum: float = 0.95,
  beta2: float = 0.95,
  # the other leaves: the reference's auxiliary Adam
  adam_learning_rate: optax.ScalarOrSchedule = 3e-4,
  adam_b1: float = 0.9,
  adam_b2: float = 0.95,
  adam_eps: float = 1e-10,
  adam_weight_decay: float = 0.0,
  # which leaves are matrices (none: the 2-D ones)
  param_logical_axes: PyTree = None,
  matrix_rules: Mapping[str, str] | None = None,
) -> optax.GradientTransformation:
  """NorMuon, as the authors' single-device optimizer with its auxiliary Adam: their names
  for the matrices (``lr`` is ``learning_rate``), the ``adam_*`` names `contrib.muon` uses for
  the other leaves (their ``betas`` are ``adam_b1, adam_b2``), every default theirs; all but
  the rate by keyword, as torch's optimizers are configured.

  Which leaves are matrices: without logical axes the 2-D ones (as the reference is given
  its hidden matrices); with ``param_logical_axes``, each leaf with exactly two matrix
  dimensions by `optcore.partitioning.soap_roles`' rules (``matrix_rules`` adds to them),
  the first the rows, ``'batch'`` dimensions taken as separate matrices. Newton-Schulz runs
  in float32 (the reference's bfloat16 rounds it to 3 digits).

  Args:
    learning_rate: the matrices' rate.
    weight_decay: the matrices' decoupled weight decay (multiplied by the rate).
    momentum: the first moment's decay (Nesterov, as the reference).
    beta2: the per-row second moment's decay.
    adam_learning_rate: the other leaves' rate.
    adam_b1: their first moment's decay.
    adam_b2: their second moment's decay.
    adam_eps: added to the root of their second moment.
    adam_weight_decay: their decoupled weight decay.
    param_logical_axes: a `PartitionSpec` of logical axis names per parameter, or None.
    matrix_rules: axis name -> ``'matrix'``, ``'batch'`` or ``'adam'``.

  Returns:
    An optax transformation whose state is a `NorMuonState`.

  Raises:
    TypeError: ``matrix_rules`` without ``param_logical_axes``.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.contrib.normuon(learning_rate=0.1).create({'w': jnp.zeros((2, 2))})
    >>> opt = opt.apply_gradient({'w': jnp.eye(2)})
    >>> round(float(opt.target['w'][0, 0]), 3), float(opt.target['w'][0, 1])
    (-0.111, 0.0)
  """
  layouts = matrix_layouts_of("normuon", param_logical_axes, matrix_rules)

  def init_fn(params: PyTree) -> NorMuonState:
    leaves, treedef = jax.tree.flatten(params)
    second = []
    for p, dims in zip(leaves, layouts(params), strict=True):
      shape = list(p.shape)
      if dims is not None:
        shape[dims[2]] = 1
      second.append(jnp.zeros(shape, p.dtype))
    return NorMuonState(
      jnp.zeros((), jnp.int32),
      jax.tree.map(jnp.zeros_like, params),
      treedef.unflatten(second),
    )

  def matrix_step(g, m, s, dims, p):
    batch, rows, cols = dims
    m = lerp(m, g, 1 - momentum)
    u = lerp(g, m, momentum)
    order = (*batch, rows, cols)
    back = tuple(order.index(d) for d in range(g.ndim))
    o = newton_schulz5(jnp.transpose(u, order))
    norm = jnp.linalg.norm(o, axis=(-2, -1), keepdims=True)
    s_moved = jnp.transpose(s, order)
    s_moved = lerp(s_moved, jnp.mean(o * o, axis=-1, keepdims=True), 1 - beta2)
    o = o * (1 / (jnp.sqrt(s_moved) + 1e-10))
    o = o * (norm / (jnp.linalg.norm(o, axis=(-2, -1), keepdims=True) + 1e-10))
    o = o * math.sqrt(max(1, g.shape[rows] / g.shape[cols]))
    o = jnp.transpose(o, back).astype(p.dtype)
    return o, m, jnp.transpose(s_moved, back)

  def update_fn(updates: PyTree, state: NorMuonState, params: PyTree = None):
    require_params("normuon", params)
    count = state.count + 1
    lr = value_at(learning_rate, state.count)
    adam_lr = value_at(adam_learning_rate, state.count)
    leaves, treedef = jax.tree.flatten(updates)
    flat = [treedef.flatten_up_to(x) for x in (params, state.momentum, state.second_momentum)]
    out = []
    for g, p, m, s, dims in zip(leaves, *flat, layouts(params), strict=True):
      if dims is not None:
        o, m, s = matrix_step(g, m, s, dims, p)
        out.append((-(lr * weight_decay) * p - lr * o, m, s))
        continue
      m = lerp(m, g, 1 - adam_b1)
      s = lerp(s, jnp.square(g), 1 - adam_b2)
      t = count.astype(jnp.float32)
      step = (m / (1 - adam_b1**t)) / (jnp.sqrt(s / (1 - adam_b2**t)) + adam_eps)
      out.append((-(adam_lr * adam_weight_decay) * p - adam_lr * step, m, s))
    new, m, s = (treedef.unflatten(list(col)) for col in zip(*out, strict=True))
    # Each moment keeps the dtype `init` gave it (the parameters'): Newton-Schulz's float32
    # would otherwise move a bfloat16 second moment to float32 after the first step.
    return new, NorMuonState(
      count, kept_dtypes(m, state.momentum), kept_dtypes(s, state.second_momentum)
    )

  return optax.GradientTransformation(init_fn, update_fn)  # pyright: ignore[reportArgumentType]  # its own state type, optax's protocol says OptState


__all__ = ["NorMuonState", "newton_schulz5", "normuon"]
