"""optcore: one optimizer core for JAX.

Every optax optimizer as an `OptimizerDef` (``optcore.adam``, ``optcore.sgd``,
... and ``optcore.contrib.<name>``), with per-step hyper-parameter overrides
that take effect, the immutable `Optimizer` container of flax.optim and T5X,
and state dicts in Flax's layout.

Example:
  >>> import jax, jax.numpy as jnp
  >>> import optcore
  >>> params = {'w': jnp.ones(3)}
  >>> opt = optcore.adam(learning_rate=1e-2).create(params)
  >>> grads = jax.grad(lambda p: jnp.sum(p['w'] ** 2))(opt.target)
  >>> opt = opt.apply_gradient(grads, learning_rate=1e-3)
  >>> int(opt.state.step)
  1
"""

import sys as _sys
import warnings as _warnings
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

import optax as _optax

from optcore import adapter as adapter
from optcore import config as config
from optcore import contrib as contrib
from optcore import legacy as legacy
from optcore import partitioning as partitioning
from optcore import schedules as schedules
from optcore import t5x as t5x
from optcore._src.axes import optax_rules as _optax_rules  # noqa: F401  (registers optax state rules)
from optcore._src.axes.partition_rules import OptaxStatePartitionRules as OptaxStatePartitionRules
from optcore._src.axes.partition_rules import PartitionRuleError as PartitionRuleError
from optcore._src.axes.partition_rules import derive_optax_logical_axes as derive_optax_logical_axes
from optcore._src.axes.partition_rules import register_state_rule as register_state_rule
from optcore._src.axes.sharding import logical_to_mesh as logical_to_mesh
from optcore._src.axes.sharding import logical_to_mesh_axes as logical_to_mesh_axes
from optcore._src.axes.sharding import logical_to_mesh_sharding as logical_to_mesh_sharding
from optcore._src.containers.optimizer import Optimizer as Optimizer
from optcore._src.containers.state_axes import Placement as Placement
from optcore._src.definitions.base import OptimizerDef as OptimizerDef
from optcore._src.definitions.multi_optimizer import MultiOptimizer as MultiOptimizer
from optcore._src.definitions.optax_aliases import OPTAX_ALIASES as OPTAX_ALIASES
from optcore._src.definitions.optax_aliases import adabelief as adabelief
from optcore._src.definitions.optax_aliases import adadelta as adadelta
from optcore._src.definitions.optax_aliases import adafactor as adafactor
from optcore._src.definitions.optax_aliases import adagrad as adagrad
from optcore._src.definitions.optax_aliases import adam as adam
from optcore._src.definitions.optax_aliases import adamax as adamax
from optcore._src.definitions.optax_aliases import adamaxw as adamaxw
from optcore._src.definitions.optax_aliases import adamw as adamw
from optcore._src.definitions.optax_aliases import adan as adan
from optcore._src.definitions.optax_aliases import amsgrad as amsgrad
from optcore._src.definitions.optax_aliases import fromage as fromage
from optcore._src.definitions.optax_aliases import lamb as lamb
from optcore._src.definitions.optax_aliases import lars as lars
from optcore._src.definitions.optax_aliases import lbfgs as lbfgs
from optcore._src.definitions.optax_aliases import lion as lion
from optcore._src.definitions.optax_aliases import nadam as nadam
from optcore._src.definitions.optax_aliases import nadamw as nadamw
from optcore._src.definitions.optax_aliases import noisy_sgd as noisy_sgd
from optcore._src.definitions.optax_aliases import novograd as novograd
from optcore._src.definitions.optax_aliases import optimistic_adam as optimistic_adam
from optcore._src.definitions.optax_aliases import optimistic_adam_v2 as optimistic_adam_v2
from optcore._src.definitions.optax_aliases import (
  optimistic_gradient_descent as optimistic_gradient_descent,
)
from optcore._src.definitions.optax_aliases import polyak_sgd as polyak_sgd
from optcore._src.definitions.optax_aliases import radam as radam
from optcore._src.definitions.optax_aliases import rmsprop as rmsprop
from optcore._src.definitions.optax_aliases import rprop as rprop
from optcore._src.definitions.optax_aliases import sgd as sgd
from optcore._src.definitions.optax_aliases import sign_sgd as sign_sgd
from optcore._src.definitions.optax_aliases import signum as signum
from optcore._src.definitions.optax_aliases import sm3 as sm3
from optcore._src.definitions.optax_aliases import yogi as yogi
from optcore._src.definitions.optax_wrapper import ELEMENTWISE_OPTAX as ELEMENTWISE_OPTAX
from optcore._src.definitions.optax_wrapper import OptaxWrapper as OptaxWrapper
from optcore._src.definitions.optax_wrapper import chain as chain
from optcore._src.definitions.optax_wrapper import wrap_optax_optimizer as wrap_optax_optimizer
from optcore._src.ground.arguments import ArgumentError as ArgumentError
from optcore._src.ground.checks import MissingHyperParameterError as MissingHyperParameterError
from optcore._src.ground.checks import TreeMismatchError as TreeMismatchError
from optcore._src.ground.checks import check_gradients as check_gradients
from optcore._src.ground.declarations import Count as Count
from optcore._src.ground.declarations import FirstMoment as FirstMoment
from optcore._src.ground.declarations import Nested as Nested
from optcore._src.ground.declarations import ParamShaped as ParamShaped
from optcore._src.ground.declarations import Replicated as Replicated
from optcore._src.ground.declarations import SecondMoment as SecondMoment
from optcore._src.ground.declarations import UndeclaredStateError as UndeclaredStateError
from optcore._src.ground.declarations import declare_state as declare_state
from optcore._src.ground.declarations import declared_fields as declared_fields
from optcore._src.ground.grouped_layout import GroupedParams as GroupedParams
from optcore._src.ground.hyper_params import HyperParams as HyperParams
from optcore._src.ground.paths import register_hidden_level as register_hidden_level
from optcore._src.ground.state import OptimizerState as OptimizerState
from optcore._src.ground.traversal import ModelParamTraversal as ModelParamTraversal
from optcore._src.ground.traversal import SelectorError as SelectorError
from optcore._src.ground.traversal import leaves_with_paths as leaves_with_paths
from optcore._src.ground.traversal import register_selector_type as register_selector_type
from optcore._src.ground.traversal import selector_mask as selector_mask
from optcore._src.persistence.quantization import QuantizedArray as QuantizedArray
from optcore._src.persistence.quantization import dequantize_state as dequantize_state
from optcore._src.persistence.serialization import StateDictError as StateDictError
from optcore._src.persistence.serialization import from_state_dict as from_state_dict
from optcore._src.persistence.serialization import to_state_dict as to_state_dict
from optcore._src.persistence.transplant import TransplantEntry as TransplantEntry
from optcore._src.persistence.transplant import TransplantReport as TransplantReport
from optcore._src.persistence.transplant import transplant as transplant
from optcore._src.readouts import current_hyper_params as current_hyper_params
from optcore._src.readouts import ema_params as ema_params
from optcore._src.readouts import eval_params as eval_params
from optcore._src.readouts import skipped_steps as skipped_steps
from optcore._src.readouts import statistics as statistics
from optcore._src.wrappers.accumulate import Accumulate as Accumulate
from optcore._src.wrappers.accumulate import AccumulateState as AccumulateState
from optcore._src.wrappers.accumulate import accumulate as accumulate
from optcore._src.wrappers.cautious import Cautious as Cautious
from optcore._src.wrappers.cautious import CautiousState as CautiousState
from optcore._src.wrappers.cautious import cautious as cautious
from optcore._src.wrappers.diloco import DiLoCo as DiLoCo
from optcore._src.wrappers.diloco import DiLoCoState as DiLoCoState
from optcore._src.wrappers.diloco import diloco as diloco
from optcore._src.wrappers.ema import Ema as Ema
from optcore._src.wrappers.ema import EmaState as EmaState
from optcore._src.wrappers.ema import ema as ema
from optcore._src.wrappers.grouped import Grouped as Grouped
from optcore._src.wrappers.grouped import GroupedOptimizer as GroupedOptimizer
from optcore._src.wrappers.grouped import UngroupableError as UngroupableError
from optcore._src.wrappers.grouped import grouped as grouped
from optcore._src.wrappers.low_bit import SECOND_MOMENTS as _SECOND_MOMENTS
from optcore._src.wrappers.low_bit import LowBitState as LowBitState
from optcore._src.wrappers.low_bit import LowBitStateDef as LowBitStateDef
from optcore._src.wrappers.low_bit import low_bit_state as low_bit_state
from optcore._src.wrappers.mixed_precision import MixedPrecision as MixedPrecision
from optcore._src.wrappers.mixed_precision import MixedPrecisionState as MixedPrecisionState
from optcore._src.wrappers.mixed_precision import mixed_precision as mixed_precision
from optcore._src.wrappers.multipliers import Multipliers as Multipliers
from optcore._src.wrappers.multipliers import multipliers as multipliers
from optcore._src.wrappers.multipliers import mup as mup
from optcore._src.wrappers.qk_clip import QKClip as QKClip
from optcore._src.wrappers.qk_clip import QKClipState as QKClipState
from optcore._src.wrappers.qk_clip import qk_clip as qk_clip
from optcore._src.wrappers.skip import SkipBadSteps as SkipBadSteps
from optcore._src.wrappers.skip import SkipState as SkipState
from optcore._src.wrappers.skip import skip_bad_steps as skip_bad_steps
from optcore._src.wrappers.statistics import GroupNorms as GroupNorms
from optcore._src.wrappers.statistics import StatisticsState as StatisticsState
from optcore._src.wrappers.statistics import WithStatistics as WithStatistics
from optcore._src.wrappers.statistics import with_statistics as with_statistics
from optcore._src.wrappers.stochastic_rounding import StochasticRounding as StochasticRounding
from optcore._src.wrappers.stochastic_rounding import (
  StochasticRoundingState as StochasticRoundingState,
)
from optcore._src.wrappers.stochastic_rounding import stochastic_rounding as stochastic_rounding
from optcore._src.wrappers.zclip import ZClip as ZClip
from optcore._src.wrappers.zclip import ZClipState as ZClipState
from optcore._src.wrappers.zclip import zclip as zclip
from optcore.contrib import CONTRIB_OPTIMIZERS as _CONTRIB_OPTIMIZERS

