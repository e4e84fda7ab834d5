"""Linen partitioning metadata in, optimizer axes and shardings out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

import jax
from flax import linen as nn
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

import optcore
from optcore import adapter
from optcore_flax import _nnx_placement as placed

PyTree = Any


def _is_box(x: Any) -> bool:
  return isinstance(x, nn.meta.AxisMetadata)


def _is_variable(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def _has_nnx_axes(x: Any) -> bool:
  if not _is_variable(x):
    return False
  metadata = x.get_metadata()
  return bool(metadata.get("out_sharding") or metadata.get("sharding_names"))


def _nnx_names(x: Any) -> Any:
  """An nnx variable's logical axes as a `PartitionSpec` in its place (``P()`` for one that
  names none); any other leaf as `param_logical_axes` reads it."""
  if not _is_variable(x):
    return PartitionSpec() if hasattr(x, "shape") else x
  (variable,), _ = placed.read_variables({"v": x})
  if variable.misfit is not None:
    placed.refuse_misfits([variable])
  return x.replace(PartitionSpec(*(variable.names or ())))


def _with_nnx_rules(params: PyTree, rules: Sequence[tuple[str, Any]] | None) -> Any:
  """``rules`` followed by the ``sharding_rules`` of the nnx variables in ``params`` (and the
  context's ``nnx.logical_axis_rules``), so their own mapping applies where ``rules`` has none
  for a name; ``rules`` itself when ``params`` holds no nnx variable."""
  variables = [x for x in jax.tree.leaves(params, is_leaf=_is_variable) if _is_variable(x)]
  if not variables:
    return rules
  read, _ = placed.read_variables(dict(enumerate(variables)))
  own = placed.model_rules(read)
  if not own:
    return rules
  # nnx keeps a name no rule maps as it is (a mesh axis written directly), Linen replicates it.
  names = {n for v in read for n in (v.state_names or ()) if isinstance(n, str)}
  kept = [(n, n) for n in sorted(names - set(own) - {r for r, _ in rules or ()})]
  return [*(rules or ()), *own.items(), *kept]


def param_logical_axes(params: PyTree) -> PyTree:
  """One logical `PartitionSpec` per parameter, from params boxed with
  ``nn.with_logical_partitioning`` / ``nn.LogicallyPartitioned`` (unboxed
  leaves get ``PartitionSpec()``), from an ``nnx.State`` whose ``nnx.Param``
  variables carry axis names (``nnx.with_partitioning``, ``out_sharding=``),
  or a tree of specs (``nn.get_partition_spec``) returned as it is.

  Args:
    params: boxed Linen params, an ``nnx.State``, plain arrays or a tree of specs.

  Returns:
    One `PartitionSpec` (logical names) per parameter, in ``params``' structure.

  Example:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> import optcore_flax
    >>> init = nn.with_logical_partitioning(nn.initializers.ones, ('embed', 'mlp'))
    >>> boxed = nn.Dense(3, kernel_init=init).init(jax.random.key(0), jnp.ones((1, 2)))
    >>> optcore_flax.param_logical_axes(boxed)['params']['kernel'] == jax.sharding.PartitionSpec(
    ...     'embed', 'mlp')
    True
  """
  if any(_is_box(x) for x in jax.tree.leaves(params, is_leaf=_is_box)):
    return nn.get_partition_spec(params)
  if any(_has_nnx_axes(x) for x in jax.tree.leaves(params, is_leaf=_is_variable)):
    # nnx.Param(..., out_sharding=names) / nnx.with_partitioning: the names as written, before
    # sharding_rules resolve them to mesh axes (_with_nnx_rules applies those).
    return jax.tree.map(_nnx_names, params, is_leaf=_is_variable)
  # Plain arrays (no partitioning metadata at all) are replicated; specs pass through.
  return jax.tree.map(lambda x: PartitionSpec() if hasattr(x, "shape") else x, params)


def derive_logical_axes(optimizer: optcore.Optimizer, params: PyTree) -> optcore.Optimizer:
  """``optimizer``'s logical axes, from Linen or nnx partitioning metadata.

  Args:
    optimizer: an optimizer over the (unboxed) parameters.
    params: the boxed parameters, an ``nnx.State`` with axis names, or their specs.

  Returns:
    An Optimizer-shaped tree of `PartitionSpec` objects (logical names).

  Raises:
    optcore.PartitionRuleError: a state leaf whose axes cannot be derived (named by path).

  Example:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> import optcore, optcore_flax
    >>> init = nn.with_logical_partitioning(nn.initializers.ones, ('embed', 'mlp'))
    >>> boxed = nn.Dense(3, kernel_init=init, use_bias=False).init(
    ...     jax.random.key(0), jnp.ones((1, 2)))
    >>> opt = optcore.adam(1e-3).create(nn.unbox(boxed))
    >>> axes = optcore_flax.derive_logical_axes(opt, boxed)
    >>> axes.state.param_states[0].mu['params']['kernel'] == jax.sharding.PartitionSpec(
    ...     'embed', 'mlp')
    True
  """
  return optimizer.optimizer_def.derive_logical_axes(optimizer, param_logical_axes(params))


def optimizer_shardings(
  optimizer: optcore.Optimizer,
  params: PyTree,
  mesh: Mesh | optcore.Placement,
  logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
  **placement: Unpack[adapter.StatePlacement],
) -> optcore.Optimizer:
  """``optimizer``'s `NamedSharding` objects on ``mesh`` by Flax's ``logical_axis_rules``.

  Args:
    optimizer: an optimizer over the (unboxed) parameters.
    params: the boxed parameters, an ``nnx.State`` with axis names, or their specs.
    mesh: the device mesh.
    logical_axis_rules: ``(logical_name, mesh_axes)`` pairs.
    **placement: ``state_axis=`` (ZeRO-1), ``state_memory_kind=`` (host memory): see
      `optcore.Placement`, which ``mesh`` may be instead.

  Returns:
    An Optimizer-shaped tree of `NamedSharding` objects, for a jitted step's
    in and out shardings.

  Raises:
    optcore.PartitionRuleError: axes that do not fit a leaf (named by path).
    ValueError: an unknown ``state_axis`` or memory kind.

  Example:
    >>> import jax, jax.numpy as jnp, numpy as np, flax.linen as nn
    >>> import optcore, optcore_flax
    >>> init = nn.with_logical_partitioning(nn.initializers.ones, ('embed', 'mlp'))
    >>> boxed = nn.Dense(4, kernel_init=init, use_bias=False).init(
    ...     jax.random.key(0), jnp.ones((1, 2)))
    >>> opt = optcore.adam(1e-3).create(nn.unbox(boxed))
    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('model',))
    >>> shardings = optcore_flax.optimizer_shardings(opt, boxed, mesh, [('mlp', 'model')])
    >>> shardings.state.param_states[0].nu['params']['kernel'].spec == jax.sharding.PartitionSpec(
    ...     None, 'model')
    True
  """
  return optimizer.optimizer_def.derive_shardings(
    optimizer,
    param_logical_axes(params),
    mesh,
    _with_nnx_rules(params, logical_axis_rules),
    **placement,
  )


def create_sharded(
  optimizer_def: optcore.OptimizerDef,
  boxed_params: PyTree,
  mesh: Mesh | optcore.Placement,
  logical_axis_rules: Sequence[tuple[str, Any]] | None = None,
  **placement: Unpack[adapter.StatePlacement],
) -> optcore.Optimizer:
  """An optimizer over the unboxed ``boxed_params``, created sharded by their
  Linen (or nnx) logical axes and Flax's ``logical_axis_rules``.

  Args:
    optimizer_def: the definition (``contrib.muon`` reads its matrices from the axes).
    boxed_params: parameters boxed by ``nn.with_logical_partitioning``, or an
      ``nnx.State`` of Params with axis names.
    mesh: the device mesh.
    logical_axis_rules: ``(logical_name, mesh_axes)`` pairs.
    **placement: ``state_axis=`` (ZeRO-1), ``state_memory_kind=`` (host memory): see
      `optcore.Placement`, which ``mesh`` may be instead.

  Returns:
    An `optcore.Optimizer` whose target and state live sharded on ``mesh``.

  Raises:
    optcore.PartitionRuleError: a dimension the mesh does not divide, or axes
      no rule covers (named by path).

  Example:
    >>> import jax, jax.numpy as jnp, numpy as np, flax.linen as nn
    >>> import optcore, optcore_flax
    >>> init = nn.with_logical_partitioning(nn.initializers.ones, ('embed', 'mlp'))
    >>> dense = nn.Dense(4, kernel_init=init, use_bias=False)
    >>> boxed = dense.init(jax.random.key(0), jnp.ones((1, 2)))
    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('model',))
    >>> opt = optcore_flax.create_sharded(optcore.adam(1e-3), boxed, mesh, [('mlp', 'model')])
    >>> spec = opt.state.param_states[0].mu['params']['kernel'].sharding.spec
    >>> spec == jax.sharding.PartitionSpec(None, 'model')
    True
  """
  axes = param_logical_axes(boxed_params)
  return optimizer_def.create_sharded(
    nn.unbox(boxed_params),
    axes,
    mesh,
    _with_nnx_rules(boxed_params, logical_axis_rules),
    **placement,
  )


__all__ = [
  "create_sharded",
  "derive_logical_axes",
  "optimizer_shardings",
  "param_logical_axes",
]
