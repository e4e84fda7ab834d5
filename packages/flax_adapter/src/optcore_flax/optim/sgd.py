"""``flax.optim.sgd``."""

from optcore.legacy import GradientDescent as GradientDescent
from optcore_flax._records import hyper_params_record

_GradientDescentHyperParams = hyper_params_record("_GradientDescentHyperParams", "learning_rate")

__all__ = ["GradientDescent", "_GradientDescentHyperParams"]
