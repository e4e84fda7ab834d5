"""Which dimensions of a parameter form Muon's matrix, from its logical axes.

optax's ``muon`` must be told, per parameter, which dimensions are the
matrix's reduction and output dimensions (``MuonDimensionNumbers``); every
other dimension is a batch dimension. Its default guesses from the rank (2-D
parameters are matrices, everything else goes to its Adam branch), so a
stacked (scanned) layer of shape ``(layers, embed, mlp)`` goes to Adam. The
logical axes say it exactly. A rule table, the same shape as T5X Adafactor's
factor rules (axis name -> role), gives each axis name a role:

- ``"matrix"``: a dimension of the matrix (``embed``, ``mlp``, ``heads``, ...);
- ``"batch"``: an independent copy (``layers``, ``stack``, ``experts``);
- ``"adam"``: a parameter with this axis goes to the Adam branch (``vocab``:
  embedding tables and output heads, as Muon's authors recommend).

Among the matrix dimensions, ``embed`` (the model dimension) is one side of
the matrix on its own: the reduction side where it comes first (``wi``,
``query``: ``embed -> mlp``), the output side where it comes last (``wo``,
``out``: ``mlp -> embed``). Without ``embed``, the first matrix dimension is
the reduction side and the others the output side. Vectors, scalars and
stacks of vectors (fewer than two matrix dimensions) go to the Adam branch;
a parameter of rank 2 or more with an axis no rule names, or no axis name,
raises, naming its path and the axis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec
from optax import contrib as optax_contrib

from optcore._src.axes.partition_rules import PartitionRuleError
from optcore._src.ground import paths

PyTree = Any

#: The default rule table of `optcore.contrib.muon`: logical axis name -> "matrix",
#: "batch" or "adam" (see `muon_dimension_numbers`).
MATRIX_AXIS_RULES: Mapping[str, str] = MappingProxyType(
  {
    "embed": "matrix",
    "mlp": "matrix",
    "heads": "matrix",
    "kv": "matrix",
    "joined_kv": "matrix",
    "q_heads": "matrix",
    "kv_heads": "matrix",
    "layers": "batch",
    "stack": "batch",
    "experts": "batch",
    "vocab": "adam",
  }
)  # read-only: add names per optimizer with matrix_rules=, never to every program's table
ROLES = ("matrix", "batch", "adam")
MODEL_AXIS = "embed"


def muon_dimension_numbers(
  params: PyTree, param_logical_axes: PyTree, rules: Mapping[str, str] | None = None
) -> PyTree:
  """Per parameter, its ``MuonDimensionNumbers``, or None for the Adam branch.

  Args:
    params: the parameters (arrays or abstract arrays).
    param_logical_axes: one `PartitionSpec` (or tuple of names, or None) per
      parameter, as for `OptimizerDef.create_sharded`.
    rules: axis name -> role, added to (and overriding) `MATRIX_AXIS_RULES`.

  Returns:
    A tree of the parameters' structure.

  Raises:
    PartitionRuleError: a parameter of rank 2 or more has an axis no rule
      names (or no axis name at all).

  Example:
    >>> import jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> from optcore.partitioning import muon_dimension_numbers
    >>> params = {'wi': jnp.zeros((4, 8, 16)), 'emb': jnp.zeros((32, 8)), 'b': jnp.zeros(16)}
    >>> axes = {'wi': P('layers', 'embed', 'mlp'), 'emb': P('vocab', 'embed'), 'b': P('mlp')}
    >>> muon_dimension_numbers(params, axes)
    {'b': None, 'emb': None, 'wi': MuonDimensionNumbers(reduction_axis=(1,), output_axis=(2,))}
  """
  table = rule_table(rules)
  # optax's muon asks again with the Adam branch's parameters masked out (MaskedNode).
  masked = lambda x: isinstance(x, optax.MaskedNode)
  named, treedef = named_dimensions("muon", params, param_logical_axes, is_leaf=masked)
  out = [
    None if entries is None else _dimension_numbers(
      paths.path_str(keys), leaf, PartitionSpec(*entries), table
    )
    for keys, leaf, entries in named
  ]  # fmt: skip
  return treedef.unflatten(out)


def rule_table(rules: Mapping[str, str] | None) -> dict[str, str]:
  """`MATRIX_AXIS_RULES` with ``rules`` added (and overriding), every role checked."""
  table = {**MATRIX_AXIS_RULES, **(rules or {})}
  for name, role in table.items():
    if role not in ROLES:
      raise ValueError(f"matrix rule {name!r} -> {role!r}: a role is one of {list(ROLES)}")
  return table


def named_dimensions(
  optimizer: str, params: PyTree, param_logical_axes: PyTree, *, is_leaf: Any = None
) -> tuple[list[tuple[tuple, Any, tuple | None]], Any]:
  """``([(keys, leaf, names)], treedef)`` over ``params``' leaves: ``names`` one logical axis
  entry per dimension (None where the axes name fewer), None for a leaf ``is_leaf`` picks.

  Raises:
    PartitionRuleError: the axes do not have the parameters' structure, or name more
      dimensions than a parameter has (the message starts ``"<optimizer>: "``).
  """
  keyed, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_leaf)
  try:
    given = treedef.flatten_up_to(paths.conform(params, param_logical_axes))
  except (ValueError, TypeError) as e:
    raise PartitionRuleError(
      f"{optimizer}: param_logical_axes do not have the structure of the parameters: give one "
      f"PartitionSpec (or None) per parameter, in the same tree; the mismatch: {e}"
    ) from None
  out = []
  for (keys, leaf), spec in zip(keyed, given, strict=True):
    if is_leaf is not None and is_leaf(leaf):
      out.append((keys, leaf, None))
      continue
    entries = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    if len(entries) > len(leaf.shape):  # three names for a matrix: which two were meant?
      raise PartitionRuleError(
        f"{optimizer}: the axes of the parameter at {paths.path_str(keys)!r} are "
        f"{PartitionSpec(*entries)} with {len(entries)} entries, but the parameter has "
        f"{len(leaf.shape)} dimensions (shape {tuple(leaf.shape)}). Give one axis name per "
        "dimension."
      )
    out.append((keys, leaf, entries + (None,) * (len(leaf.shape) - len(entries))))
  return out, treedef


def single_name(optimizer: str, path: str, entry: Any) -> str | None:
  """The one axis name of a dimension's entry (``'embed'`` or ``('embed',)``), None for none."""
  if isinstance(entry, tuple):
    if len(entry) != 1:
      raise PartitionRuleError(
        f"{optimizer}: the parameter at {path!r} has the dimension {entry!r}, several logical "
        "axes in one; give it one name"
      )
    return entry[0]
  return entry


