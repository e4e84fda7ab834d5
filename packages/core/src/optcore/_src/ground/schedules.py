"""Warmup-stable-decay (trapezoidal) learning-rate schedules: a linear warm-up, a constant
rate, and a cooldown of a chosen shape (Hu et al., MiniCPM, arXiv 2404.06395; Hägele et al.,
arXiv 2405.18392, whose cooldown shapes these are)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax.numpy as jnp

from optcore._src.ground import arguments as a

#: The cooldown shapes, as functions of the cooldown's progress ``x`` in [0, 1] to the share
#: of ``peak_value - end_value`` left: Hägele et al.'s linear, ``1 - sqrt`` (their best) and
#: the cosine of the usual cosine schedule.
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


_STEPS = a.Number(0, integer=True)


@a.declare(
  peak_value=a.Number(),
  total_steps=_STEPS,
  warmup_steps=_STEPS,
  decay_steps=a.Number(0, integer=True, none=True),
  init_value=a.Number(),
  end_value=a.Number(),
  decay_shape=a.OneOf(DECAY_SHAPES),
)
def warmup_stable_decay(
  peak_value: float,
  total_steps: int,
  warmup_steps: int = 0,
  decay_steps: int | None = None,
  *,
  init_value: float = 0.0,
  end_value: float = 0.0,
  decay_shape: str = "linear",
) -> Any:
  """A warmup-stable-decay schedule: ``count -> rate``, as every optax schedule.

  From ``init_value`` to ``peak_value`` linearly over ``warmup_steps``, then ``peak_value``
  until the cooldown's ``decay_steps`` (the last steps before ``total_steps``), which take it
  to ``end_value`` along ``decay_shape``, with ``x`` the cooldown's progress in [0, 1]:

  - ``'linear'``: ``end + (peak - end) (1 - x)``;
  - ``'cosine'``: ``end + (peak - end) (1 + cos(pi x)) / 2``;
  - ``'1-sqrt'``: ``end + (peak - end) (1 - sqrt(x))``.

  After ``total_steps`` it stays at ``end_value``. A cooldown can start from any checkpoint
  of the stable phase: that is the point of the shape (continue a run by raising
  ``total_steps``).

  Args:
    peak_value: the stable phase's rate.
    total_steps: the step at which the cooldown ends.
    warmup_steps: the warm-up's length (0: none).
    decay_steps: the cooldown's length; None: a fifth of ``total_steps`` (rounded), the
      20% Hägele et al. recommend.
    init_value: the rate at step 0 of the warm-up.
    end_value: the rate at the end of the cooldown.
    decay_shape: ``'linear'``, ``'cosine'`` or ``'1-sqrt'``.

  Returns:
    A schedule: give it as ``learning_rate=`` to any optimizer, or as a live override.

  Raises:
    ValueError: an unknown ``decay_shape``, or phases that do not fit in ``total_steps``.

  Example:
    >>> from optcore import schedules
    >>> lr = schedules.warmup_stable_decay(1.0, total_steps=10, warmup_steps=2, decay_steps=4)
    >>> [round(float(lr(t)), 2) for t in range(11)]
    [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
  """
  if decay_steps is None:
    decay_steps = round(0.2 * total_steps)
  if warmup_steps + decay_steps > total_steps:
    raise ValueError(
      f"warmup_stable_decay: warmup_steps + decay_steps ({warmup_steps} + {decay_steps}) is "
      f"more than total_steps ({total_steps}): shorten one, or raise total_steps."
    )
  decay_start = total_steps - decay_steps

  def schedule(count: Any) -> Any:
    t = jnp.asarray(count, jnp.float32)
    warm = init_value + (peak_value - init_value) * t / max(warmup_steps, 1)
    x = jnp.clip((t - decay_start) / max(decay_steps, 1), 0.0, 1.0)
    if decay_shape == "linear":
      left = 1.0 - x
    elif decay_shape == "cosine":
      left = 0.5 * (1.0 + jnp.cos(jnp.pi * x))
    else:
      left = 1.0 - jnp.sqrt(x)
    cooled = end_value + (peak_value - end_value) * left
    rate = jnp.where(t < warmup_steps, warm, jnp.where(t < decay_start, peak_value, cooled))
    return jnp.where(t >= total_steps, end_value, rate)

  # what `optcore.config` writes for it (and reads back through `OWN_SCHEDULES`)
  return _with_config(schedule, {
    "schedule": "warmup_stable_decay",
    "peak_value": peak_value,
    "total_steps": total_steps,
    "warmup_steps": warmup_steps,
    "decay_steps": decay_steps,
    "init_value": init_value,
    "end_value": end_value,
    "decay_shape": decay_shape,
  })  # fmt: skip


@runtime_checkable
class WritesConfig(Protocol):
  """A schedule that says what `optcore.config` writes for it: ``optcore_config``, the
  ``{"schedule": name, **arguments}`` that `OWN_SCHEDULES` reads back. optcore's own
  schedules carry it; the config module asks for this protocol, not for an attribute."""

  optcore_config: dict[str, Any]

  def __call__(self, count: Any) -> Any: ...


def _with_config(schedule: Any, written: dict[str, Any]) -> WritesConfig:
  """``schedule`` declaring ``written`` as its config (`WritesConfig`)."""
  schedule.optcore_config = written
  return schedule


#: optcore's own schedules by the name a config gives them (``{"schedule": name, ...}``).
OWN_SCHEDULES = {"warmup_stable_decay": warmup_stable_decay}


__all__ = ["DECAY_SHAPES", "OWN_SCHEDULES", "warmup_stable_decay"]
