"""``flax.optim.adadelta``."""

from optcore.legacy import Adadelta as Adadelta
from optcore.legacy import AdadeltaParamState as _AdadeltaParamState
from optcore_flax._records import hyper_params_record

_AdadeltaHyperParams = hyper_params_record(
  "_AdadeltaHyperParams", "learning_rate", "rho", "eps", "weight_decay"
)

__all__ = ["Adadelta", "_AdadeltaHyperParams", "_AdadeltaParamState"]
