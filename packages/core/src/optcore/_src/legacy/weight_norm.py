"""flax.optim's WeightNorm: optimise each matrix as a direction and a scale."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from optcore._src.definitions.base import OptimizerDef
from optcore._src.ground.declarations import Nested, ParamShaped
from optcore._src.ground.hyper_params import HyperParams

PyTree = Any


class WeightNormParamState(NamedTuple):
  """flax.optim's WeightNorm state of one parameter: the wrapped optimizer's states of the direction
  and the scale, and their last values.
  """

  direction_state: Nested
  scale_state: Nested
  direction: ParamShaped
  scale: ParamShaped


def _splits(param: Any) -> bool:
  """Leaves with more elements than their last axis are split (matrices and up)."""
  return param.size > param.shape[-1] if param.ndim else False


def _norm(x: jax.Array, eps: Any) -> jax.Array:
  return jnp.sqrt(jnp.sum(jnp.square(x), axis=tuple(range(x.ndim - 1)), keepdims=True) + eps)


def _merge(direction: jax.Array, scale: jax.Array, eps: Any) -> jax.Array:
  # flax.optim's operation order, bitwise: direction * (scale * rsqrt(sum d^2 + eps)).
  sq_norm = jnp.sum(jnp.square(direction), axis=tuple(range(direction.ndim - 1)), keepdims=True)
  return direction * (scale * lax.rsqrt(sq_norm + eps))


class WeightNorm(OptimizerDef):
  """flax.optim's WeightNorm around a per-parameter definition.

  A leaf with ``size > shape[-1]`` is kept as a direction and a scale of
  shape ``(1, ..., n)``, initialised to ``sqrt(sum w^2 + eps)`` over all but
  the last axis; the parameter is ``scale * direction / |direction|``. The
  gradient reaches both through a VJP, ``wn_decay * direction`` is added to
  the direction's, and the wrapped definition updates each. Other leaves are
  passed to the wrapped definition as they are.

  Args:
    wrapped_optimizer: a per-parameter definition (the flax.optim algorithms).
    wn_decay: decay of the direction.
    wn_eps: the norm's epsilon.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.WeightNorm(legacy.Momentum(0.1)).create({'w': jnp.ones((2, 3))})
    >>> sorted(opt.state_dict()['state']['param_states']['w'])
    ['direction', 'direction_state', 'scale', 'scale_state']
    >>> opt.state.param_states['w'].scale.shape
    (1, 3)
  """

  def __init__(self, wrapped_optimizer: OptimizerDef, wn_decay: float = 0, wn_eps: float = 1e-8):
    if type(wrapped_optimizer).init_param_state is OptimizerDef.init_param_state:
      raise TypeError(
        f"WeightNorm wraps per-parameter definitions (the flax.optim algorithms, such as "
        f"optcore.legacy.Momentum); {wrapped_optimizer!r} has no init_param_state."
      )
    super().__init__(
      HyperParams(inner=wrapped_optimizer.hyper_params, wn_decay=wn_decay, wn_eps=wn_eps)
    )
    self.wrapped_optimizer = wrapped_optimizer

  def extra_arg_names(self) -> frozenset[str] | None:
    return self.wrapped_optimizer.extra_arg_names()

  def children(self) -> tuple[OptimizerDef, ...]:
    return (self.wrapped_optimizer,)

  def with_children(self, children: tuple[OptimizerDef, ...]) -> OptimizerDef:
    (inner,) = children
    new = self._renewed()
    new.wrapped_optimizer = inner
    new.hyper_params = self.hyper_params.replace(inner=inner.hyper_params)
    return new

  def overridable_names(self) -> frozenset[str]:
    return self.wrapped_optimizer.overridable_names() | {"wn_decay", "wn_eps"}

  def update_hyper_params(self, **overrides: Any) -> HyperParams:
    hp = overrides.pop("hyper_params", self.hyper_params)
    mine = {k: overrides.pop(k) for k in ("wn_decay", "wn_eps") if k in overrides}
    inner = self.wrapped_optimizer.update_hyper_params(hyper_params=hp.inner, **overrides)
    return hp.replace(inner=inner, **mine)

  def init_param_state(self, param):
    inner = self.wrapped_optimizer
    if _splits(param):
      scale = _norm(param, self.hyper_params.wn_eps)
      direction = param / scale
      return WeightNormParamState(
        inner.init_param_state(direction), inner.init_param_state(scale), direction, scale
      )
    return WeightNormParamState(inner.init_param_state(param), (), param, ())

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    inner, inner_hp = self.wrapped_optimizer, hyper_params.inner
    if not _splits(param):
      new_param, new_state = inner.apply_param_gradient(
        step, inner_hp, param, state.direction_state, grad
      )
      return new_param, WeightNormParamState(new_state, (), new_param, ())
    eps = hyper_params.wn_eps
    _, vjp = jax.vjp(lambda d, s: _merge(d, s, eps), state.direction, state.scale)
    direction_grad, scale_grad = vjp(grad)
    direction_grad = direction_grad + hyper_params.wn_decay * state.direction
    direction, direction_state = inner.apply_param_gradient(
      step, inner_hp, state.direction, state.direction_state, direction_grad
    )
    scale, scale_state = inner.apply_param_gradient(
      step, inner_hp, state.scale, state.scale_state, scale_grad
    )
    new_param = _merge(direction, scale, eps)  # no cast: flax.optim returned it as computed
    return new_param, WeightNormParamState(direction_state, scale_state, direction, scale)

  def derive_param_state_axes(self, param, param_axes, state):
    """The direction keeps the parameter's axes, the scale its last axis only."""
    inner = self.wrapped_optimizer
    if not _splits(param):
      inner_axes = inner.derive_param_state_axes(param, param_axes, state.direction_state)
      return WeightNormParamState(inner_axes, (), param_axes, ())
    scale_axes = PartitionSpec(*(None,) * (len(param_axes) - 1), param_axes[-1])
    return WeightNormParamState(
      inner.derive_param_state_axes(state.direction, param_axes, state.direction_state),
      inner.derive_param_state_axes(state.scale, scale_axes, state.scale_state),
      param_axes,
      scale_axes,
    )

  def _static_key(self) -> tuple:
    return (type(self), self.hyper_params, self.wrapped_optimizer)
