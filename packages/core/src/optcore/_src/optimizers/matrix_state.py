"""What the matrix optimizers (SOAP, Shampoo, NorMuon, Dion) share: one parameter's
preconditioner matrices as a pytree (`Preconditioners`), their logical axes, and torch's
``lerp`` as the authors' code computes it. No optimizer module imports another's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from optcore._src.axes import partition_rules as pr
from optcore._src.axes.matrix_axes import check_rules_with_axes, matrix_layouts
from optcore._src.ground.checks import check_real_params

PyTree = Any


@jax.tree_util.register_pytree_with_keys_class
class Preconditioners:
  """One parameter's factors (or eigenbases), one per dimension of its matrix.

  Attributes:
    matrices: per preconditioned dimension a ``(*batch, d, d)`` array; None for
      a dimension that keeps the identity (above ``max_precond_dim``, a vector
      without ``precondition_1d``, an ``"adam"`` axis).
    dims: per entry, the parameter's dimension it preconditions; None where
      ``merge_dims`` merged several into one.
    batch_dims: the parameter's dimensions that are independent copies
      (``"batch"`` axes), which lead each matrix's shape.
  """

  def __init__(
    self,
    matrices: tuple[Any, ...],
    dims: tuple[int | None, ...],
    batch_dims: tuple[int, ...] = (),
  ):
    self.matrices = tuple(matrices)
    self.dims = tuple(dims)
    self.batch_dims = tuple(batch_dims)

  def tree_flatten_with_keys(self) -> tuple:
    children = [(jax.tree_util.DictKey(str(i)), m) for i, m in enumerate(self.matrices)]
    return children, (self.dims, self.batch_dims)

  @classmethod
  def tree_unflatten(cls, aux: tuple, children: Any) -> Preconditioners:
    return cls(tuple(children), *aux)

  def __eq__(self, other: object) -> bool:  # as a NamedTuple compares: field by field
    if type(other) is not type(self):
      return NotImplemented
    return (self.dims, self.batch_dims) == (other.dims, other.batch_dims) and (
      self.matrices == other.matrices
    )

  __hash__ = None  # type: ignore[assignment]  # holds arrays

  def __repr__(self) -> str:
    shown = [getattr(m, "shape", m) for m in self.matrices]
    return f"Preconditioners({shown}, dims={self.dims}, batch_dims={self.batch_dims})"


def preconditioner_axes(field: PyTree, state: Any, params_axes: PyTree, params: PyTree) -> PyTree:
  """Partition rule of a field of `Preconditioners` (SOAP's ``gg`` and ``q``, Shampoo's
  ``statistics`` and ``preconditioners``): a matrix keeps the axis of the dimension it
  preconditions on its rows, after the axes of the batch dimensions; one that merged
  several dimensions (or a block) is replicated on both sides."""

  def per_param(node: Preconditioners, spec: PartitionSpec, keys: tuple) -> Preconditioners:
    entries = tuple(spec)
    axis = lambda d: entries[d] if d is not None and d < len(entries) else None
    batch = tuple(axis(d) for d in node.batch_dims)
    return Preconditioners(
      tuple(
        None if m is None else PartitionSpec(*batch, axis(d), None)
        for m, d in zip(node.matrices, node.dims, strict=True)
      ),
      node.dims,
      node.batch_dims,
    )

  return pr.map_params(per_param, field, params_axes)


def lerp(start: jax.Array, end: jax.Array, weight: Any) -> jax.Array:
  """torch's ``lerp``, both of its branches."""
  low = start + weight * (end - start)
  high = end - (end - start) * (1 - weight)
  if isinstance(weight, (int, float)):
    return low if weight < 0.5 else high
  return jnp.where(weight < 0.5, low, high)


def matrix_layouts_of(
  optimizer: str, param_logical_axes: Any, matrix_rules: Any
) -> Callable[[Any], list]:
  """``params -> [(batch, rows, cols) or None per leaf]`` for an optimizer of whole matrices
  (`matrix_axes.matrix_layouts`): the rules checked against the axes once, here; complex
  parameters refused, naming the first, each time it reads them."""
  check_rules_with_axes(optimizer, param_logical_axes, matrix_rules)

  def layouts(params: Any) -> list:
    check_real_params(optimizer, params)
    return matrix_layouts(optimizer, params, param_logical_axes, matrix_rules)

  return layouts


def kept_dtypes(new: Any, old: Any) -> Any:
  """``new`` with each leaf in the dtype of ``old``'s: a state keeps the dtypes ``init`` gave
  it (the parameters'), whatever the gradients' dtype or a float32 computation's; a state whose
  dtypes moved would retrace ``jit`` and be refused by ``lax.scan`` and a restore."""
  return jax.tree.map(lambda x, o: x.astype(o.dtype), new, old)
