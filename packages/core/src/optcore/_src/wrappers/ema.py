"""`ema`: an exponential moving average of the parameters, kept in the optimizer state (one
wrapper of the wrapper protocol, `optcore._src.definitions.wrapper`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import StateWrapper, floating_dtype
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_float_params
from optcore._src.ground.declarations import Count, Nested, ParamShaped
from optcore._src.ground.state import OptimizerState
from optcore._src.persistence import placement

PyTree = Any


class EmaState(NamedTuple):
  """The state of `ema`.

  Attributes:
    inner: the wrapped definition's ``param_states``.
    ema: the moving average, in the parameters' structure.
    count: int32, the updates averaged so far.
  """

  inner: Nested
  ema: ParamShaped
  count: Count


class Ema(StateWrapper):
  """``optimizer_def`` with a moving average of the parameters: see `ema`."""

  name = "ema"
  state_type = EmaState
  config_arguments: ClassVar = MappingProxyType({"decay": 0.999, "debias": False, "dtype": None})
  repr_shows = ("decay",)

  @a.declare(decay=a.DECAY, debias=a.Flag())
  def __init__(
    self, optimizer_def: OptimizerDef, decay: float = 0.999, debias: bool = False, dtype: Any = None
  ):
    self.dtype = None if dtype is None else floating_dtype("ema", "dtype", dtype)
    super().__init__(optimizer_def)
    self.decay = float(decay)
    self.debias = debias

  twice_hint = "keep one average (a second decay needs its own optimizer)"

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    inner = self.optimizer_def.init_state(params)
    dtype = lambda p: self.dtype or jnp.result_type(p)
    if self.debias:  # optax.ema's start: zeros, divided by 1 - decay**count when read
      average = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), dtype(p)), params)
    else:
      # A copy, never the parameter's own buffer: a step that donates the optimizer (target
      # and state) donates each buffer once.
      average = jax.tree.map(lambda p: jnp.array(p, dtype(p), copy=True), params)
    return OptimizerState(
      inner.step, EmaState(inner.param_states, average, jnp.zeros((), jnp.int32))
    )

  def apply_gradient(
    self, hyper_params: Any, params: PyTree, state: OptimizerState, grads: PyTree, **extra_args: Any
  ) -> tuple[PyTree, OptimizerState]:
    """One step of the wrapped definition, then ``ema = decay * ema + (1 -
    decay) * new_params``."""
    new_params, new_inner = self.optimizer_def.apply_gradient(
      hyper_params, params, self._inner_state(state), grads, **extra_args
    )
    return new_params, self._averaged(state, new_inner, new_params)

  def compute_updates(
    self, hyper_params: Any, params: PyTree, state: OptimizerState, grads: PyTree, **extra_args: Any
  ) -> tuple[PyTree, OptimizerState]:
    """The wrapped definition's own updates (as ``as_optax()`` hands them to optax), the
    average of ``params + updates``: for an optax definition the parameters `apply_gradient`
    gives, bit for bit, so every face averages the same numbers."""
    updates, new_inner = self.optimizer_def.compute_updates(
      hyper_params, params, self._inner_state(state), grads, **extra_args
    )
    new_params = optax.apply_updates(params, updates)
    return updates, self._averaged(state, new_inner, new_params)

  def _averaged(
    self, state: OptimizerState, new_inner: OptimizerState, new_params: PyTree
  ) -> OptimizerState:
    """``ema = decay * ema + (1 - decay) * new_params``, beside the wrapped state."""
    average = state.param_states.ema
    treedef = jax.tree.structure(new_params)
    pairs = zip(treedef.flatten_up_to(average), jax.tree.leaves(new_params), strict=True)
    decay = self.decay
    average = treedef.unflatten([decay * e + (1 - decay) * p.astype(e.dtype) for e, p in pairs])
    new_state = EmaState(new_inner.param_states, average, state.param_states.count + 1)
    return OptimizerState(new_inner.step, new_state)

  def keeps_ema(self) -> bool:
    return True

  def ema_params(self, state: OptimizerState) -> PyTree:
    """The moving average of the parameters (with ``debias``, divided by ``1 -
    decay**count``; before the first update, the zeros it starts from)."""
    average, count = state.param_states.ema, state.param_states.count
    # Where the parameters are: an average kept in host memory (state_memory_kind) comes back
    # on the device, so the first matmul with it does not fail inside JAX.
    average, _ = placement.to_device(average)
    if not self.debias:
      return average
    correction = 1 - jnp.asarray(self.decay, jnp.float32) ** count
    return jax.tree.map(lambda e: jnp.where(count > 0, e / correction.astype(e.dtype), e), average)


def ema(
  optimizer_def: OptimizerDef, decay: float = 0.999, *, debias: bool = False, dtype: Any = None
) -> Ema:
  """An exponential moving average of the parameters, kept in the optimizer state.

  After each update of ``optimizer_def``, ``ema = decay * ema + (1 - decay) *
  new_params``, in the order and dtypes a hand-written loop computes it (the
  tests hold it to one bitwise). The average starts from the parameters, or
  with ``debias`` from zeros, read divided by ``1 - decay**count`` (optax's
  ``ema`` correction). It is parameter-shaped: sharded like the parameters,
  split under ``state_axis``, placed by ``state_memory_kind``, and in state
  dicts and checkpoints.

  Read it with ``optimizer.ema_params`` (the core and Flax faces),
  ``opt.ema_params(model)`` (Equinox), ``optimizer.ema_params`` (Treex), or
  ``opt_def.ema_params(opt_state)`` (a state from ``as_optax()``, e.g. a
  TrainState's ``opt_state``). Under `accumulate` (``accumulate(ema(...))``)
  it averages the applied updates only; ``ema(accumulate(...))`` counts
  every call.

  Args:
    optimizer_def: the definition whose parameters are averaged.
    decay: the weight of the old average, in [0, 1).
    debias: start from zeros and correct the bias, as optax's ``ema`` does.
    dtype: the average's dtype; None keeps each parameter's (pass
      ``jnp.float32`` to average bfloat16 parameters in float32).

  Returns:
    An `Ema` definition.

  Raises:
    ValueError: ``decay`` is not in [0, 1).
    TypeError: ``debias`` is not a bool, ``dtype`` is not a real floating
      dtype, or ``optimizer_def`` is not a definition, is grouped or has an
      EMA already.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.ema(optcore.sgd(1.0), decay=0.5).create({'w': jnp.zeros(1)})
    >>> opt = opt.apply_gradient({'w': jnp.ones(1)})   # w: -1, ema: 0.5 * 0 + 0.5 * -1
    >>> opt = opt.apply_gradient({'w': jnp.ones(1)})   # w: -2, ema: 0.5 * -0.5 + 0.5 * -2
    >>> opt.target['w'], opt.ema_params['w']
    (Array([-2.], dtype=float32), Array([-1.25], dtype=float32))
  """
  return Ema(optimizer_def, decay, debias, dtype)
