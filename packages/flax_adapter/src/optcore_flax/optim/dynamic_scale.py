"""``flax.optim.dynamic_scale``."""

from optcore.legacy import DynamicScale as DynamicScale
from optcore.legacy import DynamicScaleResult as DynamicScaleResult

__all__ = ["DynamicScale", "DynamicScaleResult"]
