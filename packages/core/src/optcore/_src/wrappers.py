"""Definition wrappers: gradient accumulation, mixed-precision state, an EMA of the parameters.

Each takes a definition and returns one (optax's combinator idea, at the
definition level), so every face runs it as it runs any definition:
hyper-parameter overrides pass through to the wrapped definition, and the
wrapper's own state (the accumulator, the master copy) is parameter-shaped,
so it gets the parameter's logical axes, ZeRO-1's ``state_axis`` split, host
placement and a place in state dicts like any other state leaf.

The wrapped definition's state is kept whole in the ``inner`` field of the
wrapper's state, and both share the `OptimizerState`'s ``step``: the number
of updates applied to the parameters.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from optcore._src import paths, placement
from optcore._src.base import OptimizerDef
from optcore._src.checks import check_float_params
from optcore._src.hyper_params import HyperParams
from optcore._src.optax_wrapper import OptaxWrapper
from optcore._src.optimizer import OptimizerState
from optcore._src.serialization import StateDictError

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

  inner: PyTree
  accumulated: PyTree
  mini_step: jax.Array


class MixedPrecisionState(NamedTuple):
  """The state of `mixed_precision`.

  Attributes:
    inner: the wrapped definition's ``param_states``, every floating leaf in
      ``state_dtype``.
    master: in the parameters' structure, the ``master_dtype`` copy of each
      parameter narrower than ``master_dtype``; None for the others.
  """

  inner: PyTree
  master: PyTree


class EmaState(NamedTuple):
  """The state of `ema`.

  Attributes:
    inner: the wrapped definition's ``param_states``.
    ema: the moving average, in the parameters' structure.
    count: int32, the updates averaged so far.
  """

  inner: PyTree
  ema: PyTree
  count: jax.Array


# A wrapper's state: the wrapped definition's state in ``inner``, and fields of its own (the
# accumulator, the master copies, the average) whose dtype the wrapper declares.
WRAPPER_STATES = (AccumulateState, MixedPrecisionState, EmaState)


def map_optimizer_leaves(fn: Any, tree: PyTree, *rest: PyTree) -> PyTree:
  """``fn`` over the leaves of ``tree`` (and the same leaves of ``rest``) that an algorithm
  keeps, leaving a wrapper's own fields as they are: `mixed_precision`'s ``state_dtype`` is the
  moments' dtype, never an `accumulate` mean's or an `ema` average's (a bfloat16 average of
  decay 0.999 never moved)."""

  def visit(node: Any, *others: Any) -> Any:
    if isinstance(node, WRAPPER_STATES):
      return node._replace(inner=map_optimizer_leaves(fn, node.inner, *(o.inner for o in others)))
    return fn(node, *others)

  return jax.tree.map(visit, tree, *rest, is_leaf=lambda n: isinstance(n, WRAPPER_STATES))


def _wrapped_chain(optimizer_def: OptimizerDef) -> list[OptimizerDef]:
  """``optimizer_def`` and every definition it wraps, however deep (``ema(accumulate(ema(
  ...)))`` has two EMAs), the groups of a MultiOptimizer included."""
  chain, todo = [], [optimizer_def]
  while todo:
    current = todo.pop()
    chain.append(current)
    if isinstance(current, _Wrapper):
      todo.append(current.optimizer_def)
    todo.extend(getattr(current, "sub_optimizers", ()))
  return chain


class _Wrapper(OptimizerDef):
  """What the wrappers share: the wrapped definition's hyper-parameters and
  overrides, its state kept whole in ``inner``, and refusals that name both."""

  name = ""
  #: The flags (`OptimizerDef.FLAGS`) this wrapper sets itself; every other one is the wrapped
  #: definition's. Its state is its own NamedTuple around the wrapped one, never per parameter,
  #: and it is not grouped (its own state follows the parameters' layout).
  changes: ClassVar[Mapping[str, Any]] = MappingProxyType(
    {"per_parameter_state": False, "elementwise": False}
  )

  def __init__(self, optimizer_def: OptimizerDef):
    if not isinstance(optimizer_def, OptimizerDef):
      raise TypeError(
        f"{self.name} takes an optimizer definition (optcore.adam(1e-3), "
        f"optcore.legacy.Adam(...)); got {optimizer_def!r}. For an optax transformation, "
        f"wrap it first: optcore.OptaxWrapper(tx)"
      )
    if optimizer_def.groups_parameters:
      raise TypeError(
        f"{self.name}({optimizer_def.display_name()}) is not possible: grouped keeps the "
        f"parameters in buffers of its own layout, and {self.name}'s state follows the "
        f"parameters' layout. Wrap the ungrouped definition: "
        f"{self.name}({getattr(optimizer_def, 'optimizer_def', optimizer_def)!r}, ...)."
      )
    if any(isinstance(d, type(self)) for d in _wrapped_chain(optimizer_def)):
      raise TypeError(
        f"{self.name}({optimizer_def.display_name()}) wraps {self.name} twice; {self._twice_hint()}"
      )
    super().__init__(HyperParams())
    self.hyper_params = optimizer_def.hyper_params  # a MultiOptimizer's is a list
    self.optimizer_def = optimizer_def
    for flag in OptimizerDef.FLAGS:
      setattr(self, flag, self.changes.get(flag, getattr(optimizer_def, flag)))

  def _twice_hint(self) -> str:
    return "wrap it once"

  def display_name(self) -> str:
    return f"{self.name}({self.optimizer_def.display_name()})"

  def overridable_names(self) -> frozenset[str]:
    return self.optimizer_def.overridable_names()

  def update_hyper_params(self, **hyper_param_overrides: Any) -> Any:
    return self.optimizer_def.update_hyper_params(**hyper_param_overrides)

  def why_not_elementwise(self) -> str | None:
    return f"{self.display_name()} keeps its own parameter-shaped state: it is not grouped"

  def _inner_state(self, state: OptimizerState) -> OptimizerState:
    return OptimizerState(state.step, state.param_states.inner)

  def ema_params(self, state: OptimizerState) -> PyTree:
    return self.optimizer_def.ema_params(self._inner_state(state))

  def keeps_ema(self) -> bool:
    return self.optimizer_def.keeps_ema()

  def check_state_values(self, state: OptimizerState) -> None:
    self.optimizer_def.check_state_values(self._inner_state(state))

  def with_param_logical_axes(self, param_logical_axes: PyTree) -> OptimizerDef:
    inner = self.optimizer_def.with_param_logical_axes(param_logical_axes)
    if inner is self.optimizer_def:
      return self
    bound = copy.copy(self)
    bound.__dict__.pop("_key_cache", None)
    bound.optimizer_def = inner
    bound.hyper_params = inner.hyper_params
    return bound


class Accumulate(_Wrapper):
  """``optimizer_def`` applied every ``every`` steps to the mean gradient: see `accumulate`."""

  name = "accumulate"

  def __init__(self, optimizer_def: OptimizerDef, every: int, dtype: Any = jnp.float32):
    if not isinstance(every, (int, np.integer)) or isinstance(every, bool) or every < 1:
      raise ValueError(
        f"accumulate: every must be a positive int (the gradients averaged per update), "
        f"got every={every!r}"
      )
    self.dtype = _floating_dtype("accumulate", "dtype", dtype)
    super().__init__(optimizer_def)
    if optimizer_def.per_example_gradients:
      raise TypeError(
        f"accumulate({optimizer_def.display_name()}) is not possible: it takes per-example "
        "gradients (a leading axis of examples) and clips and noises each step's examples "
        "itself, so a mean of gradients over steps is not its input. Give it more examples per "
        "step instead."
      )
    self.every = int(every)

  def _twice_hint(self) -> str:
    return "accumulate once, with every= the product of both"

  def check_state_values(self, state: OptimizerState) -> None:
    """A ``mini_step`` of ``every`` or more was written by a longer window: continuing would
    drop the gradients it holds (a state of every=4 at mini_step 3 read into every=2)."""
    mini_step = state.param_states.mini_step
    if not isinstance(mini_step, jax.core.Tracer) and not 0 <= int(mini_step) < self.every:
      raise StateDictError(
        f"at 'state/param_states/mini_step': expected a count below every={self.every} for "
        f"{self!r}, found {int(mini_step)}: the state was written by an accumulation of a "
        f"longer window, whose gradients this one would drop. Restore it into an accumulate of "
        f"every={int(mini_step) + 1} or more (as the one that wrote it), or save it at the end "
        "of a window (mini_step 0)."
      )
    super().check_state_values(state)

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
    self,
    hyper_params: Any,
    params: PyTree,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    """Adds ``grads`` to the running mean; every ``every``-th call applies the
    wrapped definition to the mean (with this call's ``hyper_params``) and
    starts a new mean. The other calls return ``params`` as they are."""
    if isinstance(self.optimizer_def, OptaxWrapper):
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
    if not isinstance(self.optimizer_def, OptaxWrapper):
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

  def derive_param_states_axes(self, param_states: Any, params: PyTree, params_axes: PyTree):
    inner = self.optimizer_def.derive_param_states_axes(param_states.inner, params, params_axes)
    return AccumulateState(inner, params_axes, PartitionSpec())

  def _static_key(self) -> tuple:
    return (type(self), self.optimizer_def, self.every, self.dtype)

  def __repr__(self) -> str:
    dtype = "" if self.dtype == jnp.float32 else f", dtype={jnp.dtype(self.dtype).name}"
    return f"accumulate({self.optimizer_def!r}, every={self.every}{dtype})"


class MixedPrecision(_Wrapper):
  """``optimizer_def`` with its state in ``state_dtype`` and master copies: see
  `mixed_precision`."""

  name = "mixed_precision"

  def __init__(
    self,
    optimizer_def: OptimizerDef,
    state_dtype: Any = None,
    master_dtype: Any = None,
  ):
    if state_dtype is None and master_dtype is None:
      raise ValueError(
        "mixed_precision needs state_dtype= (e.g. jnp.bfloat16, the dtype every floating "
        "state leaf is stored in), master_dtype= (e.g. jnp.float32, the dtype of the master "
        "copy of lower-precision parameters), or both"
      )
    self.state_dtype = _optional_floating("state_dtype", state_dtype)
    self.master_dtype = _optional_floating("master_dtype", master_dtype)
    super().__init__(optimizer_def)

  def _has_master(self, param: Any) -> bool:
    dtype = jnp.result_type(param)
    return (
      self.master_dtype is not None
      and jnp.issubdtype(dtype, jnp.floating)
      and jnp.finfo(dtype).bits < jnp.finfo(self.master_dtype).bits
    )

  def _check_master(self, params: PyTree) -> None:
    if self.master_dtype is None:
      return
    for names, leaf in paths.leaves_with_names(params)[0]:
      dtype = jnp.result_type(leaf)
      if jnp.issubdtype(dtype, jnp.floating) and (
        jnp.finfo(dtype).bits > jnp.finfo(self.master_dtype).bits
      ):
        raise ValueError(
          f"mixed_precision: master_dtype={jnp.dtype(self.master_dtype).name} is narrower than "
          f"the parameter at {'/' + '/'.join(names)!r} ({jnp.dtype(dtype).name}); a master copy "
          "holds the parameter at a higher precision. Pass master_dtype=jnp.float32 (or the "
          "widest parameter dtype), or None for no master copy."
        )

  def _working(self, params: PyTree, master: PyTree) -> PyTree:
    """The parameters the wrapped definition updates: each master copy, or the parameter."""
    treedef = jax.tree.structure(params)
    pairs = zip(jax.tree.leaves(params), treedef.flatten_up_to(master), strict=True)
    return treedef.unflatten([p if m is None else m for p, m in pairs])

  def _store(self, param_states: PyTree) -> PyTree:
    if self.state_dtype is None:
      return param_states
    return map_optimizer_leaves(
      lambda x: x.astype(self.state_dtype) if _is_real_float(x) else x, param_states
    )

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    self._check_master(params)
    master = jax.tree.map(
      lambda p: jnp.asarray(p, self.master_dtype) if self._has_master(p) else None, params
    )
    inner = self.optimizer_def.init_state(self._working(params, master))
    return OptimizerState(inner.step, MixedPrecisionState(self._store(inner.param_states), master))

  def apply_gradient(
    self,
    hyper_params: Any,
    params: PyTree,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    """One step of the wrapped definition on the master copies, its state read
    in the dtypes its own ``init_state`` gives (up-cast) and stored in
    ``state_dtype`` (down-cast); the new parameters are the new master copies
    rounded to each parameter's dtype."""
    mixed = state.param_states
    working = self._working(params, mixed.master)
    # The dtypes the wrapped definition computes in: those its own init gives.
    natural = jax.eval_shape(self.optimizer_def.init_state, working).param_states
    read = map_optimizer_leaves(
      lambda x, n: x.astype(n.dtype) if _is_real_float(x) else x, mixed.inner, natural
    )
    grads = jax.tree.map(lambda g, w: jnp.asarray(g).astype(jnp.result_type(w)), grads, working)
    new_working, new_inner = self.optimizer_def.apply_gradient(
      hyper_params, working, OptimizerState(state.step, read), grads, **extra_args
    )
    treedef = jax.tree.structure(params)
    new_params, new_master = [], []
    for p, m, w in zip(
      jax.tree.leaves(params),
      treedef.flatten_up_to(mixed.master),
      treedef.flatten_up_to(new_working),
      strict=True,
    ):
      new_params.append(jnp.asarray(w).astype(jnp.result_type(p)))
      new_master.append(None if m is None else jnp.asarray(w).astype(m.dtype))
    new_state = MixedPrecisionState(
      self._store(new_inner.param_states), treedef.unflatten(new_master)
    )
    return treedef.unflatten(new_params), OptimizerState(new_inner.step, new_state)

  def derive_param_states_axes(self, param_states: Any, params: PyTree, params_axes: PyTree):
    inner = self.optimizer_def.derive_param_states_axes(param_states.inner, params, params_axes)
    treedef = jax.tree.structure(params)
    master = treedef.unflatten(
      [
        None if m is None else spec
        for m, spec in zip(
          treedef.flatten_up_to(param_states.master),
          treedef.flatten_up_to(params_axes),
          strict=True,
        )
      ]
    )
    return MixedPrecisionState(inner, master)

  def _static_key(self) -> tuple:
    return (type(self), self.optimizer_def, self.state_dtype, self.master_dtype)

  def __repr__(self) -> str:
    parts = [repr(self.optimizer_def)]
    for name in ("state_dtype", "master_dtype"):
      value = getattr(self, name)
      if value is not None:
        parts.append(f"{name}=jnp.{jnp.dtype(value).name}")
    return f"mixed_precision({', '.join(parts)})"


class Ema(_Wrapper):
  """``optimizer_def`` with a moving average of the parameters: see `ema`."""

  name = "ema"

  def __init__(
    self, optimizer_def: OptimizerDef, decay: float = 0.999, debias: bool = False, dtype: Any = None
  ):
    if not isinstance(decay, (int, float)) or isinstance(decay, bool) or not 0 <= decay < 1:
      raise ValueError(f"ema: decay must be a float in [0, 1), got decay={decay!r}")
    if not isinstance(debias, bool):
      raise TypeError(f"ema: debias must be True or False, got debias={debias!r}")
    self.dtype = None if dtype is None else _floating_dtype("ema", "dtype", dtype)
    super().__init__(optimizer_def)
    self.decay = float(decay)
    self.debias = debias

  def _twice_hint(self) -> str:
    return "keep one average (a second decay needs its own optimizer)"

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    inner = self.optimizer_def.init_state(params)
    dtype = lambda p: self.dtype or jnp.result_type(p)
    if self.debias:  # optax.ema's start: zeros, divided by 1 - decay**count when read
      average = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), dtype(p)), params)
    else:
      average = jax.tree.map(lambda p: jnp.asarray(p, dtype(p)), params)
    return OptimizerState(
      inner.step, EmaState(inner.param_states, average, jnp.zeros((), jnp.int32))
    )

  def apply_gradient(
    self,
    hyper_params: Any,
    params: PyTree,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    """One step of the wrapped definition, then ``ema = decay * ema + (1 -
    decay) * new_params``."""
    new_params, new_inner = self.optimizer_def.apply_gradient(
      hyper_params, params, self._inner_state(state), grads, **extra_args
    )
    average = state.param_states.ema
    treedef = jax.tree.structure(new_params)
    pairs = zip(treedef.flatten_up_to(average), jax.tree.leaves(new_params), strict=True)
    decay = self.decay
    average = treedef.unflatten([decay * e + (1 - decay) * p.astype(e.dtype) for e, p in pairs])
    new_state = EmaState(new_inner.param_states, average, state.param_states.count + 1)
    return new_params, OptimizerState(new_inner.step, new_state)

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

  def derive_param_states_axes(self, param_states: Any, params: PyTree, params_axes: PyTree):
    inner = self.optimizer_def.derive_param_states_axes(param_states.inner, params, params_axes)
    return EmaState(inner, params_axes, PartitionSpec())

  def _static_key(self) -> tuple:
    return (type(self), self.optimizer_def, self.decay, self.debias, self.dtype)

  def __repr__(self) -> str:
    extra = ", debias=True" if self.debias else ""
    if self.dtype is not None:
      extra += f", dtype=jnp.{jnp.dtype(self.dtype).name}"
    return f"ema({self.optimizer_def!r}, decay={self.decay}{extra})"


def _keep(emit: jax.Array):
  """new where ``emit``, else old, in old's dtype."""
  return lambda new, old: jnp.where(emit, new, old).astype(jnp.result_type(old))


def _is_real_float(x: Any) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _floating_dtype(where: str, name: str, dtype: Any) -> Any:
  try:
    resolved = jnp.dtype(dtype)
  except TypeError:
    resolved = None
  if resolved is None or not jnp.issubdtype(resolved, jnp.floating):
    raise TypeError(
      f"{where}: {name} must be a real floating dtype (jnp.float32, jnp.bfloat16, ...); "
      f"got {name}={dtype!r}"
    )
  if resolved.itemsize == 8 and not jax.config.jax_enable_x64:
    raise TypeError(
      f"{where}: {name}={resolved.name} needs 64-bit JAX, which is off: every array would be "
      f"made float32 instead, silently. Turn it on first (jax.config.update('jax_enable_x64', "
      f"True)), or pass {name}=jnp.float32."
    )
  return resolved.type


def _optional_floating(name: str, dtype: Any) -> Any:
  return None if dtype is None else _floating_dtype("mixed_precision", name, dtype)


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


def mixed_precision(
  optimizer_def: OptimizerDef, *, state_dtype: Any = None, master_dtype: Any = None
) -> MixedPrecision:
  """Low-precision optimizer state, and float32 master weights for low-precision parameters.

  ``state_dtype`` (e.g. ``jnp.bfloat16``) stores every real floating leaf of
  ``optimizer_def``'s state in that dtype, whichever optimizer it is (optax
  offers ``mu_dtype`` for a few): each step reads the state back in the
  dtypes ``optimizer_def`` itself would keep (float32 for float32
  parameters), computes, and rounds the new state down to ``state_dtype``.
  Integer counters and complex leaves are kept as they are.

  ``master_dtype`` (e.g. ``jnp.float32``) keeps a copy of each parameter
  narrower than it (bfloat16, float16) in that dtype inside the optimizer
  state; the step updates the copy and hands back the parameter rounded from
  it, so small updates accumulate instead of being rounded away. The copy is
  sharded like its parameter and split over ``state_axis``. It is the
  copy, not the parameter passed in, that the next step starts from.

  Args:
    optimizer_def: the definition to run (any optax, legacy or
      `MultiOptimizer` definition).
    state_dtype: the dtype the state is stored in, or None to keep the
      wrapped definition's own.
    master_dtype: the dtype of the master copies, or None for none.

  Returns:
    A `MixedPrecision` definition.

  Raises:
    TypeError: a dtype is not a real floating dtype (integers and complex
      are refused, naming the argument); ``optimizer_def`` is not a
      definition, is grouped, or is mixed-precision already.
    ValueError: neither dtype is given; at ``init_state``/``create``, a
      parameter is wider than ``master_dtype`` (named by its path).

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt_def = optcore.mixed_precision(
    ...     optcore.adam(1e-3), state_dtype=jnp.bfloat16, master_dtype=jnp.float32)
    >>> opt = opt_def.create({'w': jnp.ones(2, jnp.bfloat16)})
    >>> opt.state.param_states.inner[0].mu['w'].dtype, opt.state.param_states.master['w'].dtype
    (dtype(bfloat16), dtype('float32'))
    >>> opt = opt.apply_gradient({'w': jnp.ones(2, jnp.bfloat16)})
    >>> opt.target['w'].dtype, opt.state.param_states.master['w'][0]
    (dtype(bfloat16), Array(0.999, dtype=float32))
  """
  return MixedPrecision(optimizer_def, state_dtype, master_dtype)


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
