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
from collections.abc import Mapping as _Mapping
from typing import Any as _Any
from typing import cast as _cast

import optax as _optax
import optax.contrib as _optax_contrib
from flax.core import freeze as freeze
from flax.core import unfreeze as unfreeze

import optcore as _optcore
from optcore import OptaxStatePartitionRules as OptaxStatePartitionRules
from optcore import Optimizer as Optimizer
from optcore import OptimizerDef as OptimizerDef
from optcore import OptimizerState as OptimizerState
from optcore_flax._t5x import T5XFace as _T5XFace
from optcore_flax._t5x import set_in_place as _set_in_place


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

  def set_param_axes(self, param_logical_axes: _Any) -> None:
    """T5X's hook, in place as T5X's: each group that has factor rules (T5X's Adafactor) takes
    them from its own leaves' axes (None elsewhere); one definition in two groups becomes two.
    A shim over the core's immutable `optcore.MultiOptimizer.with_param_axes`.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> from optcore_flax import adafactor, optimizers
      >>> opt_def = optimizers.MultiOptimizer([('w', adafactor.Adafactor(0.1))])
      >>> opt_def.set_param_axes({'w': P('layers', 'embed', 'mlp')})
      >>> opt_def.sub_optimizers[0].hyper_params.factor_map
      {'w': (<FactorDim.BATCH: 1>, <FactorDim.ROW: 2>, <FactorDim.COLUMN: 3>)}
    """
    told = self.with_param_axes(param_logical_axes)
    groups = []
    for i, (old, new) in enumerate(zip(self.sub_optimizers, told.sub_optimizers, strict=True)):
      # T5X changes each group's definition itself; one shared by an earlier group gets its own.
      if new is not old and not any(old is g for g in self.sub_optimizers[:i]):
        _set_in_place(old, new)
        new = old
      groups.append(new)
    _set_in_place(self, told)
    self.sub_optimizers = tuple(groups)
    self.hyper_params = [opt.hyper_params for opt in groups]


# T5X's transitional type names (t5x.train_state annotates with them), and its dtype alias.
OptimizerType = Optimizer
OptimizerStateType = OptimizerState | _Mapping[str, _Any]
OptimizerDefType = OptimizerDef
Dtype = _Any


def wrap_optax_optimizer(optax_optimizer: _Callable[..., _Any]) -> _Callable[..., OptaxWrapper]:
  """T5X's ``wrap_optax_optimizer``: an optax factory as a factory of definitions
  whose arguments are hyper-parameters (overridable per step).

  Example:
    >>> import optax
    >>> from optcore_flax import optimizers
    >>> optimizers.wrap_optax_optimizer(optax.sgd)(0.1).hyper_params.learning_rate
    0.1
  """
  return _cast(
    _Callable[..., OptaxWrapper],
    _optcore.wrap_optax_optimizer(optax_optimizer, definition_class=OptaxWrapper),
  )


def _chain(transformations: _Any) -> _optax.GradientTransformation:
  """Applies a list of transformations (optax's or optcore definitions) in sequence."""
  return _optax.chain(*transformations)


chain = _optcore.wrap_optax_optimizer(_chain, name="chain", definition_class=OptaxWrapper)


def _t5x(factory: _Callable[..., _Any], name: str) -> _Callable[..., OptaxWrapper]:
  return _cast(
    _Callable[..., OptaxWrapper],
    _optcore.wrap_optax_optimizer(factory, name=name, definition_class=OptaxWrapper),
  )


# Every optax alias (optcore.OPTAX_ALIASES; a test checks the list) and T5X's dpsgd, one per
# line so that IDEs and type checkers see them.
adabelief = _t5x(_optax.adabelief, "adabelief")
adadelta = _t5x(_optax.adadelta, "adadelta")
adafactor = _t5x(_optax.adafactor, "adafactor")
adagrad = _t5x(_optax.adagrad, "adagrad")
adam = _t5x(_optax.adam, "adam")
adamax = _t5x(_optax.adamax, "adamax")
adamaxw = _t5x(_optax.adamaxw, "adamaxw")
adamw = _t5x(_optax.adamw, "adamw")
adan = _t5x(_optax.adan, "adan")
amsgrad = _t5x(_optax.amsgrad, "amsgrad")
fromage = _t5x(_optax.fromage, "fromage")
lamb = _t5x(_optax.lamb, "lamb")
lars = _t5x(_optax.lars, "lars")
lbfgs = _t5x(_optax.lbfgs, "lbfgs")
lion = _t5x(_optax.lion, "lion")
nadam = _t5x(_optax.nadam, "nadam")
nadamw = _t5x(_optax.nadamw, "nadamw")
noisy_sgd = _t5x(_optax.noisy_sgd, "noisy_sgd")
novograd = _t5x(_optax.novograd, "novograd")
polyak_sgd = _t5x(_optax.polyak_sgd, "polyak_sgd")
radam = _t5x(_optax.radam, "radam")
rmsprop = _t5x(_optax.rmsprop, "rmsprop")
rprop = _t5x(_optax.rprop, "rprop")
sgd = _t5x(_optax.sgd, "sgd")
sign_sgd = _t5x(_optax.sign_sgd, "sign_sgd")
signum = _t5x(_optax.signum, "signum")
sm3 = _t5x(_optax.sm3, "sm3")
yogi = _t5x(_optax.yogi, "yogi")
optimistic_gradient_descent = _t5x(
  _optax.optimistic_gradient_descent, "optimistic_gradient_descent"
)
optimistic_adam = _t5x(_optax.optimistic_adam, "optimistic_adam")
optimistic_adam_v2 = _t5x(_optax.optimistic_adam_v2, "optimistic_adam_v2")
dpsgd = _t5x(_optax_contrib.dpsgd, "dpsgd")


def amos(*args: _Any, **kwargs: _Any) -> OptaxWrapper:
  """T5X's ``amos``: jestimator's Amos, wrapped as the other factories are.

  jestimator is its only implementation and not a dependency of optcore; its
  last release (0.3.3) imports ``jax.experimental.pjit.PartitionSpec``, which
  JAX has removed, so on today's JAX this raises ImportError saying so.

  Raises:
    ImportError: when ``jestimator.amos`` cannot be imported.

  Example:
    >>> from optcore_flax import optimizers
    >>> try:
    ...   optimizers.amos(0.01, eta_fn=lambda name, shape: 1.0)
    ... except ImportError as e:
    ...   print(str(e)[:37])
    T5X's amos needs jestimator.amos, but
  """
  try:
    from jestimator import amos as jestimator_amos  # pyright: ignore[reportMissingImports]
  except ImportError as e:
    raise ImportError(
      f"T5X's amos needs jestimator.amos, but it does not import here ({e}). jestimator 0.3.3, "
      "its last release, imports jax.experimental.pjit.PartitionSpec, which today's JAX no "
      "longer has. Pick another optimizer (optimizers.adafactor, adafactor.Adafactor, "
      "optimizers.adamw) or a JAX old enough for jestimator."
    ) from e
  return _t5x(jestimator_amos.amos, "amos")(*args, **kwargs)


__all__ = [
  "Dtype",
  "MultiOptimizer",
  "OptaxStatePartitionRules",
  "OptaxWrapper",
  "Optimizer",
  "OptimizerDef",
  "OptimizerDefType",
  "OptimizerState",
  "OptimizerStateType",
  "OptimizerType",
  "amos",
  "chain",
  "dpsgd",
  "freeze",
  "unfreeze",
  "wrap_optax_optimizer",
  *_optcore.OPTAX_ALIASES,
]