def check_rules_with_axes(optimizer: str, param_logical_axes: PyTree, matrix_rules: Any) -> None:
  """TypeError where ``matrix_rules`` come without the axes they apply to."""
  if matrix_rules is not None and param_logical_axes is None:
    raise TypeError(
      f"{optimizer}: matrix_rules apply to param_logical_axes; pass those too (or create the "
      "optimizer with create_sharded(params, param_logical_axes, ...), which passes them)"
    )


def dimension_roles(
  optimizer: str, params: PyTree, param_logical_axes: PyTree, rules: Mapping[str, str] | None
) -> PyTree:
  """Per parameter a tuple of roles, one per dimension, from its logical axes: the roles of
  the SOAP and Shampoo readings (`soap_roles`, `shampoo_roles`), where every dimension of
  a vector or a matrix is a matrix dimension unless a rule says otherwise.

  Raises:
    PartitionRuleError: the axes do not fit the parameters, or a parameter of rank 3 or
      more has a dimension no rule covers (the message starts ``"<optimizer>: "``).
  """
  table = rule_table(rules)
  named, treedef = named_dimensions(optimizer, params, param_logical_axes)
  out = []
  for keys, leaf, entries in named:
    path, shape = paths.path_str(keys), tuple(leaf.shape)
    roles = []
    for dim, entry in enumerate(entries or ()):
      name = single_name(optimizer, path, entry)
      if name is None or name not in table:
        if len(shape) > 2:
          raise PartitionRuleError(
            f"{optimizer}: the parameter at {path!r} (shape {shape}, axes {tuple(entries or ())}) "
            f"has {'no axis name' if name is None else f'the axis {name!r}'} at dimension "
            f"{dim}, which no matrix rule covers: is it a matrix dimension or a stack of "
            "copies? Name it in the logical axes, or pass matrix_rules="
            f"{{{(name or 'its_axis')!r}: 'matrix' | 'batch' | 'adam'}}."
          )
        roles.append("matrix")
      else:
        roles.append(table[name])
    out.append(tuple(roles))
  return treedef.unflatten(out)


