"""flax.optim's algorithms (v0.5.3) with their original numerics and state.

Each is a per-parameter `OptimizerDef` with flax.optim's name, arguments,
defaults and state field names, so checkpoints written by flax.optim restore
and tuned hyper-parameters mean what they meant. ``step`` counts the updates
before this one; ``t = step + 1`` is computed in the parameter's dtype.
Numeric hyper-parameters may be overridden at apply time, traced or not;
flags that shape the state (RMSProp's ``centered``) are read from the
constructor, and ``nesterov`` is a Python bool.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax.core import Tracer

from optcore._src.definitions.base import OptimizerDef
from optcore._src.ground.declarations import FirstMoment, SecondMoment
from optcore._src.ground.hyper_params import HyperParams

PyTree = Any


class MomentumParamState(NamedTuple):
  """flax.optim's Momentum and LARS state of one parameter: the velocity."""

  momentum: FirstMoment


class AdamParamState(NamedTuple):
  """flax.optim's Adam, AdaBelief and LAMB state of one parameter: the first and second moments."""

  grad_ema: FirstMoment
  grad_sq_ema: SecondMoment


class AdagradParamState(NamedTuple):
  """flax.optim's Adagrad state of one parameter: the sum of squared gradients."""

  G: SecondMoment


class RMSPropParamState(NamedTuple):
  """flax.optim's RMSProp state of one parameter: the mean square, and the mean gradient when
  centered (else None).
  """

  v: SecondMoment
  mg: FirstMoment  # None unless centered


class AdadeltaParamState(NamedTuple):
  """flax.optim's Adadelta state of one parameter: running squares of gradients and updates."""

  sq_avg: SecondMoment
  acc_delta: SecondMoment


def _bias_correction(beta: Any, step: jax.Array, dtype: Any) -> jax.Array:
  """``1 - beta**(step + 1)`` in ``dtype`` (float64 is float32 unless x64 is on,
  as JAX truncated it for flax.optim, here without the warning).

  An eager step asks for it once per parameter with the same ``step``: it is
  computed once per (step, beta, dtype) there (jit dedupes it by itself).
  """
  dtype = jax.dtypes.canonicalize_dtype(dtype)
  if isinstance(step, Tracer) or not isinstance(beta, (int, float)):
    return 1 - beta ** jnp.asarray(step + 1, dtype)
  key = (id(step), beta, jnp.dtype(dtype).str)
  hit = _EAGER_CORRECTIONS.get(key)
  if hit is None or hit[0] is not step:  # ids are reused once an array is gone
    if len(_EAGER_CORRECTIONS) > 64:
      _EAGER_CORRECTIONS.clear()
    hit = _EAGER_CORRECTIONS[key] = (step, 1 - beta ** jnp.asarray(step + 1, dtype))
  return hit[1]


_EAGER_CORRECTIONS: dict[tuple, tuple[Any, jax.Array]] = {}


def _ema(beta: Any, old: jax.Array, new: jax.Array) -> jax.Array:
  return beta * old + (1 - beta) * new


def _debiased(hp: HyperParams, step: jax.Array, param: jax.Array, state: Any):
  """Adam's bias-corrected moments from a state with grad_ema and grad_sq_ema."""
  return (
    state.grad_ema / _bias_correction(hp.beta1, step, param.dtype),
    state.grad_sq_ema / _bias_correction(hp.beta2, step, param.dtype),
  )


def _adam_update(hp: HyperParams, param: jax.Array, ema: jax.Array, sq_ema: jax.Array):
  """``p - lr m/(sqrt(v)+eps) - lr wd p``: flax.optim's Adam-style step, decay on the old p."""
  new_param = param - hp.learning_rate * ema / (jnp.sqrt(sq_ema) + hp.eps)
  return new_param - hp.learning_rate * hp.weight_decay * param


class _FlaxOptimDef(OptimizerDef):
  """A flax.optim algorithm whose per-parameter state is `param_state`, each field zeros of
  the parameter's shape and dtype (None: no state), as flax.optim initialised them."""

  param_state: ClassVar[type | None] = None
  learning_rates = ("learning_rate",)

  def init_param_state(self, param):
    if self.param_state is None:
      return ()
    return self.param_state(*(jnp.zeros_like(param) for _ in self.param_state._fields))


class _ElementwiseDef(_FlaxOptimDef):
  """One whose step has no per-parameter reduction: `grouped` may run it on a buffer."""

  elementwise = True


class GradientDescent(_ElementwiseDef):
  """flax.optim's gradient descent: ``p <- p - lr g``; no state.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.GradientDescent(0.5).create({'w': jnp.ones(2)})
    >>> opt.apply_gradient({'w': jnp.ones(2)}).target['w']
    Array([0.5, 0.5], dtype=float32)
  """

  def __init__(self, learning_rate: float | None = None):
    super().__init__(HyperParams.of_arguments(locals()))

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    del step
    return param - hyper_params.learning_rate * grad, state


