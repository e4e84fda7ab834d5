"""The ``t5x.optimizers`` surface, on optcore: swap the import, keep the gin config.

Every optax alias (``adamw``, ``sgd``, ...) and ``dpsgd`` are wrapped with
their arguments as hyper-parameters, so the learning rate T5X's trainer
passes every step takes effect. `OptaxWrapper` around a ready transformation
has nothing to re-build; as in T5X, an override passed to it is ignored, here
with a warning that says so.

Example:
  >>> import jax.numpy as jnp
  >>> from optcore_flax import optimizers
  >>> opt_def = optimizers.chain([optimizers.adamw(1e-3, weight_decay=0.1)])
  >>> optimizer = opt_def.create({'w': jnp.ones(2)})
  >>> int(optimizer.apply_gradient({'w': jnp.ones(2)}, learning_rate=1e-4).state.step)
  1
"""

import types as _types
import warnings as _warnings
from typing import Any as _Any

import optcore as _optcore
from optcore import MultiOptimizer as MultiOptimizer
from optcore import OptaxStatePartitionRules as OptaxStatePartitionRules
from optcore import Optimizer as Optimizer
from optcore import OptimizerDef as OptimizerDef
from optcore import OptimizerState as OptimizerState
from optcore import chain as chain
from optcore import wrap_optax_optimizer as wrap_optax_optimizer


class OptaxWrapper(_optcore.OptaxWrapper):
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

  def update_hyper_params(self, **hyper_param_overrides: _Any):
    if self._factory is None and hyper_param_overrides.keys() - {"hyper_params"}:
      _warnings.warn(
        f"OptaxWrapper({self._name}) has no hyper-parameters to override; "
        f"{sorted(hyper_param_overrides)} ignored, as T5X ignores them. Use the wrapped "
        "factories (optimizers.adamw(learning_rate=...)) to have them honoured.",
        UserWarning,
        stacklevel=3,
      )
      return self.hyper_params
    return super().update_hyper_params(**hyper_param_overrides)


def _aliases() -> dict[str, _Any]:
  found = {}
  for name in _optcore.OPTAX_ALIASES:
    alias = getattr(_optcore, name)
    if isinstance(alias, _types.ModuleType):  # optcore.adafactor: T5X's module, callable
      alias = alias.__wrapped__
    found[name] = alias
  found["dpsgd"] = _optcore.contrib.dpsgd
  return found


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