def split_batch(
  shape: tuple[int, ...], roles: tuple[str, ...] | None
) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
  """A parameter's dimensions split into batch (copies) and the rest, as SOAP
  and Shampoo read them: ``(roles, batch, kept, slice_shape)``, where ``roles``
  of None means every dimension is a matrix dimension and ``slice_shape`` is
  the shape of one copy.

  Example:
    >>> from optcore._src.axes.matrix_axes import split_batch
    >>> split_batch((4, 3, 2), ("batch", "matrix", "matrix"))
    (('batch', 'matrix', 'matrix'), (0,), (1, 2), (3, 2))
  """
  roles = roles if roles is not None else ("matrix",) * len(shape)
  batch = tuple(d for d, r in enumerate(roles) if r == "batch")
  kept = tuple(d for d, r in enumerate(roles) if r != "batch")
  return roles, batch, kept, tuple(shape[d] for d in kept)


def matrix_layouts(
  optimizer: str, params: PyTree, param_logical_axes: PyTree, rules: Mapping[str, str] | None
) -> list[tuple[tuple[int, ...], int, int] | None]:
  """Per leaf of ``params`` (flattened), ``(batch, rows, cols)`` dimensions where an
  optimizer of whole matrices (NorMuon, Dion) takes it, None where its element-wise branch
  does: without logical axes the 2-D leaves (the rule of their authors' code, given its
  hidden matrices); with them, exactly two matrix dimensions by `dimension_roles` and no
  ``'adam'`` one, ``'batch'`` dimensions taken as separate matrices. A leaf with no
  elements has no matrix to orthogonalise (its rows over its columns would divide by
  zero): it takes the element-wise branch, which leaves it as it is.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore._src.axes.matrix_axes import matrix_layouts
    >>> matrix_layouts("x", {"b": jnp.zeros(3), "w": jnp.zeros((3, 2))}, None, None)
    [None, ((), 0, 1)]
    >>> matrix_layouts("x", {"w": jnp.zeros((3, 0))}, None, None)
    [None]
  """
  leaves, treedef = jax.tree.flatten(params)
  if param_logical_axes is None:
    return [((), 0, 1) if p.ndim == 2 and p.size else None for p in leaves]
  found = treedef.flatten_up_to(dimension_roles(optimizer, params, param_logical_axes, rules))
  out = []
  for p, found_roles in zip(leaves, found, strict=True):
    roles, batch, kept, _ = split_batch(tuple(p.shape), found_roles)
    matrix = len(kept) == 2 and not any(roles[d] == "adam" for d in kept) and p.size > 0
    out.append((batch, kept[0], kept[1]) if matrix else None)
  return out