class Momentum(_ElementwiseDef):
  """flax.optim's momentum: ``g <- g + wd p; m <- beta m + g``; the step is
  ``g + beta m`` with nesterov, else ``m``; ``p <- p - lr step``.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.Momentum(0.1, beta=0.9).create({'w': jnp.ones(2)})
    >>> opt = opt.apply_gradient({'w': jnp.ones(2)}).apply_gradient({'w': jnp.ones(2)})
    >>> opt.target['w'], opt.state.param_states['w'].momentum
    (Array([0.71, 0.71], dtype=float32), Array([1.9, 1.9], dtype=float32))
  """

  weight_decays = ("weight_decay",)

  param_state = MomentumParamState

  def __init__(
    self,
    learning_rate: float | None = None,
    beta: float = 0.9,
    weight_decay: float = 0,
    nesterov: bool = False,
  ):
    super().__init__(HyperParams.of_arguments(locals()))

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    del step
    grad = grad + hyper_params.weight_decay * param
    momentum = hyper_params.beta * state.momentum + grad
    direction = grad + hyper_params.beta * momentum if hyper_params.nesterov else momentum
    return param - hyper_params.learning_rate * direction, MomentumParamState(momentum)


class Adam(_ElementwiseDef):
  """flax.optim's Adam, whose weight decay is scaled by the learning rate and
  applied to the old parameters: ``p <- p - lr m^/(sqrt(v^)+eps) - lr wd p``.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.Adam(0.1, weight_decay=0.5).create({'w': jnp.ones(1)})
    >>> round(float(opt.apply_gradient({'w': jnp.ones(1)}).target['w'][0]), 5)
    0.85
  """

  weight_decays = ("weight_decay",)

  param_state = AdamParamState

  def __init__(
    self,
    learning_rate: float | None = None,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
  ):
    super().__init__(HyperParams.of_arguments(locals()))

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    hp = hyper_params
    state = AdamParamState(
      _ema(hp.beta1, state.grad_ema, grad), _ema(hp.beta2, state.grad_sq_ema, jnp.square(grad))
    )
    return _adam_update(hp, param, *_debiased(hp, step, param, state)), state


class AdaBelief(_ElementwiseDef):
  """flax.optim's AdaBelief: ``s <- b2 s + (1-b2)(g - m)^2 + eps`` (eps stored
  in the state), then Adam's step with ``sqrt(s^) + eps``; weight decay as Adam's.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.AdaBelief(0.1).create({'w': jnp.ones(1)})
    >>> sorted(opt.state_dict()['state']['param_states']['w'])
    ['grad_ema', 'grad_sq_ema']
  """

  weight_decays = ("weight_decay",)

  param_state = AdamParamState

  def __init__(
    self,
    learning_rate: float | None = None,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-16,
    weight_decay: float = 0.0,
  ):
    super().__init__(HyperParams.of_arguments(locals()))

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    hp = hyper_params
    grad_ema = _ema(hp.beta1, state.grad_ema, grad)
    grad_sq_ema = _ema(hp.beta2, state.grad_sq_ema, jnp.square(grad - grad_ema)) + hp.eps
    state = AdamParamState(grad_ema, grad_sq_ema)
    return _adam_update(hp, param, *_debiased(hp, step, param, state)), state


class Adadelta(_ElementwiseDef):
  """flax.optim's Adadelta: ``a <- rho a + (1-rho) g^2``,
  ``d = sqrt(x + eps)/sqrt(a + eps) g``, ``x <- rho x + (1-rho) d^2``,
  ``p <- p - lr d - lr wd p``.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.Adadelta(1.0).create({'w': jnp.ones(1)})
    >>> sorted(opt.state_dict()['state']['param_states']['w'])
    ['acc_delta', 'sq_avg']
  """

  weight_decays = ("weight_decay",)

  param_state = AdadeltaParamState

  def __init__(
    self,
    learning_rate: float | None = None,
    rho: float = 0.9,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
  ):
    super().__init__(HyperParams.of_arguments(locals()))

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    del step
    hp = hyper_params
    sq_avg = _ema(hp.rho, state.sq_avg, jnp.square(grad))
    delta = jnp.sqrt(state.acc_delta + hp.eps) / jnp.sqrt(sq_avg + hp.eps) * grad
    acc_delta = _ema(hp.rho, state.acc_delta, jnp.square(delta))
    new_param = param - hp.learning_rate * delta
    new_param = new_param - hp.learning_rate * hp.weight_decay * param
    return new_param, AdadeltaParamState(sq_avg, acc_delta)


class Adagrad(_ElementwiseDef):
  """flax.optim's Adagrad: ``G <- G + g^2; p <- p - lr g/(sqrt(G) + eps)``.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.Adagrad(0.1).create({'w': jnp.ones(1)})
    >>> opt.apply_gradient({'w': 2 * jnp.ones(1)}).state.param_states['w'].G
    Array([4.], dtype=float32)
  """

  param_state = AdagradParamState

  def __init__(self, learning_rate: float | None = None, eps: float = 1e-8):
    super().__init__(HyperParams.of_arguments(locals()))

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    del step
    G = state.G + jnp.square(grad)
    new_param = param - hyper_params.learning_rate * grad / (jnp.sqrt(G) + hyper_params.eps)
    return new_param, AdagradParamState(G)


