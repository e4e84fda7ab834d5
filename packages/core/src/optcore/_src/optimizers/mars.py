"""MARS (Yuan et al., arXiv 2411.10438): variance-reduced momentum for AdamW and Lion, its
numbers those of the authors' ``mars.py`` (github.com/AGI-Arena/MARS).

Per step, for a matrix (or every leaf with ``optimize_1d``), with ``g`` this step's gradient
and ``g_prev`` the last one (the approximate form, the authors' default):

    c = g + gamma * b1 / (1 - b1) * (g - g_prev),   c <- c / ||c|| where ||c|| > 1
    m <- b1 m + (1 - b1) c
    'mars-adamw':  v <- b2 v + (1 - b2) c^2,
                   p <- p - lr (wd p + m / ((sqrt(v) / sqrt(1 - b2^t) + eps) (1 - b1^t)))
    'mars-lion':   p <- p - lr (wd p + sign(m))

Every other leaf takes AdamW with ``betas_1d``, ``lr_1d`` and ``weight_decay_1d``, in the same
form (``eps`` added before the bias correction of ``v``, as the authors' code does).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_real_params, require_params
from optcore._src.ground.declarations import (
  Count,
  FirstMoment,
  ParamShaped,
  SecondMoment,
)
from optcore._src.ground.hyper_params import value_at
from optcore._src.optimizers.matrix_state import kept_dtypes

PyTree = Any

MARS_TYPES = ("mars-adamw", "mars-lion")


class MarsState(NamedTuple):
  """The optax state of `mars`.

  Attributes:
    count: int32, the steps taken.
    exp_avg: the first moment (of ``c`` on MARS leaves, of the gradient on the others).
    exp_avg_sq: the second moment (unchanged by ``'mars-lion'`` on MARS leaves).
    max_exp_avg_sq: the running maximum of ``exp_avg_sq`` with ``amsgrad``; else empty.
    last_grad: the gradient of the last step (the approximate form's ``g_prev``).
  """

  count: Count
  exp_avg: FirstMoment
  exp_avg_sq: SecondMoment
  max_exp_avg_sq: SecondMoment
  last_grad: ParamShaped


@a.declare(
  learning_rate=a.RATE, b1=a.DECAY, b2=a.DECAY, eps=a.NONNEGATIVE, weight_decay=a.WEIGHT_DECAY,
  amsgrad=a.Flag(), gamma=a.Number(), is_approx=a.Flag(),
  mars_type=a.OneOf(MARS_TYPES, "'mars-shampoo' is not here: contrib.muon or soap precondition"),
  optimize_1d=a.Flag(), lr_1d=a.RATE, betas_1d=a.Numbers(a.DECAY, 2),
  weight_decay_1d=a.WEIGHT_DECAY,
)  # fmt: skip
def mars(
  learning_rate: optax.ScalarOrSchedule = 3e-3,
  b1: float = 0.95,
  b2: float = 0.99,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  amsgrad: bool = False,
  gamma: float = 0.025,
  is_approx: bool = True,
  mars_type: str = "mars-adamw",
  optimize_1d: bool = False,
  lr_1d: optax.ScalarOrSchedule = 3e-3,
  betas_1d: tuple[float, float] = (0.9, 0.95),
  weight_decay_1d: float = 0.1,
) -> optax.GradientTransformation:
  """MARS, as the authors' ``MARS`` optimizer (``lr`` is ``learning_rate``, ``betas`` is
  ``b1, b2``; the other names and every default are theirs).

  Matrices (2-D leaves) take the MARS step; every other leaf takes AdamW with ``betas_1d``
  at rate ``lr_1d`` and decay ``weight_decay_1d``, unless ``optimize_1d`` (then every leaf
  takes MARS, with ``weight_decay``). The state keeps the last gradient (``last_grad``);
  ``update`` needs ``params`` (the decay reads them).

  Args:
    learning_rate: the MARS leaves' rate, a number or a schedule.
    b1: the first moment's decay.
    b2: the second moment's decay.
    eps: added to the root of the second moment before its bias correction.
    weight_decay: decoupled weight decay of the MARS leaves (multiplied by the rate).
    amsgrad: divide by the running maximum of the second moment.
    gamma: the scale of the gradient correction ``g - g_prev``.
    is_approx: True (the only form here): ``g_prev`` is the last step's gradient. The exact
      form needs the gradient of the last batch at the current parameters, a second
      backward pass per step that an optimizer's ``update`` cannot take.
    mars_type: ``'mars-adamw'`` or ``'mars-lion'``.
    optimize_1d: the MARS step for every leaf, not only matrices.
    lr_1d: the other leaves' rate, a number or a schedule of its own. The authors' code
      keeps ``lr_1d / lr`` and multiplies the group's rate by it, so a torch scheduler
      moves both; here ``learning_rate`` (its schedule, or an override) moves the MARS
      leaves only: give ``lr_1d`` the same schedule's shape to move both.
    betas_1d: the other leaves' ``(b1, b2)``.
    weight_decay_1d: the other leaves' decoupled weight decay.

  Returns:
    An optax transformation whose state is a `MarsState`.

  Raises:
    ValueError: ``is_approx=False``, an unknown ``mars_type`` (``'mars-shampoo'`` is not
      here), or a value out of the authors' ranges.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.contrib.mars(learning_rate=0.1).create({'w': jnp.ones((2, 2))})
    >>> opt = opt.apply_gradient({'w': jnp.full((2, 2), 0.5)})
    >>> opt.target['w'].round(5)  # the first step: m / denom is 1 (up to eps)
    Array([[0.9, 0.9],
           [0.9, 0.9]], dtype=float32)
  """
  if not is_approx:
    raise ValueError(
      "mars: is_approx=False (the exact form) needs the gradient of the last batch at the "
      "current parameters, a second backward pass per step that an optimizer's update "
      "cannot take. Use is_approx=True (the authors' default), which keeps the last "
      "step's gradient in the state."
    )
  b1_1d, b2_1d = betas_1d

  def init_fn(params: PyTree) -> MarsState:
    check_real_params("mars", params)
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return MarsState(
      jnp.zeros((), jnp.int32), zeros(), zeros(), zeros() if amsgrad else (), zeros()
    )

  def update_fn(updates: PyTree, state: MarsState, params: PyTree = None):
    require_params("mars", params)
    count = state.count + 1
    t = count.astype(jnp.float32)
    lr = value_at(learning_rate, state.count)
    lr_small = value_at(lr_1d, state.count)
    correction = gamma * (b1 / (1.0 - b1))

    def leaf(g, p, m, v, vmax, last):
      if optimize_1d or g.ndim == 2:
        c = (g - last) * correction + g
        norm = jnp.linalg.norm(c)
        c = jnp.where(norm > 1.0, c / norm, c)
        m = m * b1 + c * (1.0 - b1)
        if mars_type == "mars-lion":
          return -lr * (p * weight_decay + jnp.sign(m)), m, v, vmax
        beta1, beta2, rate, decay, x = b1, b2, lr, weight_decay, c
      else:
        m = m * b1_1d + g * (1.0 - b1_1d)
        beta1, beta2, rate, decay, x = b1_1d, b2_1d, lr_small, weight_decay_1d, g
      v = v * beta2 + (1.0 - beta2) * x * x
      if amsgrad:
        vmax = jnp.maximum(vmax, v)
      root = jnp.sqrt(vmax if amsgrad else v)
      denom = (root * (1.0 / jnp.sqrt(1.0 - beta2**t)) + eps) * (1.0 - beta1**t)
      return -rate * (p * decay + m / denom), m, v, vmax

    treedef = jax.tree.structure(updates)
    flat = [treedef.flatten_up_to(x) for x in (updates, params, state.exp_avg, state.exp_avg_sq)]
    vmaxes = treedef.flatten_up_to(state.max_exp_avg_sq) if amsgrad else [None] * len(flat[0])
    lasts = treedef.flatten_up_to(state.last_grad)
    out = [leaf(*args) for args in zip(*flat, vmaxes, lasts, strict=True)]
    new_updates, m, v, vmax = (treedef.unflatten(list(col)) for col in zip(*out, strict=True))
    # Each field keeps the dtype `init` gave it (the parameters'), whatever the gradients'
    # dtype: a state whose dtypes moved would retrace jit and refuse lax.scan and a restore.
    return new_updates, MarsState(
      count,
      kept_dtypes(m, state.exp_avg),
      kept_dtypes(v, state.exp_avg_sq),
      kept_dtypes(vmax, state.max_exp_avg_sq) if amsgrad else (),
      kept_dtypes(updates, state.last_grad),
    )

  return optax.GradientTransformation(init_fn, update_fn)  # pyright: ignore[reportArgumentType]  # its own state type, optax's protocol says OptState


__all__ = ["MarsState", "mars"]