def on_copies(
  shape: tuple[int, ...], batch_dims: tuple[int, ...], one_copy: Any, per_param: tuple,
  per_factor: tuple, *, unrolled: bool = False,
) -> tuple[tuple, tuple]:  # fmt: skip
  """``one_copy(per_param, per_factor) -> (per_param_out, per_factor_out)`` on every copy of
  a parameter of ``shape``, its ``batch_dims`` vmapped: the parameter-shaped trees in
  ``per_param`` have them where the parameter has them, the factor trees in ``per_factor``
  lead with them; the results come back the same way. ``unrolled``: a Python loop over
  the copies instead of ``vmap`` (a vmapped norm sums in another order than the same norm
  of one copy alone)."""
  nb = len(batch_dims)
  rest = tuple(d for d in range(len(shape)) if d not in batch_dims)
  order = (*batch_dims, *rest)
  inverse = tuple(order.index(d) for d in range(len(order)))
  batch_shape = tuple(shape[d] for d in batch_dims)
  slice_shape = tuple(shape[d] for d in rest)
  size = math.prod(batch_shape)
  param_in = lambda x: jnp.transpose(x, order).reshape(size, *slice_shape)
  param_out = lambda x: jnp.transpose(x.reshape(*batch_shape, *slice_shape), inverse)
  factor_in = lambda x: x.reshape(size, *x.shape[nb:])
  factor_out = lambda x: x.reshape(*batch_shape, *x.shape[1:])
  per_param, per_factor = jax.tree.map(param_in, per_param), jax.tree.map(factor_in, per_factor)
  if unrolled:  # each copy its own program: the reductions of a lone parameter, bit for bit
    outs = [
      one_copy(*jax.tree.map(lambda x, c=c: x[c], (per_param, per_factor))) for c in range(size)
    ]
    params_out, factors_out = jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
  else:
    params_out, factors_out = jax.vmap(one_copy)(per_param, per_factor)
  return jax.tree.map(param_out, params_out), jax.tree.map(factor_out, factors_out)


def _dimension_numbers(path: str, param: Any, spec: Any, table: Mapping[str, str]) -> Any:
  if len(param.shape) < 2:
    return None  # vectors and scalars: Adam
  names = [single_name("muon", path, entry) for entry in spec]
  for dim, name in enumerate(names):
    if name is None or name not in table:
      raise PartitionRuleError(
        f"muon: the parameter at {path!r} (shape {tuple(param.shape)}, axes "
        f"{tuple(spec)}) has {'no axis name' if name is None else f'the axis {name!r}'} at "
        f"dimension {dim}, which no matrix rule covers. Name it in the logical axes, or pass "
        f"matrix_rules={{{(name or 'its_axis')!r}: 'matrix' | 'batch' | 'adam'}}."
      )
  roles = [table[name] for name in names if name is not None]
  if "adam" in roles:
    return None
  matrix = [d for d, role in enumerate(roles) if role == "matrix"]
  if len(matrix) < 2:
    return None  # a stack of vectors (a scanned layer norm's scale): Adam
  if MODEL_AXIS in (names[d] for d in matrix):
    model = next(d for d in matrix if names[d] == MODEL_AXIS)
    others = tuple(d for d in matrix if d != model)
    if model == matrix[0]:
      reduction, output = (model,), others
    else:
      reduction, output = others, (model,)
  else:
    reduction, output = (matrix[0],), tuple(matrix[1:])
  return optax_contrib.MuonDimensionNumbers(reduction_axis=reduction, output_axis=output)


def muon_dimension_numbers_fn(param_logical_axes: PyTree, rules: Mapping[str, str] | None):
  """optax's ``muon_weight_dimension_numbers`` as a function of the parameters."""

  def dimension_numbers(params: PyTree) -> PyTree:
    return muon_dimension_numbers(params, param_logical_axes, rules)

  return dimension_numbers


__all__ = ["MATRIX_AXIS_RULES", "muon_dimension_numbers", "muon_dimension_numbers_fn"]
