"""The flax.optim (v0.5.3) algorithms with their original numerics, framework-free.

Same names, arguments, defaults and state field names as flax.optim, as
per-parameter `optcore.OptimizerDef` objects: ``create``, ``apply_gradient`` with
overrides, ``state_dict`` (flax.optim's keys), ``as_optax()`` and every
adapter work with them.

Each one's per-parameter state is a NamedTuple with flax.optim's field names
(`AdamParamState`, `MomentumParamState`, ...); their field names are the
state dict's keys.

Example:
  >>> import jax.numpy as jnp
  >>> from optcore import legacy
  >>> opt = legacy.Adam(learning_rate=0.1).create({'w': jnp.ones(2)})
  >>> opt = opt.apply_gradient({'w': jnp.ones(2)}, learning_rate=0.05)
  >>> round(float(opt.target['w'][0]), 5), sorted(opt.state_dict()['state']['param_states']['w'])
  (0.95, ['grad_ema', 'grad_sq_ema'])
"""

from optcore._src.definitions.base import ReplicatedOptimizer as ReplicatedOptimizer
from optcore._src.legacy.adafactor import AdafactorParamState as AdafactorParamState
from optcore._src.legacy.adafactor import LegacyAdafactor as Adafactor
from optcore._src.legacy.dynamic_scale import DynamicScale as DynamicScale
from optcore._src.legacy.dynamic_scale import DynamicScaleResult as DynamicScaleResult
from optcore._src.legacy.legacy import LAMB as LAMB
from optcore._src.legacy.legacy import LARS as LARS
from optcore._src.legacy.legacy import AdaBelief as AdaBelief
from optcore._src.legacy.legacy import Adadelta as Adadelta
from optcore._src.legacy.legacy import AdadeltaParamState as AdadeltaParamState
from optcore._src.legacy.legacy import Adagrad as Adagrad
from optcore._src.legacy.legacy import AdagradParamState as AdagradParamState
from optcore._src.legacy.legacy import Adam as Adam
from optcore._src.legacy.legacy import AdamParamState as AdamParamState
from optcore._src.legacy.legacy import GradientDescent as GradientDescent
from optcore._src.legacy.legacy import Momentum as Momentum
from optcore._src.legacy.legacy import MomentumParamState as MomentumParamState
from optcore._src.legacy.legacy import RMSProp as RMSProp
from optcore._src.legacy.legacy import RMSPropParamState as RMSPropParamState
from optcore._src.legacy.weight_norm import WeightNorm as WeightNorm
from optcore._src.legacy.weight_norm import WeightNormParamState as WeightNormParamState

__all__ = [
  "LAMB",
  "LARS",
  "AdaBelief",
  "Adadelta",
  "AdadeltaParamState",
  "Adafactor",
  "AdafactorParamState",
  "Adagrad",
  "AdagradParamState",
  "Adam",
  "AdamParamState",
  "DynamicScale",
  "DynamicScaleResult",
  "GradientDescent",
  "Momentum",
  "MomentumParamState",
  "RMSProp",
  "RMSPropParamState",
  "ReplicatedOptimizer",
  "WeightNorm",
  "WeightNormParamState",
]
