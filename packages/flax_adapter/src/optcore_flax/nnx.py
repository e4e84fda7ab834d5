"""The Flax NNX face: ``nnx.Optimizer``'s API over any optcore definition.

`Optimizer` is ``flax.nnx.Optimizer`` (it subclasses it: the same constructor, ``step``,
``opt_state``, ``update(model, grads, **kwargs)``, the same ``nnx.state(optimizer)`` layout for
orbax checkpoints), taking an optcore definition or a plain optax transformation, so that
replacing the import line is enough. On top it carries what optcore adds, under the names every
face uses: hyper-parameter overrides as ``update`` keywords (honoured under ``nnx.jit`` without a
recompile per value, a misspelt one refused), ``ema_params``, ``current_hyper_params``,
``state_dict``/``restore_state`` in optcore's portable layout, and ``transplant``. Moments keep
their parameters' partitioning metadata (``nnx.with_partitioning``), so they are sharded as the
parameters are.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from flax import nnx
  >>> import optcore
  >>> from optcore_flax import nnx as ocnnx
  >>> model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
  >>> optimizer = ocnnx.Optimizer(model, optcore.ema(optcore.adamw(1e-2), 0.9), wrt=nnx.Param)
  >>> grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 2))) ** 2))(model)
  >>> _ = optimizer.update(model, grads, learning_rate=1e-3)  # an override, for this step
  >>> int(optimizer.step[...]), sorted(optimizer.ema_params(model))
  (1, ['bias', 'kernel'])
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import optcore
from optcore import adapter

__all__ = ["Optimizer"]

PyTree = Any
_MISSING: Any = object()


class Optimizer(nnx.Optimizer):
  """``flax.nnx.Optimizer`` over an optcore definition (or an optax transformation).

  Args:
    model: the NNX module whose ``wrt`` variables are trained.
    tx: an optcore definition (``optcore.adamw(1e-3)``, a `MultiOptimizer`
      whose selectors are path regexes or nnx filters, any wrapper), or an
      optax ``GradientTransformation``.
    wrt: the nnx filter of the trained variables (``nnx.Param``). Required,
      as in current Flax; left out, ``nnx.Param`` is used with a
      ``DeprecationWarning`` (Flax before 0.11 defaulted to it).

  Raises:
    TypeError: ``tx`` is neither a definition nor an optax transformation,
      or a grouped definition (its parameters live in its own buffers).

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import optcore
    >>> from optcore_flax import nnx as ocnnx
    >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    >>> optimizer = ocnnx.Optimizer(model, optcore.sgd(0.1), wrt=nnx.Param)
    >>> before = model.bias[...]
    >>> _ = optimizer.update(model, nnx.state(model, nnx.Param), learning_rate=0.0)
    >>> bool((model.bias[...] == before).all())  # learning_rate=0.0 for this step
    True
  """

  def __init__(self, model: Any, tx: Any, *, wrt: Any = _MISSING, **kwargs: Any):
    if wrt is _MISSING:
      warnings.warn(
        "optcore_flax.nnx.Optimizer without wrt= trains nnx.Param, as Flax before 0.11 did; "
        "current Flax requires it: pass wrt=nnx.Param.",
        DeprecationWarning,
        stacklevel=2,
      )
      wrt = nnx.Param
    optimizer_def = adapter.as_definition(tx, "optcore_flax.nnx.Optimizer")
    self.optimizer_def = optimizer_def
    super().__init__(model, optimizer_def.as_optax(), wrt=wrt, **kwargs)

  @property
  def state(self) -> optcore.OptimizerState:
    """The optimizer state as every face holds it, arrays unboxed: an `optcore.OptimizerState`
    (for an optax transformation, its state with nnx's ``step``). The read-out functions
    (`optcore.ema_params`, `optcore.current_hyper_params`) read it."""
    return _as_state(self)

  def readout_parameters(self, model: Any) -> PyTree:
    """The trained variables of ``model`` as arrays, in the optimizer state's structure (what
    `optcore.ema_params` fills the unaveraged leaves from)."""
    return nnx.as_pure(nnx.state(model, self.wrt))

  def ema_params(self, model: Any) -> nnx.State:
    """The moving average of ``model``'s trained variables (an `optcore.ema` anywhere in the
    definition), as an ``nnx.State``: ``nnx.update(model, optimizer.ema_params(model))`` puts it
    in the model. Variables no group averages come back as they are; arrays are on the device.

    Raises:
      TypeError: the definition keeps no average (the message says how to keep one).
    """
    return optcore.ema_params(self, model)

  def current_hyper_params(self) -> dict[str, Any]:
    """The hyper-parameters the next `update` takes unless overridden, for logging (see
    `optcore.current_hyper_params`); works under ``nnx.jit``."""
    return optcore.current_hyper_params(self)

  def state_dict(self) -> dict[str, Any]:
    """``{'state': {'step', 'param_states'}}``: optcore's portable layout, which every face
    restores (`restore_state`)."""
    return adapter.state_dict(self.optimizer_def, _as_state(self))

  def restore_state(self, state_dict: Mapping[str, Any]) -> None:
    """Reads a state dict of any face into this optimizer, in place as nnx does; on an error
    nothing changes.

    Raises:
      optcore.StateDictError: a state dict written for another optimizer or other parameters
        (the message names the path).
    """
    restored = adapter.restore_state(self.optimizer_def, _as_state(self), state_dict)
    self._set_state(restored)

  def transplant(self, state_dict: Mapping[str, Any], model: Any = None) -> Any:
    """Fills this optimizer, in place, from a state dict written for another optimizer or other
    parameters, where parameter, role and shape still match (see `optcore.transplant`); returns
    the `optcore.TransplantReport`.

    Raises:
      TypeError: no ``model`` (this optimizer does not hold it).
    """
    if model is None:
      raise TypeError(
        "optcore_flax.nnx.Optimizer.transplant needs the model (it does not hold it): "
        "optimizer.transplant(state_dict, model)."
      )
    state, report = adapter.transplant_state(
      self.optimizer_def, self.readout_parameters(model), _as_state(self), state_dict
    )
    self._set_state(state)
    return report

  def _set_state(self, state: optcore.OptimizerState) -> None:
    """Writes ``state`` into this optimizer's variables (their metadata kept)."""
    new = self.optimizer_def.to_optax_state(state)
    if not isinstance(new, optcore.OptimizerState):  # the state keeps no step: nnx's is it
      self.step.set_value(jnp.asarray(state.step, self.step[...].dtype))
    variables = jax.tree.leaves(self.opt_state, is_leaf=_is_variable)
    values = jax.tree.leaves(new)
    if len(variables) != len(values):  # restore_state checked the structure; never expected
      raise optcore.StateDictError("the restored state does not fit this optimizer's variables")
    for variable, value in zip(variables, values, strict=True):
      variable.set_value(value)


def _is_variable(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def _as_state(optimizer: Optimizer) -> optcore.OptimizerState:
  """The state as an `optcore.OptimizerState` (an optax transformation's with nnx's step)."""
  step = jnp.asarray(optimizer.step[...], jnp.int32)
  return optimizer.optimizer_def.from_optax_state(nnx.as_pure(optimizer.opt_state), step)
