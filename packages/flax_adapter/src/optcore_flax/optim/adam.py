"""``flax.optim.adam``."""

from optcore.legacy import Adam as Adam
from optcore.legacy import AdamParamState as _AdamParamState
from optcore_flax._records import hyper_params_record

_AdamHyperParams = hyper_params_record(
  "_AdamHyperParams", "learning_rate", "beta1", "beta2", "eps", "weight_decay"
)

__all__ = ["Adam", "_AdamHyperParams", "_AdamParamState"]