try:
  __version__ = _version("optcore")
except _PackageNotFoundError:  # running from a source tree that is not installed
  __version__ = "0.0.0+unknown"


def __getattr__(name: str):
  """Points optax names that optcore does not wrap at the right place; deprecated names warn."""
  if name == "SECOND_MOMENTS":
    _warnings.warn(
      "optcore.SECOND_MOMENTS is deprecated and read by nothing: a state type declares its "
      "second moments on its fields (optcore.SecondMoment); optcore.declared_fields(type) "
      "reads them",
      DeprecationWarning,
      stacklevel=2,
    )
    return _SECOND_MOMENTS
  if name in _CONTRIB_OPTIMIZERS:
    raise AttributeError(
      f"optcore has no {name!r}: it is in optax.contrib, use optcore.contrib.{name}"
    )
  if not name.startswith("_") and name in getattr(_optax, "__all__", ()):
    raise AttributeError(
      f"optcore has no {name!r}: optcore wraps optimizers, and optax.{name} is not one. Use it as "
      f"it is, inside a chain: optcore.chain([optax.{name}(...), optcore.sgd(...)]), or wrap it: "
      f"optcore.wrap_optax_optimizer(optax.{name})(...)"
    )
  # name/obj let Python add its "Did you mean: 'adam'?" to the message.
  raise AttributeError(
    f"module 'optcore' has no attribute {name!r}", name=name, obj=_sys.modules[__name__]
  )


