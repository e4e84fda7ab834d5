"""``flax.optim.adafactor``: flax.optim's Adafactor and its 11 hyper-parameters."""

from optcore.legacy import Adafactor as Adafactor
from optcore.legacy import AdafactorParamState as _AdafactorParamState
from optcore_flax._records import hyper_params_record

_AdafactorHyperParams = hyper_params_record(
  "_AdafactorHyperParams",
  "learning_rate",
  "factored",
  "multiply_by_parameter_scale",
  "beta1",
  "decay_rate",
  "step_offset",
  "clipping_threshold",
  "weight_decay_rate",
  "min_dim_size_to_factor",
  "epsilon1",
  "epsilon2",
)

__all__ = ["Adafactor", "_AdafactorHyperParams", "_AdafactorParamState"]
