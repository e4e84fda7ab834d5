"""The ``t5x.adafactor`` surface, on optcore: swap the import, keep the gin config.

`Adafactor` is T5X's, with T5X's factor-rule parsing, T5X's
``_AdafactorHyperParams`` (its 17 fields) and ``_AdafactorParamState``
(``v_row, v_col, v, m``), which T5X's own tests build expected values with.
The step-offset NaN of T5X is fixed (see `optcore.t5x`).

Example:
  >>> from optcore_flax import adafactor
  >>> opt_def = adafactor.Adafactor(learning_rate=1e-2, decay_rate=0.8)
  >>> opt_def.hyper_params == adafactor._AdafactorHyperParams(
  ...     1e-2, True, True, None, 0.8, 0, 1.0, None, 128, 1e-30, 1e-3)
  True
"""

import inspect as _inspect
from typing import Any as _Any

import optcore.t5x as _core_t5x
from optcore.t5x import HEURISTIC_RULE as HEURISTIC_RULE
from optcore.t5x import AdafactorParamState as _AdafactorParamState
from optcore.t5x import FactorDim as FactorDim
from optcore.t5x import FactorRule as FactorRule
from optcore.t5x import HeuristicRule as HeuristicRule
from optcore.t5x import HParamMap as HParamMap
from optcore.t5x import factor_name_to_factordim as factor_name_to_factordim
from optcore.t5x import standard_logical_factor_rules as standard_logical_factor_rules
from optcore_flax._records import hyper_params_record as _record
from optcore_flax._t5x import T5XFace as _T5XFace
from optcore_flax._t5x import set_in_place as _set_in_place
from optcore_flax.optim.adafactor import _AdafactorHyperParams as _flax_optim_record

#: T5X's alias for a dtype argument (``dtype_momentum``).
Dtype = _Any


class Adafactor(_T5XFace, _core_t5x.Adafactor):
  __doc__ = _core_t5x.Adafactor.__doc__

  def with_param_axes(self, param_logical_axes: _Any) -> "Adafactor":
    """`optcore.t5x.Adafactor.with_param_axes` with T5X's ``factor_map``: a plain dict from
    each '/'-joined parameter name to its rule, as T5X's own tests read it."""
    return self.with_factor_map(self.factor_rules(param_logical_axes))

  def set_param_axes(self, param_logical_axes: _Any) -> None:
    """T5X's ``set_param_axes``, in place as T5X's: ``hyper_params.factor_map`` becomes T5X's plain
    dict from each '/'-joined parameter name to its rule (a FactorDim per dimension). A rule of
    rank <= 2 without BATCH is logged and falls back to the size heuristic when the state is made.
    A shim for T5X programs: the core's definitions are immutable (`with_param_axes` returns a
    new one). After this definition has made a state it raises instead: the optimizers built on
    it would no longer fit their own state.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> from optcore_flax import adafactor
      >>> opt_def = adafactor.Adafactor(0.1)
      >>> opt_def.set_param_axes({'dense': {'kernel': P('vocab', 'embed')}})
      >>> opt_def.hyper_params.factor_map
      {'dense/kernel': (<FactorDim.COLUMN: 3>, <FactorDim.ROW: 2>)}
    """
    _set_in_place(self, self.with_param_axes(param_logical_axes))

  def init_state(self, params: _Any) -> _Any:
    self.__dict__["_made_state"] = True  # set_param_axes may not change it any more
    return super().init_state(params)


# flax.optim's 11 fields, then T5X's 6 additions with their defaults.
_AdafactorHyperParams = _record(
  "_AdafactorHyperParams",
  *_inspect.signature(_flax_optim_record).parameters,
  "factor_map",
  "logical_factor_rules",
  "weight_decay_rate_lr_exponent",
  "global_norm_clip_threshold",
  "max_parameter_scale",
  "skip_nan_updates",
  factor_map=None,
  logical_factor_rules=None,
  weight_decay_rate_lr_exponent=None,
  global_norm_clip_threshold=None,
  max_parameter_scale=None,
  skip_nan_updates=False,
)

__all__ = [
  "HEURISTIC_RULE",
  "Adafactor",
  "Dtype",
  "FactorDim",
  "FactorRule",
  "HParamMap",
  "HeuristicRule",
  "_AdafactorHyperParams",
  "_AdafactorParamState",
  "factor_name_to_factordim",
  "standard_logical_factor_rules",
]
