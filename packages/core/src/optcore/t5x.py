"""T5X's Adafactor (``t5x.adafactor``), framework-free.

T5X's names, arguments, defaults, factoring rules and state, as an
`optcore.OptimizerDef`: ``create``, ``apply_gradient`` with overrides,
``state_dict``, ``as_optax()`` and every adapter work with it. The T5X face
(``optcore_flax.adafactor``) gives the same classes under T5X's module name;
``optcore.adafactor`` is optax's adafactor, as every other optax alias.

Example:
  >>> import jax.numpy as jnp
  >>> from optcore.t5x import HEURISTIC_RULE, Adafactor, FactorDim, HParamMap
  >>> rules = HParamMap([(r'attention', (FactorDim.ROW, FactorDim.COLUMN, FactorDim.COLUMN)),
  ...                    (r'.*', HEURISTIC_RULE)])
  >>> opt = Adafactor(1e-2, factor_map=rules).create({'attention': jnp.ones((8, 2, 4))})
  >>> opt.state.param_states['attention'].v_row.shape
  (8,)
"""

from optcore._src.legacy.adafactor import Adafactor as Adafactor
from optcore._src.legacy.adafactor import AdafactorParamState as AdafactorParamState
from optcore._src.legacy.factoring import HEURISTIC_RULE as HEURISTIC_RULE
from optcore._src.legacy.factoring import FactorDim as FactorDim
from optcore._src.legacy.factoring import FactorRule as FactorRule
from optcore._src.legacy.factoring import HeuristicRule as HeuristicRule
from optcore._src.legacy.factoring import HParamMap as HParamMap
from optcore._src.legacy.factoring import factor_name_to_factordim as factor_name_to_factordim
from optcore._src.legacy.factoring import (
  standard_logical_factor_rules as standard_logical_factor_rules,
)

__all__ = [
  "HEURISTIC_RULE",
  "Adafactor",
  "AdafactorParamState",
  "FactorDim",
  "FactorRule",
  "HParamMap",
  "HeuristicRule",
  "factor_name_to_factordim",
  "standard_logical_factor_rules",
]