class RMSProp(_ElementwiseDef):
  """flax.optim's RMSProp: ``v <- b2 v + (1-b2) g^2``; centered also tracks
  ``mg`` and uses ``v - mg^2``; ``p <- p - lr g/(sqrt(v) + eps)``; no momentum.
  ``centered`` is read from the constructor (an override warns, changing nothing).

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.RMSProp(0.1).create({'w': jnp.ones(1)})
    >>> opt.state.param_states['w'].mg is None
    True
  """

  param_state = RMSPropParamState

  def __init__(
    self,
    learning_rate: float | None = None,
    beta2: float = 0.9,
    eps: float = 1e-8,
    centered: bool = False,
  ):
    super().__init__(HyperParams.of_arguments(locals()))

  constructor_only = ("centered",)

  def init_param_state(self, param):
    mg = jnp.zeros_like(param) if self.hyper_params.centered else None
    return RMSPropParamState(jnp.zeros_like(param), mg)

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    del step
    hp = hyper_params
    v = _ema(hp.beta2, state.v, jnp.square(grad))
    if self.hyper_params.centered:  # the state's layout: the constructor decides
      mg = _ema(hp.beta2, state.mg, grad)
      variance = v - jnp.square(mg)
    else:
      mg, variance = state.mg, v
    new_param = param - hp.learning_rate * grad / (jnp.sqrt(variance) + hp.eps)
    return new_param, RMSPropParamState(v, mg)


class LAMB(_FlaxOptimDef):
  """flax.optim's LAMB: ``u = m^/(sqrt(v^)+eps) + wd p``, ``p <- p - lr r u``
  with the trust ratio ``r = |p|/|u|`` (1 when both are 0; zero params stay).

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.LAMB(0.1).create({'w': jnp.zeros(2), 'v': jnp.ones(2)})
    >>> opt = opt.apply_gradient({'w': jnp.ones(2), 'v': jnp.ones(2)})
    >>> opt.target['w'], opt.target['v'].round(4)
    (Array([0., 0.], dtype=float32), Array([0.9, 0.9], dtype=float32))
  """

  weight_decays = ("weight_decay",)

  param_state = AdamParamState

  def __init__(
    self,
    learning_rate: float | None = None,
    beta1: float = 0.9,
    beta2: float = 0.999,
    weight_decay: float = 0,
    eps: float = 1e-6,
  ):
    super().__init__(HyperParams.of_arguments(locals()))

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    hp = hyper_params
    state = AdamParamState(
      _ema(hp.beta1, state.grad_ema, grad), _ema(hp.beta2, state.grad_sq_ema, jnp.square(grad))
    )
    ema, sq_ema = _debiased(hp, step, param, state)
    update = ema / (jnp.sqrt(sq_ema) + hp.eps) + hp.weight_decay * param
    param_norm = jnp.linalg.norm(param)
    update_norm = jnp.linalg.norm(update)
    trust_ratio = jnp.where(param_norm + update_norm > 0.0, param_norm / update_norm, 1.0)
    return param - trust_ratio * hp.learning_rate * update, state


class LARS(_FlaxOptimDef):
  """flax.optim's LARS, whose momentum buffer holds the learning rate:
  ``r = tc |p|/(|g| + wd |p| + eps)`` (1 when ``|g|`` or ``|p|`` is 0),
  ``m <- beta m + lr r (g + wd p)``, ``p <- p - m`` (nesterov:
  ``p <- p - (lr r (g + wd p) + beta m)``).

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import legacy
    >>> opt = legacy.LARS(0.1).create({'w': jnp.ones(1)})
    >>> opt.apply_gradient({'w': jnp.ones(1)}).state.param_states['w'].momentum
    Array([0.0001], dtype=float32)
  """

  weight_decays = ("weight_decay",)

  param_state = MomentumParamState

  def __init__(
    self,
    learning_rate: float | None = None,
    beta: float = 0.9,
    weight_decay: float = 0,
    trust_coefficient: float = 0.001,
    eps: float = 0,
    nesterov: bool = False,
  ):
    super().__init__(HyperParams.of_arguments(locals()))

  def apply_param_gradient(self, step, hyper_params, param, state, grad):
    del step
    hp = hyper_params
    param_norm = jnp.linalg.norm(param)
    grad_norm = jnp.linalg.norm(grad)
    trust_ratio = (
      hp.trust_coefficient * param_norm / (grad_norm + hp.weight_decay * param_norm + hp.eps)
    )
    trust_ratio = jnp.where((grad_norm == 0.0) | (param_norm == 0.0), 1.0, trust_ratio)
    scaled_grad = hp.learning_rate * trust_ratio * (grad + hp.weight_decay * param)
    momentum = hp.beta * state.momentum + scaled_grad
    direction = scaled_grad + hp.beta * momentum if hp.nesterov else momentum
    return param - direction, MomentumParamState(momentum)
