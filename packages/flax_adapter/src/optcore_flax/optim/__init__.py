"""The flax.optim (v0.5.3) surface, on optcore.

Import it as ``from optcore_flax import optim``; after
`optcore_flax.install_legacy_namespace()` the old ``from flax import optim``
gives this module. Definitions, numerics and state dicts are flax.optim's;
`Optimizer` is registered with ``flax.serialization``.

flax.optim's submodules are here too (``optim.adam``, ``optim.sgd``,
``optim.adafactor``, ``optim.weight_norm``, ...), each with the original's
private records: ``_AdamHyperParams(...)`` builds hyper-parameters equal to
``Adam(...).hyper_params`` and ``_AdamParamState`` is Adam's per-parameter
state, so programs and tests that import them run unchanged.

Example:
  >>> import jax.numpy as jnp
  >>> from optcore_flax import optim
  >>> optimizer = optim.Momentum(learning_rate=0.1, beta=0.9).create({'w': jnp.ones(2)})
  >>> optimizer = optimizer.apply_gradient({'w': jnp.ones(2)}, learning_rate=0.05)
  >>> optimizer.target['w']
  Array([0.95, 0.95], dtype=float32)
"""

from optcore import MultiOptimizer as MultiOptimizer
from optcore import Optimizer as Optimizer
from optcore import OptimizerDef as OptimizerDef
from optcore import OptimizerState as OptimizerState
from optcore.legacy import LAMB as LAMB
from optcore.legacy import LARS as LARS
from optcore.legacy import AdaBelief as AdaBelief
from optcore.legacy import Adadelta as Adadelta
from optcore.legacy import Adafactor as Adafactor
from optcore.legacy import Adagrad as Adagrad
from optcore.legacy import Adam as Adam
from optcore.legacy import DynamicScale as DynamicScale
from optcore.legacy import GradientDescent as GradientDescent
from optcore.legacy import Momentum as Momentum
from optcore.legacy import RMSProp as RMSProp
from optcore.legacy import WeightNorm as WeightNorm
from optcore_flax.optim import adabelief as adabelief
from optcore_flax.optim import adadelta as adadelta
from optcore_flax.optim import adafactor as adafactor
from optcore_flax.optim import adagrad as adagrad
from optcore_flax.optim import adam as adam
from optcore_flax.optim import base as base
from optcore_flax.optim import dynamic_scale as dynamic_scale
from optcore_flax.optim import lamb as lamb
from optcore_flax.optim import lars as lars
from optcore_flax.optim import momentum as momentum
from optcore_flax.optim import rmsprop as rmsprop
from optcore_flax.optim import sgd as sgd
from optcore_flax.optim import weight_norm as weight_norm
from optcore_flax.optim.base import ModelParamTraversal as ModelParamTraversal

#: flax.optim's submodules, registered as ``flax.optim.<name>`` by
#: `optcore_flax.install_legacy_namespace`.
SUBMODULES = (
  "adabelief",
  "adadelta",
  "adafactor",
  "adagrad",
  "adam",
  "base",
  "dynamic_scale",
  "lamb",
  "lars",
  "momentum",
  "rmsprop",
  "sgd",
  "weight_norm",
)

__all__ = [
  "LAMB",
  "LARS",
  "AdaBelief",
  "Adadelta",
  "Adafactor",
  "Adagrad",
  "Adam",
  "DynamicScale",
  "GradientDescent",
  "ModelParamTraversal",
  "Momentum",
  "MultiOptimizer",
  "Optimizer",
  "OptimizerDef",
  "OptimizerState",
  "RMSProp",
  "WeightNorm",
]
