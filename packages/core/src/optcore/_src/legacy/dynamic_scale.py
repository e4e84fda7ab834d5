"""flax.optim's DynamicScale (v0.5.3): loss scaling for low-precision training."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


class DynamicScaleResult(NamedTuple):
  dynamic_scale: DynamicScale
  finite: jax.Array
  aux: Any
  grad: Any


@dataclasses.dataclass(frozen=True)
class DynamicScale:
  """Scales the loss up before differentiating and the gradient back down,
  adjusting the scale as gradients stay finite or overflow (flax v0.5.3).

  When the gradients are finite, ``fin_steps`` counts up and, once it equals
  ``growth_interval`` (checked before counting), the scale grows by
  ``growth_factor`` and ``fin_steps`` restarts at 0; when they are not, the
  scale shrinks by ``backoff_factor`` and ``fin_steps`` restarts at 0.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore.legacy import DynamicScale
    >>> grad_fn = DynamicScale(scale=2.0**10).value_and_grad(lambda w: jnp.sum(w ** 2))
    >>> dyn_scale, is_finite, loss, grad = grad_fn(jnp.ones(2))
    >>> bool(is_finite), float(loss), grad, int(dyn_scale.fin_steps)
    (True, 2.0, Array([2., 2.], dtype=float32), 1)
  """

  growth_factor: float = 2.0
  backoff_factor: float = 0.5
  growth_interval: int = 2000
  fin_steps: Any = 0
  scale: Any = 65536.0

  def replace(self, **changes: Any) -> DynamicScale:
    return dataclasses.replace(self, **changes)

  def value_and_grad(
    self,
    fun: Callable[..., Any],
    argnums: int | tuple[int, ...] = 0,
    has_aux: bool = False,
    axis_name: str | None = None,
  ) -> Callable[..., DynamicScaleResult]:
    """``fun``'s value and gradient, computed on the scaled loss.

    Returns a function giving ``(new_dynamic_scale, finite, aux, grad)``,
    where ``aux`` is ``fun``'s output (the loss, or ``(loss, aux)`` with
    ``has_aux``) computed as ``(scale * loss) / scale`` in the loss's dtype,
    and ``grad`` is float32. Gradients are averaged over ``axis_name`` under
    pmap, after the division (flax v0.5.3's order, bitwise).
    """

    def scaled(*args):
      out = fun(*args)
      if has_aux:
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
          raise TypeError(
            "DynamicScale.value_and_grad(fun, has_aux=True) requires fun to return a pair "
            f"(loss, aux), but it returned {_describe_output(out)}. Return (loss, aux) from "
            "fun, or pass has_aux=False."
          )
        return self.scale * out[0], out[1]
      return self.scale * out, None

    grad_fn = jax.value_and_grad(scaled, argnums=argnums, has_aux=True)

    def wrapped(*args) -> DynamicScaleResult:
      (scaled_value, aux), grad = grad_fn(*args)
      # flax.optim's order: the value divided back in the loss's dtype (an
      # overflowing float16 loss comes back inf or nan), the gradients cast to
      # float32 before the division, and averaged after it.
      value = scaled_value / self.scale
      out = (value, aux) if has_aux else value
      grad = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32) / self.scale, grad)
      if axis_name is not None:
        grad = lax.pmean(grad, axis_name)
      finite = jnp.asarray(True)
      for g in jax.tree.leaves(grad):
        finite = finite & jnp.all(lax.is_finite(g))
      grow = self.fin_steps == self.growth_interval
      grown = jnp.where(grow & finite, self.scale * self.growth_factor, self.scale)
      new_scale = jnp.where(finite, grown, self.scale * self.backoff_factor)
      new_fin_steps = jnp.where(grow | ~finite, 0, self.fin_steps + 1)
      return DynamicScaleResult(
        self.replace(fin_steps=new_fin_steps, scale=new_scale), finite, out, grad
      )

    return wrapped


def _describe_output(out: Any) -> str:
  if isinstance(out, (tuple, list)):
    return f"a {type(out).__name__} of length {len(out)}"
  shape = getattr(out, "shape", None)
  return f"an array of shape {tuple(shape)}" if shape is not None else f"a {type(out).__name__}"


jax.tree_util.register_dataclass(
  DynamicScale,
  data_fields=["fin_steps", "scale"],
  meta_fields=["growth_factor", "backoff_factor", "growth_interval"],
)
