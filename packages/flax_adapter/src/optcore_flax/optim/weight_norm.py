"""``flax.optim.weight_norm``."""

from optcore.legacy import WeightNorm as WeightNorm
from optcore.legacy import WeightNormParamState as _WeightNormParamState
from optcore_flax._records import hyper_params_record

_WeightNormHyperParams = hyper_params_record(
  "_WeightNormHyperParams", "inner", "wn_decay", "wn_eps"
)

__all__ = ["WeightNorm", "_WeightNormHyperParams", "_WeightNormParamState"]
