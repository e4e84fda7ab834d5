"""T5X's Adafactor (``t5x.adafactor``), framework-free; also optax's adafactor.

``from optcore.adafactor import Adafactor, FactorDim, HParamMap,
standard_logical_factor_rules`` gives T5X's surface. The module itself stays
callable as every other optax alias: ``optcore.adafactor(learning_rate=...)``
is optax's adafactor as an `optcore.OptaxWrapper`.

Example:
  >>> import jax.numpy as jnp
  >>> import optcore
  >>> from optcore.adafactor import Adafactor, FactorDim, HParamMap
  >>> rules = HParamMap([(r'attention', (FactorDim.ROW, FactorDim.COLUMN, FactorDim.COLUMN)),
  ...                    (r'.*', optcore.adafactor.HEURISTIC_RULE)])
  >>> opt = Adafactor(1e-2, factor_map=rules).create({'attention': jnp.ones((8, 2, 4))})
  >>> opt.state.param_states['attention'].v_row.shape
  (8,)
  >>> type(optcore.adafactor(1e-3)).__name__  # optax's adafactor, wrapped
  'OptaxWrapper'
"""

import inspect as _inspect
import sys as _sys
import types as _types

import optax as _optax

from optcore._src.adafactor import HEURISTIC_RULE as HEURISTIC_RULE
from optcore._src.adafactor import Adafactor as Adafactor
from optcore._src.adafactor import FactorDim as FactorDim
from optcore._src.adafactor import FactorRule as FactorRule
from optcore._src.adafactor import HeuristicRule as HeuristicRule
from optcore._src.adafactor import HParamMap as HParamMap
from optcore._src.adafactor import factor_name_to_factordim as factor_name_to_factordim
from optcore._src.adafactor import standard_logical_factor_rules as standard_logical_factor_rules
from optcore._src.optax_wrapper import wrap_optax_optimizer as _wrap

_optax_adafactor = _wrap(_optax.adafactor, name="adafactor")


class _CallableModule(_types.ModuleType):
  """This module, callable as optax's adafactor (``optcore.adafactor(...)``)."""

  def __call__(self, *args, **kwargs):
    return _optax_adafactor(*args, **kwargs)


_module = _sys.modules[__name__]
_module.__class__ = _CallableModule
_module.__signature__ = _inspect.signature(_optax_adafactor)
_module.__wrapped__ = _optax_adafactor

__all__ = [
  "HEURISTIC_RULE",
  "Adafactor",
  "FactorDim",
  "FactorRule",
  "HParamMap",
  "HeuristicRule",
  "factor_name_to_factordim",
  "standard_logical_factor_rules",
]