__all__ = [
  "ELEMENTWISE_OPTAX",
  "OPTAX_ALIASES",
  "Accumulate",
  "AccumulateState",
  "ArgumentError",
  "Cautious",
  "CautiousState",
  "Count",
  "DiLoCo",
  "DiLoCoState",
  "Ema",
  "EmaState",
  "FirstMoment",
  "GroupNorms",
  "Grouped",
  "GroupedOptimizer",
  "GroupedParams",
  "HyperParams",
  "LowBitState",
  "LowBitStateDef",
  "MissingHyperParameterError",
  "MixedPrecision",
  "MixedPrecisionState",
  "ModelParamTraversal",
  "MultiOptimizer",
  "Multipliers",
  "Nested",
  "OptaxStatePartitionRules",
  "OptaxWrapper",
  "Optimizer",
  "OptimizerDef",
  "OptimizerState",
  "ParamShaped",
  "PartitionRuleError",
  "Placement",
  "QKClip",
  "QKClipState",
  "QuantizedArray",
  "Replicated",
  "SecondMoment",
  "SelectorError",
  "SkipBadSteps",
  "SkipState",
  "StateDictError",
  "StatisticsState",
  "StochasticRounding",
  "StochasticRoundingState",
  "TransplantEntry",
  "TransplantReport",
  "TreeMismatchError",
  "UndeclaredStateError",
  "UngroupableError",
  "WithStatistics",
  "ZClip",
  "ZClipState",
  "accumulate",
  "adabelief",
  "adadelta",
  "adafactor",
  "adagrad",
  "adam",
  "adamax",
  "adamaxw",
  "adamw",
  "adan",
  "adapter",
  "amsgrad",
  "cautious",
  "chain",
  "check_gradients",
  "config",
  "contrib",
  "current_hyper_params",
  "declare_state",
  "declared_fields",
  "dequantize_state",
  "derive_optax_logical_axes",
  "diloco",
  "ema",
  "ema_params",
  "eval_params",
  "from_state_dict",
  "fromage",
  "grouped",
  "lamb",
  "lars",
  "lbfgs",
  "leaves_with_paths",
  "legacy",
  "lion",
  "logical_to_mesh",
  "logical_to_mesh_axes",
  "logical_to_mesh_sharding",
  "low_bit_state",
  "mixed_precision",
  "multipliers",
  "mup",
  "nadam",
  "nadamw",
  "noisy_sgd",
  "novograd",
  "optimistic_adam",
  "optimistic_adam_v2",
  "optimistic_gradient_descent",
  "partitioning",
  "polyak_sgd",
  "qk_clip",
  "radam",
  "register_hidden_level",
  "register_selector_type",
  "register_state_rule",
  "rmsprop",
  "rprop",
  "schedules",
  "selector_mask",
  "sgd",
  "sign_sgd",
  "signum",
  "skip_bad_steps",
  "skipped_steps",
  "sm3",
  "statistics",
  "stochastic_rounding",
  "t5x",
  "to_state_dict",
  "transplant",
  "with_statistics",
  "wrap_optax_optimizer",
  "yogi",
  "zclip",
]
