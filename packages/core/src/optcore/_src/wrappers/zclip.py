"""`zclip`: adaptive gradient clipping against the history of the gradient norm (Kumar et al.,
arXiv 2504.02507), its numbers those of the authors' ``ZClip`` (github.com/bluorion-com/ZClip)
(one wrapper of the wrapper protocol, `optcore._src.definitions.wrapper`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import StateWrapper
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_float_params
from optcore._src.ground.declarations import Nested, Replicated
from optcore._src.ground.state import OptimizerState
from optcore._src.wrappers.skip import global_norm

PyTree = Any

MODES = ("zscore", "percentile")
CLIP_OPTIONS = ("adaptive_scaling", "mean")


class ZClipState(NamedTuple):
  """The state of `zclip`; every field but ``inner`` is a replicated scalar or window.

  Attributes:
    inner: the wrapped definition's ``param_states``.
    buffer: float32 ``(warmup_steps,)``, the norms of the warm-up steps (entry ``seen`` is
      written next); read once, when it is full, for the first mean and variance.
    seen: int32, the warm-up norms kept so far; ``warmup_steps`` once the averages run.
    mean: float32, the moving mean of the gradient norm.
    var: float32, the moving variance of the gradient norm.
    grad_norm: float32, the last step's gradient norm before clipping.
    clip_norm: float32, the norm the last step's gradient was clipped to (its own where
      it was not).
  """

  inner: Nested
  buffer: Replicated
  seen: Replicated
  mean: Replicated
  var: Replicated
  grad_norm: Replicated
  clip_norm: Replicated

  def logged(self) -> dict[str, jax.Array]:
    """What `optcore.statistics` shows of it: ``zclip/grad_norm``, ``zclip/clip_norm``,
    ``zclip/mean`` and ``zclip/std``."""
    return {
      "zclip/grad_norm": self.grad_norm,
      "zclip/clip_norm": self.clip_norm,
      "zclip/mean": self.mean,
      "zclip/std": jnp.sqrt(self.var),
    }


class ZClip(StateWrapper):
  """``optimizer_def`` on gradients clipped by ZClip: see `zclip`."""

  ungrouped_because = (
    "keeps a window of norms beside the wrapped state, which grouped does not lay out"
  )

  name = "zclip"
  state_type = ZClipState
  config_arguments: ClassVar = MappingProxyType(
    {
      "alpha": 0.97,
      "z_thresh": 2.5,
      "max_grad_norm": 1.0,
      "eps": 1e-6,
      "warmup_steps": 25,
      "mode": "zscore",
      "clip_option": "adaptive_scaling",
      "clip_factor": 1.0,
      "skip_update_on_spike": False,
    }
  )

  @a.declare(
    alpha=a.DECAY,
    z_thresh=a.POSITIVE,
    max_grad_norm=a.Number(0, low_open=True, none=True),
    eps=a.NONNEGATIVE,
    warmup_steps=a.COUNT,
    mode=a.OneOf(MODES),
    clip_option=a.OneOf(CLIP_OPTIONS),
    clip_factor=a.POSITIVE,
    skip_update_on_spike=a.Flag(),
  )
  def __init__(self, optimizer_def: OptimizerDef, **settings: Any):
    """``settings``: `zclip`'s keywords; the others keep ``config_arguments``' defaults."""
    s = self.settings(settings)
    self.alpha = float(s["alpha"])
    self.z_thresh = float(s["z_thresh"])
    cap = s["max_grad_norm"]
    self.max_grad_norm = None if cap is None else float(cap)
    self.eps = float(s["eps"])
    self.warmup_steps = int(s["warmup_steps"])
    self.mode = s["mode"]
    self.clip_option = s["clip_option"]
    self.clip_factor = float(s["clip_factor"])
    self.skip_update_on_spike = s["skip_update_on_spike"]
    super().__init__(optimizer_def)

  twice_hint = "clip once (a second window would judge gradients the first has clipped)"

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    inner = self.optimizer_def.init_state(params)
    # a buffer of its own each: one array in four fields could not be donated
    scalar = lambda: jnp.zeros((), jnp.float32)
    own = ZClipState(
      inner.param_states,
      jnp.zeros((self.warmup_steps,), jnp.float32),
      jnp.zeros((), jnp.int32),
      scalar(),
      scalar(),
      scalar(),
      scalar(),
    )
    return OptimizerState(inner.step, own)

  def _clip_to(self, norm: jax.Array, mean: jax.Array, var: jax.Array) -> jax.Array:
    """The authors' ``_compute_clip_val``: the threshold, NaN where no clipping is called for."""
    std = jnp.sqrt(var)
    if self.mode == "percentile":
      threshold = mean + self.z_thresh * std
      return jnp.where(norm > threshold, threshold, jnp.nan)
    z = (norm - mean) / (std + self.eps)
    if self.clip_option == "adaptive_scaling":
      eta = z / self.z_thresh
      threshold = (mean + (self.z_thresh * std) / eta) * self.clip_factor
    else:
      threshold = mean
    return jnp.where(z > self.z_thresh, threshold, jnp.nan)

  def clip(self, own: ZClipState, grads: PyTree) -> tuple[PyTree, ZClipState]:
    """``grads`` clipped as the authors' ``ZClip.step`` clips them, and the state after it.

    Warm-up (the first ``warmup_steps`` steps): the norm is kept in the buffer and the
    gradient clipped to ``max_grad_norm`` only (torch's ``clip_grad_norm_``); the step that
    fills the buffer sets the mean and (population) variance from it. After: the threshold
    of ``mode`` and ``clip_option``, capped at ``max_grad_norm``; the gradient is scaled by
    ``threshold / (norm + 1e-6)`` where its norm is above it; the mean and then the variance
    (about the new mean) move towards the threshold where one was computed, else towards the
    norm, unless ``skip_update_on_spike`` and a threshold was computed.
    """
    norm = global_norm(grads)
    warm = own.seen < self.warmup_steps
    cap = jnp.float32(np.inf if self.max_grad_norm is None else self.max_grad_norm)
    # warm-up: the buffer, and the first averages on the step that fills it
    buffer = jnp.where(warm & (jnp.arange(self.warmup_steps) == own.seen), norm, own.buffer)
    seen = jnp.where(warm, own.seen + 1, own.seen)
    first_mean = jnp.mean(buffer)
    first_var = jnp.mean((buffer - first_mean) ** 2)
    filled = warm & (seen == self.warmup_steps)
    # after warm-up: the authors' threshold, capped
    clip_val = self._clip_to(norm, own.mean, own.var)
    spike = ~jnp.isnan(clip_val)
    effective = jnp.minimum(jnp.where(spike, clip_val, norm), cap)
    limit = jnp.where(warm, cap, effective)
    coefficient = jnp.where(norm > limit, limit / (norm + 1e-6), 1.0)
    clipped = jax.tree.map(lambda g: (g * coefficient.astype(g.dtype)).astype(g.dtype), grads)
    toward = jnp.where(spike, clip_val, norm)
    mean = self.alpha * own.mean + (1 - self.alpha) * toward
    var = self.alpha * own.var + (1 - self.alpha) * (toward - mean) ** 2
    move = ~warm & ~(spike & self.skip_update_on_spike)
    mean = jnp.where(filled, first_mean, jnp.where(move, mean, own.mean))
    var = jnp.where(filled, first_var, jnp.where(move, var, own.var))
    clip_norm = jnp.minimum(norm, limit)
    return clipped, ZClipState(own.inner, buffer, seen, mean, var, norm, clip_norm)

  def compute_updates(self, hyper_params, params, state, grads, **extra_args):
    clipped, own = self.clip(state.param_states, grads)
    updates, inner = self.optimizer_def.compute_updates(
      hyper_params, params, self._inner_state(state), clipped, **extra_args
    )
    return updates, OptimizerState(inner.step, own._replace(inner=inner.param_states))

  def apply_gradient(self, hyper_params, params, state, grads, **extra_args):
    clipped, own = self.clip(state.param_states, grads)
    new_params, inner = self.optimizer_def.apply_gradient(
      hyper_params, params, self._inner_state(state), clipped, **extra_args
    )
    return new_params, OptimizerState(inner.step, own._replace(inner=inner.param_states))


