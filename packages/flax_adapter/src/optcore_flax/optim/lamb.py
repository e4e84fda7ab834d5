"""``flax.optim.lamb``."""

from optcore.legacy import LAMB as LAMB
from optcore.legacy import AdamParamState as _LAMBParamState
from optcore_flax._records import hyper_params_record

_LAMBHyperParams = hyper_params_record(
  "_LAMBHyperParams", "learning_rate", "beta1", "beta2", "weight_decay", "eps"
)

__all__ = ["LAMB", "_LAMBHyperParams", "_LAMBParamState"]
