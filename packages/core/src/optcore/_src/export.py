"""A definition as an optax transformation, for optax-based trainers
(`flax.training.train_state.TrainState`, `flax.nnx.Optimizer`, a plain optax loop)."""

from __future__ import annotations

from typing import Any

import optax

from optcore._src import paths, placement

PyTree = Any


def as_optax(optimizer_def: Any) -> optax.GradientTransformationExtraArgs:
  """`OptimizerDef.as_optax`: the state is the `OptimizerState`, the updates are
  the definition's ``compute_updates`` for its own hyper-parameters; extra
  update arguments are ignored, as optax transformations that need none do."""

  def init_fn(params: PyTree) -> Any:
    return optimizer_def.init_state(paths.unbox(params))

  def update_fn(updates: PyTree, state: Any, params: PyTree = None, **extra_args: Any):
    del extra_args
    if params is None:
      raise ValueError(
        f"{optimizer_def!r}.as_optax() computes new parameters, so it needs them: call "
        "tx.update(grads, state, params)."
      )
    state, on_host = placement.to_device(state)  # state_memory_kind="pinned_host"
    updates, new_state = optimizer_def.compute_updates(
      optimizer_def.hyper_params, params, state, updates
    )
    return updates, placement.to_host(new_state, on_host)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


class ExportMethods:
  """`OptimizerDef`'s export to optax."""

  def as_optax(self) -> optax.GradientTransformationExtraArgs:
    """This definition as an optax transformation, for `flax.training.train_state.TrainState`,
    `flax.nnx.Optimizer` or a plain optax loop.

    Its state is the `OptimizerState`; its updates are ``new_params - params``,
    so ``optax.apply_updates`` lands on the new parameters up to float rounding
    (definitions that wrap optax export their own transformation and are exact).
    Extra update arguments are ignored, as optax transformations that need
    none ignore them.

    Returns:
      An ``optax.GradientTransformationExtraArgs``; its ``update`` needs ``params``.

    Raises:
      TypeError: a definition whose state cannot be optax's (``optcore.grouped``
        keeps the parameters in its own layout).

    Example:
      >>> import jax.numpy as jnp, optax
      >>> import optcore
      >>> class Halve(optcore.OptimizerDef):
      ...   def __init__(self):
      ...     super().__init__(optcore.HyperParams())
      ...   def init_param_state(self, param):
      ...     return ()
      ...   def apply_param_gradient(self, step, hyper_params, param, state, grad):
      ...     return param / 2, state
      >>> tx = Halve().as_optax()
      >>> params = {'w': jnp.array([4.0])}
      >>> updates, state = tx.update(params, tx.init(params), params)
      >>> optax.apply_updates(params, updates)['w'], int(state.step)
      (Array([2.], dtype=float32), 1)
    """

    return as_optax(self)
