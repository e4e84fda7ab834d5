"""The ``t5x.optimizers`` surface, on optcore: swap the import, keep the gin config.

Every optax alias (``adamw``, ``sgd``, ...), ``dpsgd`` and ``chain`` are
wrapped with their arguments as hyper-parameters, so the learning rate T5X's
trainer passes every step takes effect where the definition has one. An
override a definition has no hyper-parameter for (``learning_rate=`` to an
`OptaxWrapper` of a ready transformation, or to a ``chain`` of ready optax
transformations) is ignored with a warning, as T5X ignored it.
`derive_logical_axes` gives None for the step and for optax's scalar
counters, as T5X does.

Example:
  >>> import jax.numpy as jnp, optax, warnings
  >>> from optcore_flax import optimizers
  >>> opt_def = optimizers.chain([optax.clip_by_global_norm(1.0), optimizers.adamw(1e-3)])
  >>> optimizer = opt_def.create({'w': jnp.ones(2)})
  >>> int(optimizer.apply_gradient({'w': jnp.ones(2)}, learning_rate=1e-4).state.step)
  1
"""

from collections.abc import Callable as _Callable
from typing import Any as _Any

import optax as _optax
import optax.contrib as _optax_contrib

import optcore as _optcore
from optcore import OptaxStatePartitionRules as OptaxStatePartitionRules
from optcore import Optimizer as Optimizer
from optcore import OptimizerDef as OptimizerDef
from optcore import OptimizerState as OptimizerState
from optcore_flax._t5x import T5XFace as _T5XFace


class OptaxWrapper(_T5XFace, _optcore.OptaxWrapper):
  """T5X's ``OptaxWrapper``: a ready optax transformation as a definition.

  It has no hyper-parameters: T5X's trainer still passes
  ``learning_rate=...`` each step, which T5X ignored silently. This wrapper
  ignores it too and warns; build the optimizer with the wrapped factories
  (``optimizers.adamw(...)``) to have the override honoured.

  Example:
    >>> import jax.numpy as jnp, optax, warnings
    >>> from optcore_flax import optimizers
    >>> optimizer = optimizers.OptaxWrapper(optax.sgd(0.1)).create({'w': jnp.ones(1)})
    >>> with warnings.catch_warnings(record=True) as caught:
    ...   warnings.simplefilter('always')
    ...   new = optimizer.apply_gradient({'w': jnp.ones(1)}, learning_rate=5.0)
    >>> new.target['w'], 'ignored' in str(caught[0].message)
    (Array([0.9], dtype=float32), True)
  """


class MultiOptimizer(_T5XFace, _optcore.MultiOptimizer):
  """T5X's ``MultiOptimizer``: one sequence of ``(traversal, optimizer)`` pairs
  (flax.optim's ``*pairs`` works too), ``set_param_axes`` handing each group
  its own leaves' axes, and ONE parameter-shaped state tree when every group
  keeps per-parameter state, as T5X's.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore_flax import adafactor, optim, optimizers
    >>> kernels = optim.ModelParamTraversal(lambda path, _: 'kernel' in path)
    >>> others = optim.ModelParamTraversal(lambda path, _: 'kernel' not in path)
    >>> opt_def = optimizers.MultiOptimizer(
    ...     ((kernels, adafactor.Adafactor(0.1)),
    ...      (others, adafactor.Adafactor(0.1, multiply_by_parameter_scale=False))))
    >>> state = opt_def.create({'kernel': jnp.ones((2, 2)), 'bias': jnp.ones(2)}).state
    >>> sorted(state.param_states)
    ['bias', 'kernel']
  """


def wrap_optax_optimizer(optax_optimizer: _Callable[..., _Any]) -> _Callable[..., OptaxWrapper]:
  """T5X's ``wrap_optax_optimizer``: an optax factory as a factory of definitions
  whose arguments are hyper-parameters (overridable per step).

  Example:
    >>> import optax
    >>> from optcore_flax import optimizers
    >>> optimizers.wrap_optax_optimizer(optax.sgd)(0.1).hyper_params.learning_rate
    0.1
  """
  return _optcore.wrap_optax_optimizer(optax_optimizer, definition_class=OptaxWrapper)


def _chain(transformations: _Any) -> _optax.GradientTransformation:
  """Applies a list of transformations (optax's or optcore definitions) in sequence."""
  return _optax.chain(*transformations)


chain = _optcore.wrap_optax_optimizer(_chain, name="chain", definition_class=OptaxWrapper)


def _aliases() -> dict[str, _Any]:
  factories = {name: getattr(_optax, name) for name in _optcore.OPTAX_ALIASES}
  factories["dpsgd"] = _optax_contrib.dpsgd
  return {
    name: _optcore.wrap_optax_optimizer(factory, name=name, definition_class=OptaxWrapper)
    for name, factory in factories.items()
  }


globals().update(_aliases())

__all__ = [
  "MultiOptimizer",
  "OptaxStatePartitionRules",
  "OptaxWrapper",
  "Optimizer",
  "OptimizerDef",
  "OptimizerState",
  "chain",
  "wrap_optax_optimizer",
  *sorted(_aliases()),
]
