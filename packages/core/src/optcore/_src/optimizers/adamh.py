"""AdamH, the hyperball Adam: each weight's Frobenius norm held where it started, its numbers
those of levanter's ``scale_by_adamh`` (``src/levanter/optim/adamh.py``, marin-community).

Per step, with ``u`` Adam's bias-corrected direction ``m^ / (sqrt(v^) + eps)`` and ``||.||`` the
Frobenius norm (of the whole leaf for a matrix; of each slice along the first axis otherwise,
so a stacked leaf keeps one norm a layer):

    p' = p - lr * u * ||p|| / ||u||
    p <- p' * ||p|| / ||p'||

The step moves along the sphere of radius ``||p||`` by an angle set by ``lr`` alone, so there
is no weight decay: levanter's default rate ``sqrt(lr * wd)`` of the AdamW it replaces.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_real_params, require_params
from optcore._src.ground.declarations import Count, FirstMoment, SecondMoment
from optcore._src.ground.hyper_params import value_at
from optcore._src.optimizers.matrix_state import kept_dtypes, sphere_step

PyTree = Any


class AdamHState(NamedTuple):
  """The optax state of `adamh`: levanter's ``ScaleByAdamHState``.

  Attributes:
    count: int32, the steps taken.
    mu: the first moment (in ``mu_dtype``, else the parameters' dtype).
    nu: the second moment.
  """

  count: Count
  mu: FirstMoment
  nu: SecondMoment


@a.declare(learning_rate=a.RATE, b1=a.DECAY, b2=a.DECAY, eps=a.NONNEGATIVE)
def adamh(
  learning_rate: optax.ScalarOrSchedule = 0.02,
  b1: float = 0.9,
  b2: float = 0.999,
  eps: float = 1e-8,
  mu_dtype: Any = None,
) -> optax.GradientTransformation:
  """AdamH: Adam's direction, each weight kept on the sphere of its starting norm
  (levanter's ``scale_by_adamh``, its names, order and defaults).

  Every leaf given takes the step, the norm of a matrix whole and of each slice along the
  first axis of any other leaf: a vector's slices are its elements, which the step can only
  keep or flip. Give biases, norms' scales and embeddings their own group
  (`optcore.MultiOptimizer` with `optcore.adam`), as levanter's configuration does. A leaf
  whose norm (or whose direction's) is zero has no sphere: the step is NaN there, as in the
  reference. ``update`` needs ``params``.

  Args:
    learning_rate: the step's angle on the sphere, a number or a schedule.
    b1: the first moment's decay.
    b2: the second moment's decay.
    eps: added to the root of the bias-corrected second moment.
    mu_dtype: the first moment's dtype (None: the parameters').

  Returns:
    An optax transformation whose state is an `AdamHState`.

  Raises:
    optcore.ArgumentError: an argument out of its range (a decay in [0, 1), ``eps >= 0``).

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> params = {'w': jnp.array([[3.0, 0.0], [0.0, 4.0]])}
    >>> opt = optcore.contrib.adamh(learning_rate=0.1).create(params)
    >>> opt = opt.apply_gradient({'w': jnp.array([[1.0, 2.0], [0.0, -1.0]])})
    >>> round(float(jnp.linalg.norm(opt.target['w'])), 4)  # the norm it started with
    5.0
  """

  def init_fn(params: PyTree) -> AdamHState:
    check_real_params("adamh", params)
    mu = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), mu_dtype or jnp.result_type(p)), params)
    nu = jax.tree.map(jnp.zeros_like, params)
    return AdamHState(jnp.zeros((), jnp.int32), mu, nu)

  def update_fn(updates: PyTree, state: AdamHState, params: PyTree = None):
    require_params("adamh", params, "the step reads their norms")
    count = optax.safe_increment(state.count)
    lr = value_at(learning_rate, state.count)
    mu = jax.tree.map(lambda g, m: (1 - b1) * g + b1 * m, updates, state.mu)
    nu = jax.tree.map(lambda g, v: (1 - b2) * (g * g) + b2 * v, updates, state.nu)
    first, second = jnp.asarray(1 - b1**count), jnp.asarray(1 - b2**count)

    def step(p, m, v):
      m_hat = m / first.astype(m.dtype)
      v_hat = v / second.astype(v.dtype)
      return sphere_step(p, m_hat / (jnp.sqrt(v_hat) + eps), lr)

    new = jax.tree.map(step, params, mu, nu)
    return new, AdamHState(count, kept_dtypes(mu, state.mu), kept_dtypes(nu, state.nu))

  return optax.GradientTransformation(init_fn, update_fn)  # pyright: ignore[reportArgumentType]  # its own state type, optax's protocol says OptState


__all__ = ["AdamHState", "adamh"]
