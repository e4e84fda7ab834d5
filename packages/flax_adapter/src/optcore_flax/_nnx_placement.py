"""Where the NNX face keeps parameters and state: read from each variable's metadata.

An nnx variable says where it lives in its metadata: ``out_sharding`` names one logical axis
per dimension (an axis that ``nnx.vmap``/``nnx.scan`` added with ``transform_metadata=
{nnx.PARTITION_NAME: ...}`` among them), ``sharding_rules`` map those names to mesh axes (after
the context's ``nnx.logical_axis_rules``), ``mesh`` is the mesh it lives on, and
``optimizer_sharding`` names the axes of its optimizer state where they differ from its own.
`read_variables` reads that once per variable, before any name is resolved: the definition
takes the logical names (a matrix rule knows ``'embed'``, not ``'data'``), the placement takes
them resolved to mesh axes.

A `Placement` is one sharding per parameter, per state leaf and for the step, fixed when the
optimizer is made or sharded. Each update keeps every array at its place, on any mesh kind: on
an Auto mesh nothing else would (XLA places a jitted step's outputs as it likes, so a parameter
drifts to its moment's layout); on an Explicit one the array's type keeps it already.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx
from flax.core import spmd as core_spmd
from jax.core import Tracer
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec
from jax.sharding import PartitionSpec as P

import optcore
from optcore import adapter

PyTree = Any
AnyMesh = Mesh | AbstractMesh

_STACKING_FIX = (
  "An nnx.vmap or nnx.scan that stacks a variable adds the stacked dimension to its metadata "
  "when given transform_metadata={nnx.PARTITION_NAME: None} (a replicated stack axis; or a "
  "name such as 'layers' that the sharding rules map); give it, or write one name per "
  "dimension."
)


@dataclasses.dataclass(frozen=True)
class Variable:
  """What one trained variable's metadata says about where it lives.

  Attributes:
    path: its path in the model (``'layers/lin/kernel'``), for errors.
    shape: its array's shape.
    names: its logical axis names (``out_sharding``), one per dimension; None when it names
      none, or names a number of axes other than its rank (see ``misfit``).
    state_names: the logical names of its optimizer state's axes: ``optimizer_sharding``
      where given, else ``names``.
    misfit: the names it gives when their number is not its rank (a stack's axis left out).
    mesh: the mesh its metadata names, or the mesh its array is on, or (where it names axes)
      the mesh of ``jax.set_mesh``; None where none of these is.
    declared_mesh: whether ``mesh`` comes from its metadata.
    actual: its array's own `NamedSharding`, where the array is concrete and has one.
    rules: its ``sharding_rules`` metadata.
  """

  path: str
  shape: tuple[int, ...]
  names: tuple[Any, ...] | None
  state_names: tuple[Any, ...] | None
  misfit: tuple[Any, ...] | None
  mesh: AnyMesh | None
  declared_mesh: bool
  actual: NamedSharding | None
  rules: tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class Placement:
  """One `NamedSharding` (or None: left where it is) per trained parameter, per leaf of the
  optax state (in `jax.tree.leaves` order of the optimizer's variables) and for the step."""

  params: tuple[NamedSharding | None, ...]
  state: tuple[NamedSharding | None, ...]
  step: NamedSharding | None


def _is_variable(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def _names(metadata: dict[str, Any], key: str) -> tuple[Any, ...] | None:
  names = metadata.get(key)
  if not names and key == "out_sharding":
    names = metadata.get("sharding_names")  # Flax before 0.12.4 called it this
  if not names:
    return None
  return tuple(names)


def _context_mesh() -> AnyMesh | None:
  """The mesh of ``jax.set_mesh``: the concrete one outside ``jit``, the abstract one inside."""
  try:
    mesh = jax.sharding.get_mesh()
  except ValueError:  # inside jit: only the abstract mesh is known
    mesh = jax.sharding.get_abstract_mesh()
  return None if mesh.empty else mesh


def _actual(value: Any) -> NamedSharding | None:
  """``value``'s own sharding, where it is a concrete array on a mesh of more than one device."""
  if isinstance(value, Tracer) or not isinstance(value, jax.Array):
    return None
  sharding = getattr(value, "sharding", None)
  if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
    return sharding
  return None


def read_variables(state: Any) -> tuple[list[Variable], Any]:
  """Each variable of ``state`` (``nnx.state(model, wrt)``) as `Variable`, in the leaf order
  of ``nnx.as_pure(state)``, and that tree's structure."""
  named, treedef = optcore.leaves_with_paths(nnx.as_pure(state))
  variables = jax.tree.leaves(state, is_leaf=_is_variable)
  context = _context_mesh()
  out = []
  for (path, _), variable in zip(named, variables, strict=True):
    if not _is_variable(variable):  # a plain array in the state: nothing declared
      variable = nnx.Param(variable)
    metadata = variable.get_metadata()
    value = variable.get_value()
    shape = tuple(getattr(value, "shape", ()))
    names = _names(metadata, "out_sharding")
    misfit = names if names is not None and len(names) != len(shape) else None
    if misfit is not None:
      names = None
    state_names = _names(metadata, "optimizer_sharding") or names
    actual = _actual(value)
    declared = metadata.get("mesh")
    mesh = declared if declared is not None else actual.mesh if actual is not None else None
    if mesh is None and (names or state_names or misfit):  # named for jax.set_mesh's mesh
      mesh = context
    out.append(
      Variable(
        path=path,
        shape=shape,
        names=names,
        state_names=state_names,
        misfit=misfit,
        mesh=mesh,
        declared_mesh=declared is not None,
        actual=actual,
        rules=tuple(tuple(r) for r in metadata.get("sharding_rules") or ()),
      )
    )
  return out, treedef


def logical_axes(variables: Sequence[Variable], treedef: Any) -> PyTree | None:
  """The variables' logical axes as the definition reads them (``contrib.muon``'s matrix
  dimensions): their metadata names, unresolved; ``P()`` where a variable names none (or names
  a number of axes other than its rank). None when no variable names any."""
  if not any(v.names for v in variables):
    return None
  return treedef.unflatten([PartitionSpec(*(v.names or ())) for v in variables])


def model_rules(
  variables: Sequence[Variable], given: Sequence[tuple[str, Any]] | None = None
) -> dict[str, Any]:
  """The logical-to-mesh mapping nnx applies to these variables: the context's
  ``nnx.logical_axis_rules``, then each variable's ``sharding_rules`` (two that map one name
  differently are refused, naming both), then ``given`` (the caller's, which win)."""
  rules: dict[str, Any] = dict(core_spmd.get_logical_axis_rules() or ())
  source: dict[str, str] = {}
  for v in variables:
    for name, mesh_axes in v.rules:
      if name in source and rules[name] != mesh_axes:
        raise optcore.PartitionRuleError(
          f"the sharding_rules of the variables at {source[name]!r} and {v.path!r} map the "
          f"logical axis {name!r} to {rules[name]!r} and to {mesh_axes!r}: one optimizer "
          "places its state by one mapping. Give both the same rule for it."
        )
      rules[name] = mesh_axes
      source.setdefault(name, v.path)
  for name, mesh_axes in given or ():
    rules[name] = mesh_axes
  return rules


def mesh_spec(names: Sequence[Any], rules: dict[str, Any]) -> PartitionSpec:
  """``names`` as mesh axes, as nnx maps them: a name with a rule takes it, any other entry
  (a mesh axis written directly, None, a tuple) stays as it is."""
  return PartitionSpec(*(rules.get(n, n) if isinstance(n, str) else n for n in names))


def _state_param_spec(v: Variable, rules: dict[str, Any]) -> PartitionSpec:
  """The mesh axes a variable's optimizer state follows: its declared state names, else the
  layout its array has, else replicated."""
  if v.state_names is not None:
    return mesh_spec(v.state_names, rules)
  if v.actual is not None:
    return v.actual.spec
  return PartitionSpec()


def _param_sharding(v: Variable, rules: dict[str, Any], mesh: AnyMesh | None) -> Any:
  """Where a parameter stays: as its names say, else where its array is, else (naming
  nothing) replicated on its mesh; None where neither is known."""
  if v.names is not None and mesh is not None:
    return NamedSharding(mesh, mesh_spec(v.names, rules))
  if v.actual is not None:
    return v.actual
  if v.misfit is None and mesh is not None:
    return NamedSharding(mesh, PartitionSpec())
  return None


def refuse_misfits(variables: Sequence[Variable]) -> None:
  """PartitionRuleError naming the first variable whose metadata names a number of axes other
  than its array's rank: its placement cannot be read from it."""
  for v in variables:
    if v.misfit is not None:
      raise optcore.PartitionRuleError(
        f"the variable at {v.path!r} has shape {v.shape} ({len(v.shape)} dimensions) but its "
        f"sharding metadata names {len(v.misfit)} axes, {v.misfit}, so it cannot say where "
        f"each dimension goes. {_STACKING_FIX}"
      )


def warn_misfits(variables: Sequence[Variable]) -> None:
  """A warning per variable whose metadata cannot say where its dimensions go: its state
  follows the layout its array has, or is replicated where the array has none yet."""
  for v in variables:
    if v.misfit is not None:
      where = f"follows its array's layout {v.actual.spec}" if v.actual else "is replicated"
      adapter.warn(
        f"optcore_flax.nnx.Optimizer: the variable at {v.path!r} has shape {v.shape} but its "
        f"sharding metadata names {len(v.misfit)} axes, {v.misfit}; its optimizer state {where}, "
        f"and optimizer.shard() refuses it. {_STACKING_FIX}",
        UserWarning,
      )


def _flat_state(optimizer_def: Any, tree: optcore.OptimizerState, like: PyTree) -> list[Any]:
  """A tree in the state's structure as the leaves of the optax state nnx keeps, in order
  (with the step where the definition's own state holds one)."""
  optax_tree = optimizer_def.to_optax_state(tree, like=like)
  kinds = (PartitionSpec, NamedSharding)
  return jax.tree.leaves(optax_tree, is_leaf=lambda x: isinstance(x, kinds))


def at_creation(
  optimizer_def: Any,
  state: optcore.OptimizerState,
  like: PyTree,
  state_variables: Sequence[tuple[str, nnx.Variable]],
  params: PyTree,
  variables: Sequence[Variable],
  treedef: Any,
) -> Placement | None:
  """Where a new optimizer keeps everything: each parameter as its metadata says (or where it
  is), each state leaf on its parameter's mesh with the axes the definition derives, every
  counter replicated on the parameters' mesh (the first mesh a variable declares, else the
  first one an array is on; never a context mesh no variable uses). None when no variable is
  on a mesh: nothing to keep."""
  declared = [v.mesh for v in variables if v.declared_mesh and v.mesh is not None]
  meshes = declared + [v.mesh for v in variables if v.mesh is not None]
  if not meshes:
    return None
  home: AnyMesh = meshes[0]
  rules = model_rules(variables)
  warn_misfits(variables)
  param_shardings = tuple(_param_sharding(v, rules, v.mesh) for v in variables)
  runs: list[tuple[AnyMesh, list[NamedSharding]]] = []
  for mesh in meshes:
    if any(mesh == done for done, _ in runs):
      continue
    axes = treedef.unflatten(
      [
        _state_param_spec(v, rules) if (v.mesh if v.mesh is not None else home) == mesh else P()
        for v in variables
      ]
    )
    runs.append((mesh, _shardings_on(mesh, optimizer_def, state, params, axes, like)))
  state_shardings = []
  for i, (_, variable) in enumerate(state_variables):
    own = variable.get_metadata().get("mesh") if _is_variable(variable) else None
    # its parameter's mesh (Flax copies a variable's metadata to its state), else the home one
    run = next((run for done, run in runs if own is not None and done == own), runs[0][1])
    state_shardings.append(run[i])
  return Placement(param_shardings, tuple(state_shardings), NamedSharding(home, PartitionSpec()))


def _shardings_on(
  mesh: AnyMesh, optimizer_def: Any, state: Any, params: PyTree, axes: PyTree, like: PyTree
) -> list[NamedSharding]:
  """Every state leaf's sharding on ``mesh`` from the parameters' mesh axes ``axes``, as the
  core places state (a quantized leaf's blocks kept whole, a dimension the mesh does not
  divide refused by path); on an abstract mesh (an optimizer made inside ``jit`` with no
  mesh in its metadata) the derived axes alone."""
  if isinstance(mesh, Mesh):
    tree = adapter.state_shardings(optimizer_def, state, params, axes, mesh, None)
    return _flat_state(optimizer_def, tree, like)
  specs = _flat_state(
    optimizer_def, adapter.state_logical_axes(optimizer_def, state, params, axes), like
  )
  return [NamedSharding(mesh, spec) for spec in specs]


def for_shard(
  optimizer_def: Any,
  state: optcore.OptimizerState,
  like: PyTree,
  params: PyTree,
  variables: Sequence[Variable],
  treedef: Any,
  mesh: Mesh | optcore.Placement,
  logical_axis_rules: Sequence[tuple[str, Any]] | None,
  placement: Any,
) -> tuple[optcore.OptimizerState, Placement]:
  """`Optimizer.shard`'s placement: every state leaf on ``mesh`` (split over ``state_axis``,
  in ``state_memory_kind``), with the axes the definition derives from the variables'
  metadata mapped by their rules and ``logical_axis_rules``; the state's `NamedSharding`
  tree and the `Placement` to keep.

  Raises:
    optcore.PartitionRuleError: metadata whose length is not its variable's rank, names no
      rule maps to the mesh's axes, a dimension the mesh does not divide (named by path).
  """
  refuse_misfits(variables)
  where = optcore.Placement.of(mesh, logical_axis_rules, **placement)
  rules = model_rules(variables, where.logical_axis_rules)
  axes = treedef.unflatten([_state_param_spec(v, rules) for v in variables])
  where = dataclasses.replace(where, logical_axis_rules=None)  # the axes are mesh axes now
  shardings = adapter.state_shardings(optimizer_def, state, params, axes, where)
  param_shardings = tuple(_param_sharding(v, rules, where.mesh) for v in variables)
  flat = _flat_state(optimizer_def, shardings, like)
  step = NamedSharding(where.mesh, PartitionSpec())
  return shardings, Placement(param_shardings, tuple(flat), step)


def _explicit(x: Any) -> bool:
  """Whether a traced array's type carries its sharding (a mesh with an Explicit axis)."""
  where = getattr(jax.typeof(x), "sharding", None)
  if not isinstance(where, NamedSharding):
    return False
  return any(t == jax.sharding.AxisType.Explicit for t in where.mesh.axis_types)


def _on_device(sharding: NamedSharding) -> bool:
  return sharding.memory_kind in (None, "device")


def without_eager_sharding(tx: Any) -> Any:
  """``tx`` whose ``init`` receives each variable with its metadata but ``eager_sharding``
  off, so that Flax's ``nnx.Optimizer`` keeps the metadata on the state it makes without
  sharding a leaf by a variable's names (`place` puts every leaf where it belongs)."""

  def quiet(x: Any) -> Any:
    return x.replace(eager_sharding=False) if _is_variable(x) else x

  def init(params: PyTree) -> Any:
    return tx.init(jax.tree.map(quiet, params, is_leaf=_is_variable))

  return tx._replace(init=init)


def _there(value: jax.Array, sharding: NamedSharding) -> bool:
  """Whether ``value`` is laid out as ``sharding`` says, on its mesh: a counter replicated on
  another mesh of the same devices is elsewhere to a step on an Explicit mesh."""
  where = value.sharding
  same_mesh = not isinstance(where, NamedSharding) or where.mesh == sharding.mesh
  return same_mesh and where.is_equivalent_to(sharding, value.ndim)


def place(values: Sequence[Any], shardings: Sequence[NamedSharding | None]) -> list[Any]:
  """``values`` put where ``shardings`` say, at creation: under a trace (``nnx.jit``,
  ``nnx.eval_shape``) through a ``jit`` whose outputs carry a concrete mesh's shardings, so
  that ``nnx.eval_shape`` reports them and a checkpoint restored into its result lands there."""
  out = list(values)
  traced: dict[Any, list[int]] = {}
  for i, (value, sharding) in enumerate(zip(values, shardings, strict=True)):
    if sharding is None or not hasattr(value, "shape"):
      continue
    if isinstance(value, Tracer):
      if isinstance(sharding.mesh, Mesh):
        traced.setdefault(sharding.mesh, []).append(i)
      elif not _explicit(value):
        out[i] = jax.lax.with_sharding_constraint(value, sharding)
    elif isinstance(value, jax.Array) and isinstance(sharding.mesh, Mesh):
      if not _there(value, sharding):
        out[i] = jax.device_put(value, sharding)
  for indices in traced.values():
    moved = jax.jit(lambda *xs: xs, out_shardings=tuple(shardings[i] for i in indices))(
      *(values[i] for i in indices)
    )
    for i, value in zip(indices, moved, strict=True):
      out[i] = value
  return out


def keep(values: Sequence[Any], shardings: Sequence[NamedSharding | None]) -> list[Any]:
  """``values`` kept where ``shardings`` say, after a step: under a trace on an Auto mesh a
  sharding constraint (on an Explicit one the type keeps it already), outside one a move only
  where an array is elsewhere. State in host memory is `placement`'s (the core's) to keep."""
  out = []
  for value, sharding in zip(values, shardings, strict=True):
    if sharding is None or not _on_device(sharding) or not hasattr(value, "shape"):
      out.append(value)
    elif isinstance(value, Tracer):
      out.append(value if _explicit(value) else jax.lax.with_sharding_constraint(value, sharding))
    elif isinstance(value, jax.Array) and isinstance(sharding.mesh, Mesh):
      out.append(value if _there(value, sharding) else jax.device_put(value, sharding))
    else:
      out.append(value)
  return out


def declare(variables: Sequence[nnx.Variable], shardings: Sequence[NamedSharding | None]) -> None:
  """Writes each state variable's placement into its metadata where the metadata does not say
  it already (a counter says nothing; a factored moment's copied names do not fit it): its
  ``mesh`` and its mesh axes as ``out_sharding``. So what reads nnx metadata places the state
  as the optimizer does: ``nnx.eval_shape`` (a checkpoint restored into its result lands on the
  mesh, counters too), ``nnx.get_abstract_model``, ``nnx.get_named_sharding``."""
  for variable, sharding in zip(variables, shardings, strict=True):
    if sharding is None or not isinstance(sharding.mesh, Mesh):
      continue
    metadata = variable.get_metadata()
    said = metadata.get("mesh"), nnx.spmd.get_var_pspec(variable)
    ndim = len(getattr(variable.get_value(), "shape", ()))
    if said[0] == sharding.mesh and NamedSharding(
      sharding.mesh, said[1] or PartitionSpec()
    ).is_equivalent_to(sharding, ndim):
      continue
    variable.set_metadata(mesh=sharding.mesh, out_sharding=tuple(sharding.spec), sharding_rules=())
