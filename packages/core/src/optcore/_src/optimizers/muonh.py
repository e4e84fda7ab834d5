"""MuonH, Muon on the hyperball: the orthogonalised momentum, each weight's Frobenius norm held
where it started; its numbers those of levanter's ``scale_with_muonh``
(``src/levanter/optim/muonh.py``, marin-community).

Per step, with ``g`` the gradient:

    m <- momentum * m + g;   d = momentum * m + g (nesterov), else m
    u = NS5(d)   (a matrix: d / (||d|| + muon_eps), ``steps`` quintic Newton-Schulz iterations)
    p' = p - lr * u * ||p|| / ||u||;   p <- p' * ||p|| / ||p'||

A matrix is orthogonalised whole, a stack of matrices (a 3-D leaf) one layer at a time, as
levanter's stacked ``Linear`` layers are; any other leaf keeps ``d`` as it is (levanter's rule
for what is not a ``Linear``). The norm held is a matrix's, or each slice's along the first axis.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_real_params, require_params
from optcore._src.ground.declarations import Count, FirstMoment
from optcore._src.ground.hyper_params import value_at
from optcore._src.optimizers.matrix_state import kept_dtypes, newton_schulz5, sphere_step

PyTree = Any


class MuonHState(NamedTuple):
  """The optax state of `muonh`: levanter's ``ScaleByMuonHState`` and a step count, which a
  schedule of the rate reads (levanter's trainer keeps it in ``optax.inject_hyperparams``).

  Attributes:
    count: int32, the steps taken.
    momentum_buffer: each leaf's momentum (a sum of gradients, ``momentum * m + g``).
  """

  count: Count
  momentum_buffer: FirstMoment


@a.declare(
  momentum=a.DECAY, nesterov=a.Flag(), steps=a.COUNT, muon_eps=a.NONNEGATIVE, learning_rate=a.RATE
)
def muonh(
  momentum: float = 0.95,
  nesterov: bool = True,
  steps: int = 5,
  muon_eps: float = 1e-8,
  learning_rate: optax.ScalarOrSchedule = 0.02,
) -> optax.GradientTransformation:
  """MuonH: Muon's orthogonalised momentum, each weight kept on the sphere of its starting
  norm (levanter's ``scale_with_muonh``, its names, order and defaults).

  Matrices take Muon's direction (a 3-D leaf: one matrix a slice along its first axis); other
  leaves their momentum as it is, on one norm an element: give them Adam in a group of their
  own (`optcore.MultiOptimizer`), as levanter's configuration does (and `optcore.contrib.adamh`
  to its output head). Newton-Schulz runs in float32. ``update`` needs ``params``.

  Args:
    momentum: the momentum's decay (``m <- momentum * m + g``).
    nesterov: step along ``momentum * m + g`` instead of ``m``.
    steps: Newton-Schulz iterations.
    muon_eps: added to the norm a matrix is divided by before them.
    learning_rate: the step's angle on the sphere, a number or a schedule.

  Returns:
    An optax transformation whose state is a `MuonHState`.

  Raises:
    optcore.ArgumentError: an argument out of its range (``momentum`` in [0, 1), ``steps``
      a positive integer, ``muon_eps >= 0``).

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> params = {'w': jnp.array([[3.0, 0.0], [0.0, 4.0]])}
    >>> opt = optcore.contrib.muonh(learning_rate=0.1).create(params)
    >>> opt = opt.apply_gradient({'w': jnp.array([[1.0, 2.0], [0.0, -1.0]])})
    >>> round(float(jnp.linalg.norm(opt.target['w'])), 4)  # the norm it started with
    5.0
  """

  def init_fn(params: PyTree) -> MuonHState:
    check_real_params("muonh", params)
    zeros = jax.tree.map(jax.numpy.zeros_like, params)
    return MuonHState(jax.numpy.zeros((), jax.numpy.int32), zeros)

  def direction(d: jax.Array) -> jax.Array:
    if d.ndim in (2, 3):  # a matrix, or a stack of them: each orthogonalised alone
      return newton_schulz5(d, steps, muon_eps).astype(d.dtype)
    return d

  def update_fn(updates: PyTree, state: MuonHState, params: PyTree = None):
    require_params("muonh", params, "the step reads their norms")
    lr = value_at(learning_rate, state.count)
    buf = jax.tree.map(lambda m, g: momentum * m + g, state.momentum_buffer, updates)
    steer = jax.tree.map(lambda m, g: momentum * m + g, buf, updates) if nesterov else buf
    new = jax.tree.map(lambda p, d: sphere_step(p, direction(d), lr), params, steer)
    count = optax.safe_increment(state.count)
    return new, MuonHState(count, kept_dtypes(buf, state.momentum_buffer))

  return optax.GradientTransformation(init_fn, update_fn)  # pyright: ignore[reportArgumentType]  # its own state type, optax's protocol says OptState


__all__ = ["MuonHState", "muonh"]
