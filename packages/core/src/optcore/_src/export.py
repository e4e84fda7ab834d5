"""A definition as an optax transformation, for optax-based trainers
(`flax.training.train_state.TrainState`, `flax.nnx.Optimizer`, a plain optax loop)."""

from __future__ import annotations

from typing import Any

import optax

from optcore._src import paths

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
    return optimizer_def.compute_updates(optimizer_def.hyper_params, params, state, updates)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
