"""``flax.optim.base``: the definition, the state, the container, MultiOptimizer."""

from typing import Any

from flax import traverse_util

from optcore import MultiOptimizer as MultiOptimizer
from optcore import Optimizer as Optimizer
from optcore import OptimizerDef as OptimizerDef
from optcore import OptimizerState as OptimizerState
from optcore.legacy import ReplicatedOptimizer as ReplicatedOptimizer


class ModelParamTraversal(traverse_util.ModelParamTraversal):
  """flax.optim's ``ModelParamTraversal``: Flax's own, so it raises Flax's
  ValueError on anything but a params dict, without the deprecation warning
  today's Flax gives every traversal (flax.optim 0.5.3 gave none).

  Example:
    >>> from optcore_flax import optim
    >>> kernels = optim.ModelParamTraversal(lambda path, _: path.endswith('/kernel'))
    >>> list(kernels.iterate({'dense': {'kernel': 1, 'bias': 2}}))
    [1]
  """

  def __new__(cls, *args: Any, **kwargs: Any) -> "ModelParamTraversal":
    return object.__new__(cls)


__all__ = [
  "ModelParamTraversal",
  "MultiOptimizer",
  "Optimizer",
  "OptimizerDef",
  "OptimizerState",
  "ReplicatedOptimizer",
]
