"""`accumulate`: a definition applied every ``every`` steps to the mean gradient (one wrapper
of the wrapper protocol, `optcore._src.definitions.wrapper`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.core import Tracer

from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import REQUIRED, StateWrapper, floating_dtype
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_float_params
from optcore._src.ground.declarations import Nested, ParamShaped, Replicated
from optcore._src.ground.state import OptimizerState
from optcore._src.persistence.serialization import StateDictError

PyTree = Any


class AccumulateState(NamedTuple):
  """The state of `accumulate`.

  Attributes:
    inner: the wrapped definition's ``param_states``.
    accumulated: the mean of the gradients since the last update, in the
      parameters' structure (in ``dtype``, float32 by default).
    mini_step: int32, the gradients accumulated since the last update (0 to
      ``every - 1``).
  """

  inner: Nested
  accumulated: ParamShaped
  mini_step: Replicated


class Accumulate(StateWrapper):
  """``optimizer_def`` applied every ``every`` steps to the mean gradient: see `accumulate`."""

  name = "accumulate"
  state_type = AccumulateState
  changes: ClassVar = MappingProxyType(
    {"per_parameter_state": False, "elementwise": False, "steps_every_call": False}
  )
  config_arguments: ClassVar = MappingProxyType({"every": REQUIRED, "dtype": jnp.float32})

  @a.declare(every=a.COUNT)  # the gradients averaged per update
  def __init__(self, optimizer_def: OptimizerDef, every: int, dtype: Any = jnp.float32):
    self.dtype = floating_dtype("accumulate", "dtype", dtype)
    super().__init__(optimizer_def)
    if optimizer_def.per_example_gradients:
      raise TypeError(
        f"accumulate({optimizer_def.display_name()}) is not possible: it takes per-example "
        "gradients (a leading axis of examples) and clips and noises each step's examples "
        "itself, so a mean of gradients over steps is not its input. Give it more examples per "
        "step instead."
      )
    self.every = int(every)

  twice_hint = "accumulate once, with every= the product of both"

  def check_state_values(self, state: OptimizerState, where: str = "state/param_states") -> None:
    """A ``mini_step`` of ``every`` or more was written by a longer window: continuing would
    drop the gradients it holds (a state of every=4 at mini_step 3 read into every=2)."""
    mini_step = state.param_states.mini_step
    if not isinstance(mini_step, Tracer) and not 0 <= int(mini_step) < self.every:
      raise StateDictError(
        f"at '{where}/mini_step': expected a count below every={self.every} for "
        f"{self!r}, found {int(mini_step)}: the state was written by an accumulation of a "
        f"longer window, whose gradients this one would drop. Restore it into an accumulate of "
        f"every={int(mini_step) + 1} or more (as the one that wrote it), or save it at the end "
        "of a window (mini_step 0)."
      )
    super().check_state_values(state, where)

  def _dtype_for(self, param: Any) -> Any:
    """The accumulator's dtype for ``param``: ``dtype``, complex for a complex parameter (its
    gradients' imaginary parts are kept at that precision)."""
    if jnp.iscomplexobj(param):
      return jnp.promote_types(self.dtype, jnp.complex64)
    return self.dtype

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    inner = self.optimizer_def.init_state(params)
    accumulated = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), self._dtype_for(p)), params)
    state = AccumulateState(inner.param_states, accumulated, jnp.zeros((), jnp.int32))
    return OptimizerState(inner.step, state)

  def apply_gradient(
    self, hyper_params: Any, params: PyTree, state: OptimizerState, grads: PyTree, **extra_args: Any
  ) -> tuple[PyTree, OptimizerState]:
    """Adds ``grads`` to the running mean; every ``every``-th call applies the
    wrapped definition to the mean (with this call's ``hyper_params``) and
    starts a new mean. The other calls return ``params`` as they are."""
    if self.optimizer_def.gives_optax_updates:
      updates, new_state = self.compute_updates(hyper_params, params, state, grads, **extra_args)
      return optax.apply_updates(params, updates), new_state
    accumulated, mean, emit = self._mean(state, grads)
    inner = OptimizerState(state.step, state.param_states.inner)
    new_params, new_inner = self.optimizer_def.apply_gradient(
      hyper_params, params, inner, mean, **extra_args
    )
    new_state = self._next(state, new_inner, accumulated, emit)
    return jax.tree.map(_keep(emit), new_params, params), new_state

  def compute_updates(
    self,
    hyper_params: Any,
    params: PyTree | None,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    """``(updates, new_state)``: for a wrapped optax definition optax's own
    updates on the applying call and zeros on the others, as MultiSteps gives
    them (so `as_optax` is exact); else ``new_params - params``."""
    if not self.optimizer_def.gives_optax_updates:
      return super().compute_updates(hyper_params, params, state, grads, **extra_args)
    accumulated, mean, emit = self._mean(state, grads)
    inner = OptimizerState(state.step, state.param_states.inner)
    updates, new_inner = self.optimizer_def.compute_updates(
      hyper_params, params, inner, mean, **extra_args
    )
    # MultiSteps' own product (a select rounds the step after it differently).
    updates = jax.tree.map(lambda u: emit * u, updates)
    return updates, self._next(state, new_inner, accumulated, emit)

  def _mean(self, state: OptimizerState, grads: PyTree) -> tuple[PyTree, PyTree, jax.Array]:
    """The running mean with ``grads`` in (in the accumulator's dtype), the
    same in the gradients' dtypes for the wrapped update, and whether this
    call applies it.

    As MultiSteps does, the wrapped update is computed on every call and kept
    on the applying one: under ``lax.cond`` XLA compiles the branch apart from
    the rest of the step, and its rounding then differs from MultiSteps'."""
    acc = state.param_states
    n = acc.mini_step
    treedef = jax.tree.structure(grads)
    # optax.MultiSteps' running mean, to the bit: acc + (g - acc) / (n + 1).
    pairs = zip(treedef.flatten_up_to(acc.accumulated), jax.tree.leaves(grads), strict=True)
    # In the accumulator's own dtype, whatever the gradients' (a bfloat16 accumulator turned
    # float32 after one float32 gradient, and lax.fori_loop refused the changed carry).
    accumulated = treedef.unflatten([(a + (g - a) / (n + 1)).astype(a.dtype) for a, g in pairs])
    mean = jax.tree.map(lambda a, g: a.astype(jnp.result_type(g)), accumulated, grads)
    return accumulated, mean, n == self.every - 1

  def _next(
    self,
    state: OptimizerState,
    new_inner: OptimizerState,
    accumulated: PyTree,
    emit: jax.Array,
  ) -> OptimizerState:
    """The state after this call: the wrapped state advanced if it applied,
    the mean started over if it applied."""
    acc = state.param_states
    inner = jax.tree.map(_keep(emit), new_inner, OptimizerState(state.step, acc.inner))
    accumulated = jax.tree.map(lambda a: jnp.where(emit, jnp.zeros_like(a), a), accumulated)
    new_acc = AccumulateState(inner.param_states, accumulated, (acc.mini_step + 1) % self.every)
    return OptimizerState(inner.step, new_acc)


def _keep(emit: jax.Array):
  """new where ``emit``, else old, in old's dtype."""
  return lambda new, old: jnp.where(emit, new, old).astype(jnp.result_type(old))


def accumulate(optimizer_def: OptimizerDef, every: int, *, dtype: Any = jnp.float32) -> Accumulate:
  """Gradient accumulation: ``optimizer_def`` applied to the mean of every ``every`` gradients.

  Each ``apply_gradient(grads)`` adds ``grads`` to a running mean; every
  ``every``-th call applies ``optimizer_def`` to the mean and starts over,
  and only then do the parameters change (the other calls return them as
  they are, and the wrapped definition's step does not advance). The numbers
  are ``optax.MultiSteps(tx, every_k_schedule=every)``'s, bit for bit, and
  one step on the mean gradient up to rounding. As in MultiSteps, the wrapped
  update is computed on every call and kept on the applying one (an optax
  definition's updates are multiplied by 0 or 1, as MultiSteps does, so a
  non-finite update on a non-applying call reaches the parameters there too).

  Hyper-parameter overrides reach ``optimizer_def``; the applied update uses
  the values passed to the applying (``every``-th) call, and the others'
  are checked and unused. ``state.step`` counts applied updates (a schedule
  advances once per update); ``state.param_states.mini_step`` counts the
  gradients in the current mean.

  The accumulator is one parameter-shaped buffer, sharded like the
  parameters (split over ``state_axis``, placed by ``state_memory_kind``),
  and in state dicts and checkpoints: a checkpoint taken mid-accumulation
  resumes exactly.

  Args:
    optimizer_def: the definition to apply (any optax, legacy or
      `MultiOptimizer` definition, or `mixed_precision` of one).
    every: the number of gradients averaged per update, a positive int.
    dtype: the accumulator's dtype (float32 by default, as MultiSteps').

  Returns:
    An `Accumulate` definition.

  Raises:
    ValueError: ``every`` is not a positive int.
    TypeError: ``optimizer_def`` is not a definition, is grouped or is
      accumulated already; ``dtype`` is not a real floating dtype.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.accumulate(optcore.sgd(0.1), every=2).create({'w': jnp.zeros(2)})
    >>> step = jax.jit(lambda opt, g: opt.apply_gradient(g))
    >>> opt = step(opt, {'w': jnp.array([1.0, 2.0])})
    >>> opt.target['w'], int(opt.state.step)  # accumulated, not applied
    (Array([0., 0.], dtype=float32), 0)
    >>> opt = step(opt, {'w': jnp.array([3.0, 4.0])})
    >>> opt.target['w'], int(opt.state.step)  # one step on the mean [2, 3]
    (Array([-0.2, -0.3], dtype=float32), 1)
  """
  return Accumulate(optimizer_def, every, dtype)
