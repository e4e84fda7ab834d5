"""`skip_bad_steps`: a step whose gradient is not finite, or whose norm spikes above a rolling
window's mean plus ``sigmas`` standard deviations, is skipped (one wrapper of the wrapper
protocol, `optcore._src.definitions.wrapper`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import StateWrapper
from optcore._src.ground import arguments as a
from optcore._src.ground.declarations import Nested, Replicated
from optcore._src.ground.state import OptimizerState

PyTree = Any


class SkipState(NamedTuple):
  """The state of `skip_bad_steps`.

  Attributes:
    inner: the wrapped definition's ``param_states``.
    norms: float32 ``(window,)``, what the last accepted steps were judged by (their global
      gradient norms, or losses with ``watch="loss"``), a ring buffer (entry
      ``accepted % window`` is written next).
    accepted: int32, the steps accepted so far (the window holds ``min(accepted, window)``).
    skipped: int32, the steps skipped so far.
  """

  inner: Nested
  norms: Replicated
  accepted: Replicated
  skipped: Replicated


def global_norm(grads: PyTree) -> jax.Array:
  """The L2 norm of every gradient leaf together, in float32 (of a complex gradient, its
  modulus); global under any sharding, as JAX reduces a sharded array whole."""
  squares = [jnp.sum(jnp.abs(g).astype(jnp.float32) ** 2) for g in jax.tree.leaves(grads)]
  return jnp.sqrt(sum(squares, jnp.zeros((), jnp.float32)))


def _like(new: Any, old: Any) -> Any:
  """``new`` in ``old``'s dtype (both branches of the step's cond give the same types)."""
  if jnp.issubdtype(jnp.result_type(old), jax.dtypes.prng_key):
    return new
  return jnp.asarray(new).astype(jnp.result_type(old))


#: What `skip_bad_steps` may judge: the gradients' global norm, or the loss passed as ``value``.
WATCHED = ("grad_norm", "loss")


#: The smallest standard deviation `SkipBadSteps.is_bad` reads, as a share of the window's mean.
MIN_SPREAD = 0.01


class SkipBadSteps(StateWrapper):
  """``optimizer_def`` that skips bad steps: see `skip_bad_steps`."""

  ungrouped_because = (
    "keeps a window of norms beside the wrapped state, which grouped does not lay out"
  )

  name = "skip_bad_steps"
  state_type = SkipState
  config_arguments: ClassVar = MappingProxyType(
    {"window": 100, "sigmas": 6.0, "warmup": 10, "watch": "grad_norm"}
  )
  repr_shows = ("window", "sigmas", "warmup")

  @a.declare(
    window=a.COUNT,
    sigmas=a.POSITIVE,
    warmup=a.COUNT,
    watch=a.OneOf(WATCHED, "what the window judges"),
  )
  def __init__(
    self,
    optimizer_def: OptimizerDef,
    window: int = 100,
    sigmas: float = 6.0,
    warmup: int = 10,
    watch: str = "grad_norm",
  ):
    if warmup > window:
      raise ValueError(
        f"skip_bad_steps: warmup={warmup} is longer than window={window}: the rule would read "
        "a window it cannot hold. Pass warmup <= window."
      )
    super().__init__(optimizer_def)
    self.window, self.sigmas, self.warmup = int(window), float(sigmas), int(warmup)
    self.watch = watch

  twice_hint = "skip once (one window of norms decides)"

  def init_state(self, params: PyTree) -> OptimizerState:
    inner = self.optimizer_def.init_state(params)
    norms = jnp.zeros((self.window,), jnp.float32)
    # Two arrays, never one twice: a step that donates the state donates each buffer once.
    own = SkipState(inner.param_states, norms, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    return OptimizerState(inner.step, own)

  def is_bad(self, state: SkipState, norm: jax.Array) -> jax.Array:
    """Whether a step of gradient norm ``norm`` is skipped: not finite, or, once ``warmup``
    steps are in the window, above its mean plus ``sigmas`` (population) standard
    deviations, the deviation read as at least 1% of the mean (`MIN_SPREAD`): a window of
    equal norms (constant or clipped gradients) would otherwise call every larger norm a
    spike, and since a skipped norm never enters the window, skip every later step."""
    held = jnp.minimum(state.accepted, self.window)
    valid = jnp.arange(self.window) < held
    count = jnp.maximum(held, 1).astype(jnp.float32)
    mean = jnp.sum(jnp.where(valid, state.norms, 0.0)) / count
    std = jnp.sqrt(jnp.sum(jnp.where(valid, (state.norms - mean) ** 2, 0.0)) / count)
    std = jnp.maximum(std, MIN_SPREAD * jnp.abs(mean))
    spike = (held >= self.warmup) & (norm > mean + self.sigmas * std)
    return ~jnp.isfinite(norm) | spike

  def apply_gradient(
    self, hyper_params: Any, params: PyTree, state: OptimizerState, grads: PyTree, **extra_args: Any
  ) -> tuple[PyTree, OptimizerState]:
    """The wrapped step, kept unless it is bad (`is_bad`); a skipped step leaves the
    parameters, the wrapped state and its step count as they were and counts the skip."""
    own = state.param_states
    norm = global_norm(grads)
    watched = norm
    if self.watch == "loss":
      extra_args = dict(extra_args)
      loss = extra_args.pop("value", None)  # the loss is this wrapper's; the rest go inside
      if loss is None or jnp.shape(loss) != ():
        found = "nothing" if loss is None else f"shape {jnp.shape(loss)}"
        raise TypeError(
          f"{self.display_name()} with watch='loss' judges the loss: pass it, a scalar, as "
          "optax's value argument "
          "(opt.apply_gradient(grads, extra_args={'value': loss}); Equinox and Treex: "
          "extra_args={'value': loss}; NNX and as_optax(): update(..., value=loss)); found "
          f"{found}."
        )
      watched = jnp.asarray(loss, jnp.float32)
    bad = self.is_bad(own, watched) | ~jnp.isfinite(norm)  # non-finite gradients, always
    inner = OptimizerState(state.step, own.inner)

    def step(operands: tuple) -> tuple:
      params, inner, grads = operands
      new_params, new_inner = self.optimizer_def.apply_gradient(
        hyper_params, params, inner, grads, **extra_args
      )
      return jax.tree.map(_like, new_params, params), jax.tree.map(_like, new_inner, inner)

    # lax.cond, not a select: a bad step does no update work, and a good one pays no select
    # over the parameters and the state (measured: a select cost x1.3 to x2.7 of the step).
    new_params, new_inner = jax.lax.cond(
      bad, lambda operands: operands[:2], step, (params, inner, grads)
    )
    slot = own.accepted % self.window
    norms = jnp.where(bad, own.norms, own.norms.at[slot].set(watched))
    accepted = own.accepted + jnp.where(bad, 0, 1).astype(jnp.int32)
    skipped = own.skipped + bad.astype(jnp.int32)
    new_own = SkipState(new_inner.param_states, norms, accepted, skipped)
    return new_params, OptimizerState(new_inner.step, new_own)

  def extra_arg_names(self) -> frozenset[str] | None:
    inner = self.optimizer_def.extra_arg_names()
    if self.watch != "loss" or inner is None:
      return inner
    return inner | {"value"}  # the loss the window judges


def skip_bad_steps(
  optimizer_def: OptimizerDef,
  window: int = 100,
  sigmas: float = 6.0,
  warmup: int = 10,
  *,
  watch: str = "grad_norm",
) -> SkipBadSteps:
  """Skips a step whose gradients are not finite, or whose gradient norm (or loss) spikes.

  Each step computes the global L2 norm of the gradients (in float32, over every leaf, global
  under any sharding). The step is skipped when the norm is not finite, or when at least
  ``warmup`` accepted steps are in the window and the norm exceeds their mean plus ``sigmas``
  standard deviations (the population deviation of the last ``window`` accepted norms; the rule
  OLMo and levanter use), the deviation read as at least 1% of the mean: a window of equal norms
  (constant or clipped gradients) would otherwise call every larger norm a spike and, as a skipped
  norm never enters the window, skip every later step. With ``watch="loss"`` the window holds
  losses instead, passed as optax's ``value`` extra argument on each step
  (``opt.apply_gradient(grads, extra_args={'value': loss})``; ``update(..., value=loss)`` in the
  NNX face and ``as_optax()``): a non-finite or spiking loss is skipped, and so are non-finite
  gradients still; the wrapper takes ``value`` for itself (a wrapped ``polyak_sgd`` does not see
  it). A skipped step changes nothing but the skip count: the parameters, the wrapped state and
  the step count stay as they were, so schedules read the same step again, and the window does not
  take the spike. The wrapped step runs under ``lax.cond``: a bad step does no update work, and a
  good one pays no select over the parameters and the state (a select cost x1.3 to x2.7 of an
  adamw step on a CPU; the cond costs one branch).

  Under `accumulate`, ``accumulate(skip_bad_steps(...))`` judges each applied mean gradient,
  and ``skip_bad_steps(accumulate(...))`` each mini-batch gradient (a skipped one is not added
  to the mean). The window is state: sharded (replicated), in state dicts and checkpoints, so
  a run restored mid-window decides as the uninterrupted one. Read the count with
  `optcore.skipped_steps`.

  Args:
    optimizer_def: the definition whose steps are judged.
    window: how many accepted norms the rule reads (a positive int).
    sigmas: how many standard deviations above the mean a norm may be (positive).
    warmup: accepted steps before the spike rule applies (non-finite norms are skipped
      from the start); at most ``window``.
    watch: ``"grad_norm"`` (the default) or ``"loss"``: what the window judges.

  Returns:
    A `SkipBadSteps` definition.

  Raises:
    ValueError: ``window``, ``warmup`` or ``sigmas`` is not positive, ``warmup > window``,
      or ``watch`` is neither ``"grad_norm"`` nor ``"loss"``.
    TypeError: ``optimizer_def`` is not a definition, is grouped, or skips already; from a
      step of ``watch="loss"``, no scalar loss passed.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt_def = optcore.skip_bad_steps(optcore.sgd(0.1), window=4, warmup=2)
    >>> opt = opt_def.create({'w': jnp.zeros(1)})
    >>> for g in (1.0, 1.1, 0.9, 50.0, jnp.nan, 1.0):
    ...   opt = opt.apply_gradient({'w': jnp.full(1, g)})
    >>> opt.target['w'], int(opt.state.step), int(optcore.skipped_steps(opt))
    (Array([-0.4], dtype=float32), 4, 2)
  """
  return SkipBadSteps(optimizer_def, window, sigmas, warmup, watch)
