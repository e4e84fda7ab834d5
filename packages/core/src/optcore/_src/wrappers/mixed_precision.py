"""`mixed_precision`: a definition with its state in a lower precision and master copies of
low-precision parameters (one wrapper of the wrapper protocol,
`optcore._src.definitions.wrapper`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import (
  StateWrapper,
  floating_dtype,
  init_in_one_program,
  map_optimizer_leaves,
)
from optcore._src.ground import paths
from optcore._src.ground.checks import check_float_params
from optcore._src.ground.declarations import Nested, ParamShaped
from optcore._src.ground.state import OptimizerState

PyTree = Any


class MixedPrecisionState(NamedTuple):
  """The state of `mixed_precision`.

  Attributes:
    inner: the wrapped definition's ``param_states``, every floating leaf in
      ``state_dtype``.
    master: in the parameters' structure, the ``master_dtype`` copy of each
      parameter narrower than ``master_dtype``; None for the others.
  """

  inner: Nested
  master: ParamShaped


class MixedPrecision(StateWrapper):
  """``optimizer_def`` with its state in ``state_dtype`` and master copies: see
  `mixed_precision`."""

  name = "mixed_precision"
  state_type = MixedPrecisionState
  config_arguments: ClassVar = MappingProxyType({"state_dtype": None, "master_dtype": None})

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
    """The wrapped definition's state made and stored in ``state_dtype`` in one compiled
    program (`init_in_one_program`): its float32 state is never held whole."""
    check_float_params(params)
    self._check_master(params)

    def init(params: PyTree) -> OptimizerState:
      master = jax.tree.map(
        lambda p: jnp.asarray(p, self.master_dtype) if self._has_master(p) else None, params
      )
      inner = self.optimizer_def.init_state(self._working(params, master))
      own = MixedPrecisionState(self._store(inner.param_states), master)
      return OptimizerState(inner.step, own)

    return init_in_one_program(init, params)

  def apply_gradient(
    self, hyper_params: Any, params: PyTree, state: OptimizerState, grads: PyTree, **extra_args: Any
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


def _is_real_float(x: Any) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _optional_floating(name: str, dtype: Any) -> Any:
  return None if dtype is None else floating_dtype("mixed_precision", name, dtype)


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
