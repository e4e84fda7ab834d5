"""`low_bit_state`: a definition whose state is stored block-wise quantized at 8 or 4 bits
between steps (one wrapper of the wrapper protocol, `optcore._src.definitions.wrapper`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec

from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import (
  StateWrapper,
  init_in_one_program,
  map_optimizer_leaves_with_path,
)
from optcore._src.ground import arguments as a
from optcore._src.ground import declarations, paths
from optcore._src.ground.checks import check_regex
from optcore._src.ground.declarations import Nested, Role, UndeclaredStateError
from optcore._src.ground.state import OptimizerState
from optcore._src.ground.user_warnings import warn
from optcore._src.persistence.quantization import (
  QuantizedArray,
  check_block_size,
  check_rounding,
  dequantize_tree,
  is_quantized,
  requantize_like,
)

PyTree = Any

#: Deprecated: which fields are moments is declared on each state type
#: (`optcore.FirstMoment`, `optcore.SecondMoment`; `optcore.declared_fields`), never read from
#: a name. This is the set of names that optax's and optcore's states declare second moments
#: under, kept for programs that imported it; nothing in optcore reads it.
SECOND_MOMENTS = frozenset(
  {
    "nu", "nu_max", "sum_of_squares", "grad_sq_ema", "v", "v_row", "v_col", "G", "e_g", "e_x",
    "exp_avg_sq", "max_exp_avg_sq", "second_momentum", "variance", "diagonal_statistics",
  }
)  # fmt: skip

#: Leaves smaller than this stay in their own dtype (bitsandbytes' ``min_8bit_size``): a
#: small tensor gains little, and its scales would cost more than its codes save.
MIN_SIZE = 4096


class LowBitState(NamedTuple):
  """The state of `low_bit_state`.

  Attributes:
    inner: the wrapped definition's ``param_states``, each chosen leaf a `QuantizedArray`
      (codes and scales; ``.dequantize()`` reads its values).
  """

  inner: Nested


class LowBitStateDef(StateWrapper):
  """``optimizer_def`` with its state stored block-wise quantized: see `low_bit_state`."""

  name = "low_bit_state"
  state_type = LowBitState
  config_arguments: ClassVar = MappingProxyType(
    {"bits": 8, "block_size": None, "states": None, "min_size": MIN_SIZE, "rounding": "nearest"}
  )
  repr_shows = ("bits",)

  @a.declare(min_size=a.Number(0, integer=True))
  def __init__(self, optimizer_def: OptimizerDef, **settings: Any):
    """``settings``: `low_bit_state`'s keywords; the others keep ``config_arguments``'
    defaults."""
    s = self.settings(settings)
    bits, block_size, states = s["bits"], s["block_size"], s["states"]
    min_size, rounding = s["min_size"], s["rounding"]
    check_block_size(bits, block_size)
    check_rounding(rounding)
    if states is not None:
      if not isinstance(states, str):
        raise TypeError(
          "low_bit_state: states must be a regular expression searched in each state leaf's "
          f"path (e.g. 'nu' for adam's second moment only), or None for every state leaf; "
          f"got states={states!r}"
        )
      check_regex(states, f"low_bit_state: states={states!r}")
    super().__init__(optimizer_def)
    self.bits, self.block_size, self.states = bits, block_size, states
    self.min_size, self.rounding = int(min_size), rounding

  twice_hint = "quantize once (a state is stored in one format)"

  def chooses(self, keys: tuple, leaf: Any, role: Role | None) -> bool:
    """Whether the state leaf at ``keys`` (declared ``role``) is stored quantized: a real
    floating array, not a scalar, of at least ``min_size`` elements (at 4 bits also a multiple
    of the block, torchao's rule) whose path ``states`` matches; for None, a declared moment
    (`optcore.FirstMoment`, `optcore.SecondMoment`): a copy of the parameters, a last gradient
    or a basis (`optcore.ParamShaped`) stays as it is."""
    if not _floating_array(leaf):
      return False
    size = int(np.prod(np.shape(leaf)))
    if size < max(self.min_size, 1):
      return False  # a scalar (schedule-free's b1 and weight_sum) is no moment, and one block
    if self.bits == 4 and size % check_block_size(4, self.block_size):
      return False
    if self.states is None:
      return role is not None and role.is_moment
    return paths.state_path_search(self.states, keys)

  def refuse_undeclared(self, param_states: PyTree, roles: Mapping[tuple, Role]) -> None:
    """With ``states=None`` every floating state leaf must say what it is: an undeclared one
    could be a moment or a copy of the parameters (quantized, those would move by the
    rounding), so it is refused, naming it and the fix."""
    if self.states is not None:
      return
    for keys, leaf in _keyed_leaves(param_states):
      if keys not in roles and _floating_array(leaf):
        raise UndeclaredStateError(
          f"low_bit_state({self.optimizer_def!r}) cannot tell what the state leaf "
          f"'{state_path(keys)}' holds: no state type around it declares its fields. Annotate "
          "the state type's fields (optcore.FirstMoment, optcore.SecondMoment, "
          "optcore.ParamShaped, optcore.Replicated), declare them for a type you cannot edit "
          "(optcore.declare_state), or name the leaves to quantize: low_bit_state(..., "
          "states='<regex of their paths>')."
        )

  def warn_if_nothing_chosen(self, param_states: PyTree, roles: Mapping[tuple, Role]) -> None:
    """Warns, saying why, where no leaf of the wrapped definition's state is chosen: then
    this wrapper would store nothing in low bits and say nothing."""
    keyed = _keyed_leaves(param_states)
    if any(self.chooses(keys, leaf, roles.get(keys)) for keys, leaf in keyed):
      return
    leaves = [
      (state_path(keys), int(np.prod(np.shape(leaf))))
      for keys, leaf in keyed
      if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)
    ]
    name = f"low_bit_state({self.optimizer_def!r})"
    if not leaves:
      why = "the wrapped definition keeps no floating-point state to quantize"
      fix = "drop low_bit_state, or wrap an optimizer with moments (adam, ...)"
    elif self.states is not None and not any(
      paths.state_path_search(self.states, keys) for keys, _ in keyed
    ):
      shown = paths.some_paths([p for p, _ in leaves])
      why = f"states={self.states!r} matches no state leaf; the state's paths are {shown}"
      fix = "pass a pattern that one of them matches"
    else:
      largest = max(size for _, size in leaves)
      why = (
        f"every state leaf it would quantize has fewer than min_size={self.min_size} values "
        f"(the largest {largest})"
        + (", or is not a multiple of the block" if self.bits == 4 else "")
      )
      fix = f"lower min_size (min_size={largest} quantizes the largest)"
    warn(f"{name} quantizes nothing: {why}; the state stays in its own dtype. To fix: {fix}.")

  def _quantize(self, leaf: Any, role: Role | None) -> QuantizedArray:
    signed = role is None or role.moment != "second"  # the unsigned map: a SecondMoment's
    return QuantizedArray.quantize(
      leaf, bits=self.bits, signed=signed, block_size=self.block_size, rounding=self.rounding
    )

  def quantize_state(self, param_states: PyTree) -> PyTree:
    """``param_states`` (the wrapped definition's) with each chosen leaf quantized, with the
    map its declared role asks for."""
    roles = declarations.leaf_roles(param_states, is_leaf=is_quantized)
    self.refuse_undeclared(param_states, roles)
    self.warn_if_nothing_chosen(param_states, roles)

    def store(keys: tuple, leaf: Any) -> Any:
      role = roles.get(keys)
      return self._quantize(leaf, role) if self.chooses(keys, leaf, role) else leaf

    return map_optimizer_leaves_with_path(store, param_states)

  def init_state(self, params: PyTree) -> OptimizerState:
    def init(params: PyTree) -> OptimizerState:
      inner = self.optimizer_def.init_state(params)
      return OptimizerState(inner.step, LowBitState(self.quantize_state(inner.param_states)))

    return init_in_one_program(init, params)

  def _inner_state(self, state: OptimizerState) -> OptimizerState:
    return OptimizerState(state.step, dequantize_tree(state.param_states.inner))

  def apply_gradient(
    self, hyper_params: Any, params: PyTree, state: OptimizerState, grads: PyTree, **extra_args: Any
  ) -> tuple[PyTree, OptimizerState]:
    """The wrapped step on the dequantized state; the new state is quantized again, each leaf
    with the format it was stored in (new scales from the new values)."""
    stored = state.param_states.inner
    views = self._block_views(stored)
    if views:
      return self._apply_in_blocks(views, hyper_params, params, state, grads, **extra_args)
    new_params, new_inner = self.optimizer_def.apply_gradient(
      hyper_params, params, self._inner_state(state), grads, **extra_args
    )
    new_values = new_inner.param_states
    if jax.default_backend() == "cpu":
      # On XLA:CPU, computed once and then quantized: fused into the quantization, the wrapped
      # update would be recomputed for each of the scales, the codes and the step (x7.1 of a
      # float32 step against x4.7 here, at 2M parameters). On a GPU the fusions recompute it
      # cheaply and hold far less (an H200 at 64M parameters: x1.77 and 77 MB of temporaries
      # without the barrier, x1.99 and 488 MB with it).
      new_values = jax.lax.optimization_barrier(new_values)
    requantized = requantize_like(new_values, stored)
    return new_params, OptimizerState(new_inner.step, LowBitState(requantized))

  def _block_views(self, stored: PyTree) -> dict[tuple[int, ...], tuple[int, ...]]:
    """Where the wrapped step may run in the blocks' layout: each quantized leaf's shape and
    its `QuantizedArray.block_shape`, for an element-wise optax definition (one that gives
    optax's own updates) on XLA:CPU with one device, of each quantized leaf whose blocks lie
    along its last dimension (a shape's every array is in one layout: no two block shapes for
    one shape, or none); else none.

    Run in the parameters' layout, the new moments are reshaped into blocks for their scales
    and codes, and jax 0.10's XLA then writes out the map's values read at the codes and
    recomputes the moments from them for each of the step, the scales and the codes: 81.5
    bytes a parameter of an 8-bit adam step, against 52.4 for a hand-written step that stays
    in blocks (issue 65). The blocks are a reshape away, and an element-wise step gives the
    same numbers on any layout (`grouped` relies on it). Its updates, not its new parameters,
    come back: added to the parameters in their own layout, the new parameters are written in
    place (from the blocks' layout XLA writes them out and copies them: 61.4 bytes). Elsewhere
    the layout is the parameters' (on a mesh a leaf's sharding is of its own shape).
    """
    inner = self.optimizer_def
    if (
      jax.default_backend() != "cpu"
      or jax.device_count() != 1
      or inner.why_not_elementwise() is not None
      or not inner.gives_optax_updates
    ):
      return {}
    quantized = [x for x in jax.tree.leaves(stored, is_leaf=is_quantized) if is_quantized(x)]
    views: dict[tuple[int, ...], tuple[int, ...]] = {}
    for q in quantized:
      blocks = q.block_shape
      if blocks is not None and views.setdefault(q.shape, blocks) != blocks:
        return {}
    return views

  def _apply_in_blocks(
    self,
    views: Mapping[tuple[int, ...], tuple[int, ...]],
    hyper_params: Any,
    params: PyTree,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    """The wrapped step on every array of a quantized leaf's shape reshaped to its blocks
    (`_block_views`): the parameters, the gradients and the state, each quantized leaf read
    and written in its blocks' layout; the updates and float state reshaped back."""
    stored = state.param_states.inner

    def to_blocks(x: Any) -> Any:
      shape = tuple(np.shape(x)) if hasattr(x, "shape") else ()
      if is_quantized(x):
        return x.dequantize_blocks() if shape in views else x.dequantize()
      return x.reshape(views[shape]) if shape in views else x

    def back(new: Any, old: Any) -> Any:
      if is_quantized(old):
        return old.requantize_blocks(new) if old.shape in views else old.requantize(new)
      return new.reshape(np.shape(old)) if hasattr(old, "shape") else new

    updates, new_inner = self.optimizer_def.compute_updates(
      hyper_params,
      jax.tree.map(to_blocks, params),
      OptimizerState(state.step, jax.tree.map(to_blocks, stored, is_leaf=is_quantized)),
      jax.tree.map(to_blocks, grads),
      **extra_args,
    )
    # as the wrapped definition's own step adds them (`OptaxWrapper.apply_gradient`)
    new_params = optax.apply_updates(params, jax.tree.map(back, updates, params))
    leaves, treedef = jax.tree.flatten(stored, is_leaf=is_quantized)
    new_leaves = treedef.flatten_up_to(new_inner.param_states)
    requantized = treedef.unflatten(
      [back(new, old) for new, old in zip(new_leaves, leaves, strict=True)]
    )
    return new_params, OptimizerState(new_inner.step, LowBitState(requantized))

  def derive_param_states_axes(self, param_states: Any, params: PyTree, params_axes: PyTree):
    """The wrapped definition's axes for the float leaves; a quantized leaf's codes keep its
    leading axes and blocks along its last (when the blocks lie along it), else none."""
    stored = param_states.inner
    shadow = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if is_quantized(x) else x,
      stored,
      is_leaf=is_quantized,
    )
    axes = self.optimizer_def.derive_param_states_axes(shadow, params, params_axes)
    leaves, treedef = jax.tree.flatten(stored, is_leaf=is_quantized)
    out = [
      quantized_axes(leaf, spec) if is_quantized(leaf) else spec
      for leaf, spec in zip(leaves, treedef.flatten_up_to(axes), strict=True)
    ]
    return LowBitState(treedef.unflatten(out))


def _floating_array(leaf: Any) -> bool:
  """A real floating array of at least one dimension: what a moment can be."""
  return (
    hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating) and bool(np.shape(leaf))
  )


def _keyed_leaves(param_states: PyTree) -> list[tuple[tuple, Any]]:
  found: list[tuple[tuple, Any]] = []
  map_optimizer_leaves_with_path(lambda keys, x: found.append((keys, x)) or x, param_states)
  return found


def state_path(keys: tuple) -> str:
  """A state leaf's path as `low_bit_state`'s ``states`` pattern reads it: its key names
  joined by '/', from the top of the wrapped definition's state (adam's second moment of
  ``params['w']``: ``'0/nu/w'``; under `ema`, ``'inner/0/nu/w'``)."""
  return paths.path_str(keys)[1:]


def quantized_axes(leaf: QuantizedArray, spec: Any) -> QuantizedArray:
  """The axes of ``leaf``'s codes and scales from those of its float values (``spec``)."""
  scales_shape = np.shape(leaf.scales)
  if spec is None or len(scales_shape) != len(leaf.shape):  # blocks across the flattened tensor
    codes, scales = PartitionSpec(None, None), PartitionSpec(None)
  else:
    full = tuple(spec) + (None,) * (len(leaf.shape) - len(tuple(spec)))
    codes, scales = PartitionSpec(*full, None), PartitionSpec(*full)
  return jax.tree.unflatten(jax.tree.structure(leaf), [codes, scales])


def low_bit_state(
  optimizer_def: OptimizerDef,
  bits: int = 8,
  block_size: int | None = None,
  *,
  states: str | None = None,
  min_size: int = MIN_SIZE,
  rounding: str = "nearest",
) -> LowBitStateDef:
  """Optimizer state at 8 or 4 bits a value: block-wise quantized between steps.

  Each chosen state leaf of ``optimizer_def`` (adam's ``mu`` and ``nu``, a momentum trace,
  the legacy algorithms' moments, ...) is stored as a `QuantizedArray`: one uint8 code a
  value (two at 4 bits) and one float32 scale a block of ``block_size`` values. Each step
  reads the values back (``code's map value x block scale``), runs ``optimizer_def``'s step
  on them in their own dtype, and quantizes the new state: adam's state drops from 8 bytes a
  parameter to about 2.03 at 8 bits and 1.06 at 4.

  The method and its constants are the published ones (Dettmers et al. 2022; bitsandbytes'
  8-bit optimizers; torchao's 4-bit ones, after Li et al. 2023): blocks of 256 at 8 bits and
  128 at 4; bitsandbytes' dynamic map, signed for a first moment and unsigned for a second
  (a field declared `optcore.SecondMoment`), at 8 bits; torchao's 4-bit signed dynamic map and its
  linear unsigned map without zero at 4; leaves under 4096 values stay as they are (at 4
  bits also those whose size is no multiple of the block, torchao's rule; at 8 bits the last
  block is padded, as bitsandbytes does).

  Only the algorithm's own state is quantized: an `ema` average, an `accumulate` mean and a
  `mixed_precision` master copy keep their dtype.

  Args:
    optimizer_def: the definition whose state is stored (optax, legacy, MultiOptimizer).
    bits: 8 or 4.
    block_size: values a block (each with its own scale); None for 256 at 8 bits and 128 at
      4.
    states: a regular expression searched in each state leaf's path (`state_path`:
      ``'0/nu/dense/kernel'`` for adam's second moment of ``dense/kernel``) choosing
      the leaves to quantize, e.g. ``'nu'``; None for every declared moment
      (`optcore.FirstMoment`, `optcore.SecondMoment`: a copy of the parameters or a
      preconditioner's basis, `optcore.ParamShaped`, stays as it is unless a pattern names
      it).
    min_size: leaves of fewer values stay in their own dtype.
    rounding: how a value becomes a code: "nearest" (the published method, bitsandbytes on
      CUDA, torchao) or "bitsandbytes_cpu" (bitsandbytes' CPU backend, which rounds through a
      table of 65,536 values: to reproduce a run of it bitwise).

  Returns:
    A `LowBitStateDef` definition.

  Raises:
    ValueError: ``bits`` is not 8 or 4; ``block_size`` is not an int of at least 2 (even at
      4 bits); ``min_size`` is negative; ``states`` is not a regular expression; ``rounding``
      is not "nearest" or "bitsandbytes_cpu".
    TypeError: ``optimizer_def`` is not a definition, is grouped, or is quantized already;
      ``states`` is not a string.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.low_bit_state(optcore.adam(1e-3), bits=8).create({'w': jnp.ones((64, 256))})
    >>> mu = opt.state.param_states.inner[0].mu['w']
    >>> mu.codes.dtype, mu.codes.shape, mu.scales.shape
    (dtype('uint8'), (64, 1, 256), (64, 1))
    >>> opt = opt.apply_gradient({'w': jnp.ones((64, 256))})
    >>> round(float(opt.state.param_states.inner[0].mu['w'].dequantize()[0, 0]), 6)
    0.1
  """
  return LowBitStateDef(
    optimizer_def,
    bits=bits,
    block_size=block_size,
    states=states,
    min_size=min_size,
    rounding=rounding,
  )
