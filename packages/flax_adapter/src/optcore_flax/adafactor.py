"""The ``t5x.adafactor`` surface, on optcore: swap the import, keep the gin config.

Example:
  >>> from optcore_flax import adafactor
  >>> adafactor.Adafactor(learning_rate=1e-2, decay_rate=0.8).hyper_params.decay_rate
  0.8
"""

from optcore.adafactor import HEURISTIC_RULE as HEURISTIC_RULE
from optcore.adafactor import Adafactor as Adafactor
from optcore.adafactor import FactorDim as FactorDim
from optcore.adafactor import HParamMap as HParamMap
from optcore.adafactor import factor_name_to_factordim as factor_name_to_factordim
from optcore.adafactor import standard_logical_factor_rules as standard_logical_factor_rules

__all__ = [
  "HEURISTIC_RULE",
  "Adafactor",
  "FactorDim",
  "HParamMap",
  "factor_name_to_factordim",
  "standard_logical_factor_rules",
]
