"""Partition rules: logical axes for optimizer state, and from them shardings.

The registry of rules per optax state type, the helpers to write a rule, and
the mapping from logical axes to a mesh. The main entry points are also on
`optcore` itself and on every `OptimizerDef` (`derive_logical_axes`,
`derive_shardings`, `create_sharded`).

Example:
  >>> import jax.numpy as jnp, optax
  >>> from jax.sharding import PartitionSpec as P
  >>> from optcore import partitioning
  >>> params = {'w': jnp.zeros((4, 2))}
  >>> axes = partitioning.derive_optax_logical_axes(
  ...     optax.sgd(0.1, momentum=0.9).init(params), {'w': P('embed', 'mlp')}, params)
  >>> partitioning.logical_to_mesh(axes, [('mlp', 'model')])[0].trace == {'w': P(None, 'model')}
  True
"""

from optcore._src.axes.matrix_axes import MATRIX_AXIS_RULES as MATRIX_AXIS_RULES
from optcore._src.axes.matrix_axes import muon_dimension_numbers as muon_dimension_numbers
from optcore._src.axes.partition_rules import OptaxStatePartitionRules as OptaxStatePartitionRules
from optcore._src.axes.partition_rules import PartitionRuleError as PartitionRuleError
from optcore._src.axes.partition_rules import derive_normalized as derive_normalized
from optcore._src.axes.partition_rules import derive_optax_logical_axes as derive_optax_logical_axes
from optcore._src.axes.partition_rules import like_params as like_params
from optcore._src.axes.partition_rules import map_params as map_params
from optcore._src.axes.partition_rules import normalize_param_axes as normalize_param_axes
from optcore._src.axes.partition_rules import register_state_rule as register_state_rule
from optcore._src.axes.partition_rules import replicated as replicated
from optcore._src.axes.partition_rules import rule_for as rule_for
from optcore._src.axes.sharding import LogicalAxisRules as LogicalAxisRules
from optcore._src.axes.sharding import check_divisible as check_divisible
from optcore._src.axes.sharding import logical_to_mesh as logical_to_mesh
from optcore._src.axes.sharding import logical_to_mesh_axes as logical_to_mesh_axes
from optcore._src.axes.sharding import logical_to_mesh_sharding as logical_to_mesh_sharding
from optcore._src.optimizers.shampoo import shampoo_roles as shampoo_roles
from optcore._src.optimizers.soap import soap_roles as soap_roles

__all__ = [
  "MATRIX_AXIS_RULES",
  "LogicalAxisRules",
  "OptaxStatePartitionRules",
  "PartitionRuleError",
  "check_divisible",
  "derive_normalized",
  "derive_optax_logical_axes",
  "like_params",
  "logical_to_mesh",
  "logical_to_mesh_axes",
  "logical_to_mesh_sharding",
  "map_params",
  "muon_dimension_numbers",
  "normalize_param_axes",
  "register_state_rule",
  "replicated",
  "rule_for",
  "shampoo_roles",
  "soap_roles",
]
