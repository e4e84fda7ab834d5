"""Independent float64 NumPy implementations of the legacy algorithms, written
from flax.optim v0.5.3's and T5X's definitions (../shared/REFERENCE.md).

Each ``*_step(p, s, g, t, **hp)`` takes one parameter, its state (a dict), its
gradient and ``t = step + 1``, and returns the new parameter and state.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np


def norm(x):
  return np.sqrt(np.sum(np.square(x)))


def sgd_step(p, s, g, t, lr):
  return p - lr * g, s


def momentum_step(p, s, g, t, lr, beta=0.9, weight_decay=0.0, nesterov=False):
  g = g + weight_decay * p
  m = beta * s["momentum"] + g
  d = g + beta * m if nesterov else m
  return p - lr * d, {"momentum": m}


def adam_step(p, s, g, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
  m = beta1 * s["grad_ema"] + (1 - beta1) * g
  v = beta2 * s["grad_sq_ema"] + (1 - beta2) * g * g
  m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
  new = p - lr * m_hat / (np.sqrt(v_hat) + eps) - lr * weight_decay * p
  return new, {"grad_ema": m, "grad_sq_ema": v}


def adabelief_step(p, s, g, t, lr, beta1=0.9, beta2=0.999, eps=1e-16, weight_decay=0.0):
  m = beta1 * s["grad_ema"] + (1 - beta1) * g
  v = beta2 * s["grad_sq_ema"] + (1 - beta2) * (g - m) ** 2 + eps
  m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
  new = p - lr * m_hat / (np.sqrt(v_hat) + eps) - lr * weight_decay * p
  return new, {"grad_ema": m, "grad_sq_ema": v}


def adadelta_step(p, s, g, t, lr, rho=0.9, eps=1e-6, weight_decay=0.0):
  sq = rho * s["sq_avg"] + (1 - rho) * g * g
  delta = np.sqrt(s["acc_delta"] + eps) / np.sqrt(sq + eps) * g
  acc = rho * s["acc_delta"] + (1 - rho) * delta * delta
  return p - lr * delta - lr * weight_decay * p, {"sq_avg": sq, "acc_delta": acc}


def adagrad_step(p, s, g, t, lr, eps=1e-8):
  G = s["G"] + g * g
  return p - lr * g / (np.sqrt(G) + eps), {"G": G}


def rmsprop_step(p, s, g, t, lr, beta2=0.9, eps=1e-8, centered=False):
  v = beta2 * s["v"] + (1 - beta2) * g * g
  if centered:
    mg = beta2 * s["mg"] + (1 - beta2) * g
    return p - lr * g / (np.sqrt(v - mg * mg) + eps), {"v": v, "mg": mg}
  return p - lr * g / (np.sqrt(v) + eps), {"v": v, "mg": None}


def lamb_step(p, s, g, t, lr, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-6):
  m = beta1 * s["grad_ema"] + (1 - beta1) * g
  v = beta2 * s["grad_sq_ema"] + (1 - beta2) * g * g
  u = (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps) + weight_decay * p
  pn, un = norm(p), norm(u)
  trust = pn / un if pn + un > 0 else 1.0
  return p - trust * lr * u, {"grad_ema": m, "grad_sq_ema": v}


def lars_step(
  p, s, g, t, lr, beta=0.9, weight_decay=0.0, trust_coefficient=0.001, eps=0.0, nesterov=False
):
  pn, gn = norm(p), norm(g)
  trust = 1.0 if pn == 0 or gn == 0 else trust_coefficient * pn / (gn + weight_decay * pn + eps)
  scaled = lr * trust * (g + weight_decay * p)
  m = beta * s["momentum"] + scaled
  d = scaled + beta * m if nesterov else m
  return p - d, {"momentum": m}


def adafactor_init(p, rows=(), cols=(), beta1=None):
  """The state for roles: ``rows``/``cols`` dims (both empty: unfactored)."""
  unused = np.zeros(1)
  if rows and cols:
    keep = lambda drop: [n for d, n in enumerate(p.shape) if d not in drop]
    s = {"v_row": np.zeros(keep(cols)), "v_col": np.zeros(keep(rows)), "v": unused}
  else:
    s = {"v_row": unused, "v_col": unused, "v": np.zeros(p.shape)}
  s["m"] = unused if beta1 is None else np.zeros(p.shape)
  return s


def heuristic_roles(shape, min_dim_size_to_factor=128, factored=True):
  """flax.optim's and optax's rule: the largest dim is the column, the second the row."""
  if not factored or len(shape) < 2:
    return (), ()
  order = sorted(range(len(shape)), key=lambda d: (shape[d], d))
  if shape[order[-2]] < min_dim_size_to_factor:
    return (), ()
  return (order[-2],), (order[-1],)


def adafactor_step(
  p,
  s,
  g,
  t,
  lr,
  rows=(),
  cols=(),
  batch=(),
  multiply_by_parameter_scale=True,
  beta1=None,
  decay_rate=0.8,
  step_offset=0,
  clipping_threshold=1.0,
  weight_decay_rate=None,
  epsilon1=1e-30,
  epsilon2=1e-3,
  momentum_dtype=None,
  max_parameter_scale=None,
  weight_decay_rate_lr_exponent=None,
):
  """One Adafactor step for one parameter; ``t`` is step + 1."""
  non_batch = tuple(d for d in range(p.ndim) if d not in batch)
  step = t - 1
  decay = 1 - (max(step - step_offset, 0) + 1) ** (-decay_rate)
  scale = lr
  if multiply_by_parameter_scale:
    param_scale = np.maximum(np.sqrt(np.mean(p * p, axis=non_batch, keepdims=True)), epsilon2)
    if max_parameter_scale is not None:
      param_scale = np.minimum(param_scale, max_parameter_scale)
    scale = lr * param_scale
  g2 = g * g + epsilon1
  new = dict(s)
  if rows and cols:
    v_row = decay * s["v_row"] + (1 - decay) * np.mean(g2, axis=cols)
    v_col = decay * s["v_col"] + (1 - decay) * np.mean(g2, axis=rows)
    vr, vc = np.expand_dims(v_row, cols), np.expand_dims(v_col, rows)
    y = g * (vr / np.mean(vr, axis=rows, keepdims=True)) ** -0.5 * vc**-0.5
    new.update(v_row=v_row, v_col=v_col, v=np.zeros(1))
  else:
    v = decay * s["v"] + (1 - decay) * g2
    y = g / np.sqrt(v)
    new.update(v=v, v_row=np.zeros(1), v_col=np.zeros(1))
  if clipping_threshold is not None:
    rms = np.sqrt(np.mean(y * y, axis=non_batch, keepdims=True))
    y = y / np.maximum(1.0, rms / clipping_threshold)
  sub = scale * y
  if beta1 is not None:
    sub = beta1 * s["m"] + (1 - beta1) * sub
    stored = sub
    if momentum_dtype is not None:  # stored rounded to the momentum dtype
      stored = sub.astype(momentum_dtype).astype(np.float64)
    new["m"] = stored
  wd = weight_decay_rate
  if weight_decay_rate_lr_exponent is not None:
    wd = (1.0 if wd is None else wd) * lr**weight_decay_rate_lr_exponent
  p = (1 - wd) * p - sub if wd is not None else p - sub
  return p, new


BFLOAT16 = ml_dtypes.bfloat16
