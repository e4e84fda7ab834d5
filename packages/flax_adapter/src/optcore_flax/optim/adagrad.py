"""``flax.optim.adagrad``."""

from optcore.legacy import Adagrad as Adagrad
from optcore.legacy import AdagradParamState as _AdagradParamState
from optcore_flax._records import hyper_params_record

_AdagradHyperParams = hyper_params_record("_AdagradHyperParams", "learning_rate", "eps")

__all__ = ["Adagrad", "_AdagradHyperParams", "_AdagradParamState"]
