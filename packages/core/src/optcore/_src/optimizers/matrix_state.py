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


#: Muon's quintic Newton-Schulz coefficients (Keller Jordan's, optax's ``'standard'``).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz5(g: jax.Array, steps: int = 5, eps: float = 1e-7) -> jax.Array:
  """The quintic Newton-Schulz iteration of Muon on the last two dimensions, in float32: the
  matrix divided by its Frobenius norm plus ``eps``, a tall one transposed, ``steps`` times
  ``X <- a X + (b A + c A A) X`` with ``A = X X^T`` (NorMuon's and levanter's MuonH's
  references alike; NorMuon's ``eps`` is 1e-7, MuonH's its ``muon_eps``).

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore._src.optimizers.matrix_state import newton_schulz5
    >>> newton_schulz5(jnp.eye(2) * 3).round(2)  # singular values near 1, not at it
    Array([[1.11, 0.  ],
           [0.  , 1.11]], dtype=float32)
  """
  a, b, c = NS_COEFFICIENTS
  x = g.astype(jnp.float32)
  tall = g.shape[-2] > g.shape[-1]
  if tall:
    x = jnp.swapaxes(x, -1, -2)
  x = x / (jnp.linalg.norm(x, axis=(-2, -1), keepdims=True) + eps)
  mm = lambda u, v: jnp.matmul(u, v, precision=jax.lax.Precision.HIGHEST)
  for _ in range(steps):
    gram = mm(x, jnp.swapaxes(x, -1, -2))
    x = a * x + mm(b * gram + c * mm(gram, gram), x)
  return jnp.swapaxes(x, -1, -2) if tall else x


def sphere_norm(x: jax.Array) -> jax.Array:
  """The Frobenius norm of a matrix; of each slice along the first axis of any other leaf
  (a layer of a stack; a vector's elements), kept as a dimension to broadcast: the norm the
  hyperball optimizers hold (levanter's AdamH and MuonH)."""
  if x.ndim == 2:
    return jnp.linalg.norm(x)
  return jnp.sqrt(jnp.sum(jnp.square(x), axis=tuple(range(1, x.ndim)), keepdims=True))


def sphere_step(p: jax.Array, u: jax.Array, learning_rate: Any) -> jax.Array:
  """The update that moves ``p`` along ``u`` by ``learning_rate`` on the sphere of its own norm
  (`sphere_norm`): ``p' = p - lr u |p| / |u|``, then ``p' |p| / |p'| - p``."""
  p_norm = sphere_norm(p)
  moved = p - learning_rate * u * p_norm / sphere_norm(u)
  return moved / sphere_norm(moved) * p_norm - p
