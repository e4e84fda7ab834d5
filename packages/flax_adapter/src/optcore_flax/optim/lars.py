"""``flax.optim.lars``."""

from optcore.legacy import LARS as LARS
from optcore.legacy import MomentumParamState as _LARSParamState
from optcore_flax._records import hyper_params_record

_LARSHyperParams = hyper_params_record(
  "_LARSHyperParams",
  "learning_rate",
  "beta",
  "weight_decay",
  "trust_coefficient",
  "eps",
  "nesterov",
)

__all__ = ["LARS", "_LARSHyperParams", "_LARSParamState"]