def zclip(
  optimizer_def: OptimizerDef,
  alpha: float = 0.97,
  z_thresh: float = 2.5,
  max_grad_norm: float | None = 1.0,
  eps: float = 1e-6,
  warmup_steps: int = 25,
  mode: str = "zscore",
  clip_option: str = "adaptive_scaling",
  clip_factor: float = 1.0,
  skip_update_on_spike: bool = False,
) -> ZClip:
  """ZClip: ``optimizer_def`` on gradients clipped adaptively, by how far the global gradient
  norm stands above its moving mean in moving standard deviations.

  The names, defaults and order of operations are the authors' (``ZClip`` of
  github.com/bluorion-com/ZClip): ``warmup_steps`` norms are kept, then their mean and
  variance start exponential averages of decay ``alpha``. In ``'zscore'`` mode a step
  whose z-score ``(norm - mean) / (std + eps)`` exceeds ``z_thresh`` is clipped to ``mean +
  z_thresh * std / (z / z_thresh)`` times ``clip_factor`` (``'adaptive_scaling'``) or to
  ``mean`` (``'mean'``); in ``'percentile'`` mode to ``mean + z_thresh * std`` where above
  it. ``max_grad_norm`` caps every threshold, warm-up included (None: no cap). The averages
  move towards the threshold of a clipped step, else towards its norm.

  The window and averages are state: replicated (global under ZeRO-1: the norm is the whole
  gradient's), in state dicts and checkpoints. `optcore.statistics` shows the last norm,
  the norm it was clipped to, and the mean and standard deviation.

  Args:
    optimizer_def: the definition that takes the clipped gradients.
    alpha: the decay of the moving mean and variance.
    z_thresh: the z-score (or, in ``'percentile'`` mode, the number of deviations) above
      which a norm is clipped.
    max_grad_norm: a fixed cap on the norm, or None.
    eps: added to the deviation in the z-score.
    warmup_steps: the steps whose norms start the averages.
    mode: ``'zscore'`` or ``'percentile'``.
    clip_option: ``'adaptive_scaling'`` or ``'mean'`` (``'zscore'`` mode only).
    clip_factor: the multiplier of the ``'adaptive_scaling'`` threshold.
    skip_update_on_spike: keep the averages as they are on a clipped step.

  Returns:
    A `ZClip` definition.

  Raises:
    ValueError: an unknown ``mode`` or ``clip_option``, or a value out of range.
    TypeError: an argument of the wrong type, or ``optimizer_def`` is not a definition, is
      grouped or has a zclip already.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.zclip(optcore.sgd(1.0), warmup_steps=2).create({'w': jnp.zeros(1)})
    >>> for g in (0.5, 0.7, 0.6, 9.0):
    ...   opt = opt.apply_gradient({'w': jnp.array([g])})
    >>> stats = optcore.statistics(opt)
    >>> round(float(stats['zclip/grad_norm']), 3), round(float(stats['zclip/clip_norm']), 3)
    (9.0, 0.607)
  """
  settings = dict(locals())
  del settings["optimizer_def"]
  return ZClip(optimizer_def, **settings)
