"""``flax.optim.rmsprop``."""

from optcore.legacy import RMSProp as RMSProp
from optcore.legacy import RMSPropParamState as _RMSPropParamState
from optcore_flax._records import hyper_params_record

_RMSPropHyperParams = hyper_params_record(
  "_RMSPropHyperParams", "learning_rate", "beta2", "eps", "centered"
)

__all__ = ["RMSProp", "_RMSPropHyperParams", "_RMSPropParamState"]
