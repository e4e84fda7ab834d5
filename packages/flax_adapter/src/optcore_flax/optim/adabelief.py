"""``flax.optim.adabelief``."""

from optcore.legacy import AdaBelief as AdaBelief
from optcore.legacy import AdamParamState as _AdaBeliefParamState
from optcore_flax._records import hyper_params_record

_AdaBeliefHyperParams = hyper_params_record(
  "_AdaBeliefHyperParams", "learning_rate", "beta1", "beta2", "eps", "weight_decay"
)

__all__ = ["AdaBelief", "_AdaBeliefHyperParams", "_AdaBeliefParamState"]
