"""``flax.optim.momentum``."""

from optcore.legacy import Momentum as Momentum
from optcore.legacy import MomentumParamState as _MomentumParamState
from optcore_flax._records import hyper_params_record

_MomentumHyperParams = hyper_params_record(
  "_MomentumHyperParams", "learning_rate", "beta", "weight_decay", "nesterov"
)

__all__ = ["Momentum", "_MomentumHyperParams", "_MomentumParamState"]
