"""`stochastic_rounding`: bfloat16 parameters trained without a float32 master copy, each new
value rounded to bfloat16 up or down at random, in proportion to its distance from each (one
wrapper of the wrapper protocol, `optcore._src.definitions.wrapper`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import StateWrapper, init_in_one_program
from optcore._src.ground import arguments as a
from optcore._src.ground import paths
from optcore._src.ground.checks import check_float_params
from optcore._src.ground.declarations import Nested, Replicated
from optcore._src.ground.state import OptimizerState

PyTree = Any


class StochasticRoundingState(NamedTuple):
  """The state of `stochastic_rounding`.

  Attributes:
    inner: the wrapped definition's ``param_states``, made for float32 parameters.
    key: uint32, the raw data of the PRNG key the next step rounds with
      (``jax.random.key_data``); each step splits it.
  """

  inner: Nested
  key: Replicated


def round_to_bfloat16(x: jax.Array, key: jax.Array) -> jax.Array:
  """``x`` (float32) rounded to bfloat16 stochastically: up (away from zero) with probability
  the distance from the value below divided by the gap, so the rounding is unbiased.

  A random 16-bit number is added to the 16 bits bfloat16 drops, and they are dropped (a carry
  rounds up); infinities and NaN are rounded as ``astype`` rounds them.

  Args:
    x: a float32 array.
    key: a PRNG key.

  Returns:
    The bfloat16 array.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from optcore._src.wrappers.stochastic_rounding import round_to_bfloat16
    >>> x = jnp.full((10000,), 1.0 + 2.0**-10)  # an eighth of the way to the next bfloat16
    >>> y = round_to_bfloat16(x, jax.random.key(0)).astype(jnp.float32)
    >>> sorted(set(y.tolist())), round(float(jnp.mean(y)), 3)  # astype gives 1.0 each time
    ([1.0, 1.0078125], 1.001)
  """
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  noise = jax.random.bits(key, x.shape, jnp.uint32) >> 16
  rounded = (bits + noise) & jnp.uint32(0xFFFF0000)
  out = jax.lax.bitcast_convert_type(rounded, jnp.float32).astype(jnp.bfloat16)
  return jnp.where(jnp.isfinite(x), out, x.astype(jnp.bfloat16))


class StochasticRounding(StateWrapper):
  """``optimizer_def`` on float32 copies of bfloat16 parameters, each new parameter rounded
  stochastically: see `stochastic_rounding`."""

  ungrouped_because = "keeps a random key beside the wrapped state, which grouped does not lay out"

  name = "stochastic_rounding"
  state_type = StochasticRoundingState
  config_arguments: ClassVar = MappingProxyType({"seed": 0})

  @a.declare(seed=a.Number(integer=True))
  def __init__(self, optimizer_def: OptimizerDef, seed: int = 0):
    super().__init__(optimizer_def)
    self.seed = int(seed)

  twice_hint = "round once (one key decides each rounding)"

  def _check(self, params: PyTree) -> None:
    for names, leaf in paths.leaves_with_names(params)[0]:
      if jnp.result_type(leaf) == jnp.float16:
        raise TypeError(
          f"stochastic_rounding rounds float32 to bfloat16; the parameter at "
          f"{'/' + '/'.join(names)!r} is float16. Cast it to bfloat16, or keep a float32 "
          "master copy instead: optcore.mixed_precision(..., master_dtype=jnp.float32)."
        )

  @staticmethod
  def _working(params: PyTree) -> PyTree:
    return jax.tree.map(
      lambda p: jnp.asarray(p, jnp.float32) if jnp.result_type(p) == jnp.bfloat16 else p, params
    )

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    self._check(params)

    def init(params: PyTree) -> OptimizerState:
      inner = self.optimizer_def.init_state(self._working(params))
      key = jax.random.key_data(jax.random.key(self.seed))
      return OptimizerState(inner.step, StochasticRoundingState(inner.param_states, key))

    return init_in_one_program(init, params)

  def apply_gradient(
    self, hyper_params: Any, params: PyTree, state: OptimizerState, grads: PyTree, **extra_args: Any
  ) -> tuple[PyTree, OptimizerState]:
    """The wrapped step on float32 copies of the bfloat16 parameters (and their gradients);
    each new bfloat16 parameter is `round_to_bfloat16` of the step's float32 result, with a
    key of its own from the state's, which is split for the next step."""
    own = state.param_states
    working = self._working(params)
    grads = jax.tree.map(lambda g, w: jnp.asarray(g).astype(jnp.result_type(w)), grads, working)
    new_working, new_inner = self.optimizer_def.apply_gradient(
      hyper_params, working, OptimizerState(state.step, own.inner), grads, **extra_args
    )
    key, now = jax.random.split(jax.random.wrap_key_data(own.key))
    leaves, treedef = jax.tree.flatten(params)
    new_leaves = treedef.flatten_up_to(new_working)
    rounded = [
      round_to_bfloat16(n, jax.random.fold_in(now, i)) if jnp.result_type(p) == jnp.bfloat16 else n
      for i, (p, n) in enumerate(zip(leaves, new_leaves, strict=True))
    ]
    new_state = StochasticRoundingState(new_inner.param_states, jax.random.key_data(key))
    return treedef.unflatten(rounded), OptimizerState(new_inner.step, new_state)


def stochastic_rounding(optimizer_def: OptimizerDef, seed: int = 0) -> StochasticRounding:
  """bfloat16 parameters without a float32 master copy: each step's result rounded
  stochastically, so updates smaller than a bfloat16 step still move the parameters on
  average.

  ``optimizer_def`` steps float32 copies of the bfloat16 parameters (made in the step, never
  kept) and keeps its state for float32 parameters; each new value is rounded to bfloat16 up
  or down at random, the probability of each in proportion to its nearness
  (`round_to_bfloat16`, the method of torchao's ``bf16_stochastic_round`` and llm.c), with a
  PRNG key kept in the state. Rounding to nearest would drop every update under half a
  bfloat16 step (2**-9 of the value); a master copy (`mixed_precision`'s ``master_dtype``)
  keeps them at 4 more bytes a parameter. Other parameters are stepped as they are.

  Args:
    optimizer_def: the definition to run.
    seed: the seed of the rounding's PRNG key.

  Returns:
    A `StochasticRounding` definition.

  Raises:
    TypeError: ``seed`` is not an int; ``optimizer_def`` is not a definition, is grouped, or
      rounds stochastically already; at ``init_state``/``create``, a float16 parameter
      (named by its path).

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> params = {'w': jnp.ones(1000, jnp.bfloat16)}
    >>> plain = optcore.sgd(1e-3).create(params)
    >>> rounded = optcore.stochastic_rounding(optcore.sgd(1e-3)).create(params)
    >>> for _ in range(100):
    ...   plain = plain.apply_gradient({'w': jnp.ones(1000, jnp.bfloat16)})
    ...   rounded = rounded.apply_gradient({'w': jnp.ones(1000, jnp.bfloat16)})
    >>> float(plain.target['w'].astype(jnp.float32).mean())  # each -1e-3 rounded away
    1.0
    >>> round(float(rounded.target['w'].astype(jnp.float32).mean()), 2)  # 1 - 100 * 1e-3
    0.9
  """
  return StochasticRounding(optimizer_def, seed)
