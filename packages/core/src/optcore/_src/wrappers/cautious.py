"""`cautious`: the cautious mask of Liang et al. (arXiv 2411.16085) over any definition: each
update's components that point against the gradient are dropped and the rest rescaled (one
wrapper of the wrapper protocol, `optcore._src.definitions.wrapper`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optcore._src.definitions import rates
from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import StateWrapper
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_float_params
from optcore._src.ground.declarations import Nested
from optcore._src.ground.state import OptimizerState

PyTree = Any

#: The rescalings of the kept components: ``'mean'`` divides by the kept fraction (at least
#: 1e-3), the authors' AdamW; ``'sum_plus_one'`` multiplies by ``size / (kept + 1)``, their Lion.
NORMALIZATIONS = ("mean", "sum_plus_one")


class CautiousState(NamedTuple):
  """The state of `cautious`.

  Attributes:
    inner: the wrapped definition's ``param_states`` (the mask keeps nothing of its own).
  """

  inner: Nested


def cautious_mask(updates: PyTree, grads: PyTree, normalization: str = "mean") -> PyTree:
  """``updates`` with each component whose direction disagrees with the gradient's set to
  zero, the rest rescaled per leaf.

  An optax update points down the gradient (``-lr * direction``), so a component is kept
  where ``update * grad < 0`` strictly, i.e. where the optimizer's direction and the
  gradient agree in sign. The kept components are divided by ``max(mean(mask), 1e-3)``
  (``'mean'``) or multiplied by ``size / (sum(mask) + 1)`` (``'sum_plus_one'``).

  Args:
    updates: the updates, optax's sign.
    grads: the gradients, in the updates' structure.
    normalization: ``'mean'`` or ``'sum_plus_one'``.

  Returns:
    The masked updates.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore._src.wrappers.cautious import cautious_mask
    >>> cautious_mask({'w': jnp.array([-1.0, 1.0])}, {'w': jnp.array([1.0, 1.0])})['w']
    Array([-2.,  0.], dtype=float32)
  """

  def one(u: jax.Array, g: jax.Array) -> jax.Array:
    mask = (u * g < 0).astype(u.dtype)
    if normalization == "mean":
      return u * (mask / jnp.maximum(jnp.mean(mask), 1e-3).astype(u.dtype))
    return u * (mask * (mask.size / (jnp.sum(mask) + 1)).astype(u.dtype))

  return jax.tree.map(one, updates, grads)


def _no_decay(kind: str, value: Any) -> Any:
  """A weight decay set to zero (a literal zero kept: the step has no decay to take out)."""
  if kind != rates.WEIGHT_DECAY or (isinstance(value, (int, float)) and value == 0):
    return value
  return 0.0


class Cautious(StateWrapper):
  """``optimizer_def``'s step with the cautious mask: see `cautious`."""

  ungrouped_because = (
    "rescales each parameter's masked step by its kept fraction, a mean over the whole parameter"
  )

  name = "cautious"
  state_type = CautiousState
  config_arguments: ClassVar = MappingProxyType({"normalization": "mean"})

  @a.declare(
    normalization=a.OneOf(NORMALIZATIONS, "'mean': the authors' AdamW, 'sum_plus_one': their Lion")
  )
  def __init__(self, optimizer_def: OptimizerDef, normalization: str = "mean"):
    self.normalization = normalization
    super().__init__(optimizer_def)

  twice_hint = "mask once (a second mask keeps the same components)"

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    inner = self.optimizer_def.init_state(params)
    return OptimizerState(inner.step, CautiousState(inner.param_states))

  def compute_updates(self, hyper_params, params, state, grads, **extra_args):
    """The wrapped step's updates, masked. Where the wrapped step adds weight decay (a
    hyper-parameter declared one where its definition is defined:
    `OptimizerDef.weight_decay_names`), the step without it is masked and the decay added after,
    as the authors' AdamW and Lion decay every component: ``masked(step without decay) + (step -
    step without decay)``. Both are one program's: at 1M parameters an adamw step reads and
    writes as much with decay as without (68 MB; 40 unmasked), the second step adding arithmetic
    only."""
    inner = self._inner_state(state)
    updates, new_inner = self.optimizer_def.compute_updates(
      hyper_params, params, inner, grads, **extra_args
    )
    bare, decays = rates.replace_rates(self.optimizer_def, hyper_params, _no_decay)
    if decays:
      direction, _ = self.optimizer_def.compute_updates(bare, params, inner, grads, **extra_args)
      masked = cautious_mask(direction, grads, self.normalization)
      updates = jax.tree.map(lambda m, u, d: m + (u - d), masked, updates, direction)
    else:
      updates = cautious_mask(updates, grads, self.normalization)
    return updates, OptimizerState(new_inner.step, CautiousState(new_inner.param_states))

  def apply_gradient(self, hyper_params, params, state, grads, **extra_args):
    updates, new_state = self.compute_updates(hyper_params, params, state, grads, **extra_args)
    return optax.apply_updates(params, updates), new_state


def cautious(optimizer_def: OptimizerDef, normalization: str = "mean") -> Cautious:
  """The cautious optimizer of Liang et al. (arXiv 2411.16085): ``optimizer_def``'s step,
  keeping per parameter only the components whose direction agrees in sign with the
  gradient, rescaled so the step keeps its size.

  For each leaf, with ``u`` the wrapped step's update (without its decoupled weight decay) and
  ``g`` the gradient: ``mask = (u * g < 0)`` (strictly: optax's updates point down the gradient),
  then ``u * mask / max(mean(mask), 1e-3)`` (``'mean'``, the authors' C-AdamW) or ``u * mask *
  size / (sum(mask) + 1)`` (``'sum_plus_one'``, their C-Lion). Weight decay is never masked: a
  wrapped step that adds decoupled decay itself (optax's ``adamw``, ``lion``, T5X's Adafactor:
  every argument declared a weight decay, in a ``chain``'s members, a group or ``schedule_free``'s
  base too) is masked without it and the decay added after, as the authors' code decays every
  parameter.

  The numbers are those of github.com/kyleliang919/C-Optim: ``cautious(optcore.adamw(lr,
  b1, b2, eps, weight_decay=wd))`` is their ``c_adamw.AdamW`` up to the place of ``eps``
  (theirs is added before bias correction, as Hugging Face's AdamW; optax's after), and
  ``cautious(optcore.lion(lr, b1, b2, weight_decay=wd), 'sum_plus_one')`` is their
  ``c_lion.Lion``. The state is the wrapped definition's, under ``inner``.

  Args:
    optimizer_def: the definition to mask (optax, legacy, contrib or a `MultiOptimizer`).
    normalization: ``'mean'`` or ``'sum_plus_one'``.

  Returns:
    A `Cautious` definition.

  Raises:
    ValueError: an unknown ``normalization``.
    TypeError: ``optimizer_def`` is not a definition, is grouped or is cautious already.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.cautious(optcore.sgd(0.1, momentum=0.9)).create({'w': jnp.zeros(2)})
    >>> opt = opt.apply_gradient({'w': jnp.array([1.0, -1.0])})
    >>> opt = opt.apply_gradient({'w': jnp.array([1.0, 0.5])})  # momentum -0.4 against 0.5
    >>> opt.target['w']
    Array([-0.48,  0.1 ], dtype=float32)
  """
  return Cautious(optimizer_def, normalization)
