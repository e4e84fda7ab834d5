"""From logical axes to a mesh: Flax/T5X ``logical_axis_rules``, NamedShardings,
and optimizer state created already sharded."""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.core import Tracer
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from optcore._src.axes.partition_rules import PartitionRuleError
from optcore._src.ground import paths

PyTree = Any
MeshAxes = str | tuple[str, ...] | None
LogicalAxisRules = Sequence[tuple[str, MeshAxes]]


def logical_to_mesh_axes(spec: PartitionSpec | None, rules: LogicalAxisRules | None) -> Any:
  """One logical `PartitionSpec` as mesh axes, by Flax's ``logical_axis_rules``.

  The rules are ``(logical_name, mesh_axes)`` pairs in order of precedence: a
  dimension takes the first rule for its name whose mesh axes no other
  dimension uses yet. A name with no usable rule is replicated (None), as in
  Flax. ``rules=None`` reads the names as mesh axes already.

  Args:
    spec: logical axis names, one per dimension (None: replicated).
    rules: ``(logical_name, mesh_axes)`` pairs; None: the names are mesh axes.

  Returns:
    A `PartitionSpec` of mesh axes (or None where ``spec`` is None).

  Raises:
    optcore.PartitionRuleError: rules that are not ``(name, mesh_axes)`` pairs.

  Example:
    >>> from jax.sharding import PartitionSpec as P
    >>> from optcore import logical_to_mesh_axes
    >>> rules = [('batch', 'data'), ('mlp', 'model'), ('embed', 'model'), ('embed', 'data')]
    >>> logical_to_mesh_axes(P('embed', 'mlp'), rules) == P('data', 'model')
    True
  """
  if spec is None or rules is None:
    return spec
  _check_rules(rules)
  names = tuple(spec)
  counts = collections.Counter(n for n in names if isinstance(n, str))
  repeated = sorted(n for n, k in counts.items() if k > 1)
  if repeated:
    raise PartitionRuleError(f"the logical axes {spec} name {repeated} more than once")
  free = object()
  assigned: list[Any] = [free if isinstance(n, str) else n for n in names]
  used: set[str] = set()
  for logical, mesh_axes in rules:
    if logical not in names:
      continue
    pos = names.index(logical)
    wanted = _mesh_axis_set(mesh_axes)
    if assigned[pos] is free and not wanted & used:
      assigned[pos] = mesh_axes
      used |= wanted
  return PartitionSpec(*(None if a is free else a for a in assigned))


def constrain(x: jax.Array, where: Any) -> jax.Array:
  """``x`` placed on ``where`` inside ``jit``: on a mesh with Explicit axes (``jax.make_mesh``'s
  default), where an array's type carries its sharding and ``with_sharding_constraint``
  refuses those axes, `jax.sharding.reshard`; on Auto axes, which ``reshard`` refuses,
  ``with_sharding_constraint``."""
  if _explicit(where):
    return jax.sharding.reshard(x, where)
  return jax.lax.with_sharding_constraint(x, where)


def with_auto_axes(fn: Callable[..., Any], reference: tuple[PyTree, ...], *args: Any) -> Any:
  """``fn(*args)`` with every Explicit mesh axis of the arrays Auto inside, its result typed as
  ``reference`` (a tuple of its structure, the new parameters' first) is, where any array of
  ``args`` is split over an Explicit axis; else ``fn(*args)`` itself (the same program).

  On a mesh with Explicit axes (``jax.make_mesh``'s default) an array's type carries its
  sharding, and an operation whose result's sharding JAX cannot infer (a reshape of a split
  dimension, a norm or a matrix product across one) is an error. An optimizer's maths, optax's
  included, is written for the compiler to place, as under Auto axes; so a step runs it that
  way and types what it returns as what it was given: a parameter as the parameter, a state
  leaf as the state leaf. A function among ``args`` (optax's ``value_fn``) is the user's code:
  it runs with the axes Explicit again."""
  leaves, treedef = jax.tree.flatten(args)
  arrays = [x for x in leaves if isinstance(x, jax.Array)]  # not optax's value_fn, a function
  explicit = next((s for s in map(_type_sharding, arrays) if _explicit(s)), None)
  if explicit is None:
    return fn(*args)
  mesh = explicit.mesh
  replicated = NamedSharding(mesh, PartitionSpec())

  def typed(x: Any) -> NamedSharding:
    where = _type_sharding(x)
    if isinstance(where, NamedSharding) and where.mesh == mesh:
      return where
    return replicated  # a counter made on one device

  out = jax.tree.map(typed, reference)

  def explicit_again(f: Callable[..., Any]) -> Callable[..., Any]:
    """A function of the user's (optax's ``value_fn``, called on candidate parameters) runs
    with the axes Explicit again: what it closes over (a batch split over 'data') is typed on
    that mesh. Its argument is typed as the parameters where it has their structure."""

    def call(*a: Any) -> Any:
      fits = jax.tree.structure(a) == jax.tree.structure(out[:1])
      where = out[:1] if fits else jax.tree.map(lambda _: replicated, a)
      return jax.sharding.explicit_axes(f, in_sharding=where)(*a)

    return call

  def on_arrays(given: list[jax.Array]) -> Any:
    it = iter(given)
    back = [
      next(it) if isinstance(x, jax.Array) else explicit_again(x) if callable(x) else x
      for x in leaves
    ]
    return fn(*treedef.unflatten(back))

  return jax.sharding.auto_axes(on_arrays, out_sharding=out)(arrays)


def explicit_mesh_of(tree: PyTree) -> Any:
  """The mesh of the first array of ``tree`` typed on a mesh with an Explicit axis (a
  concrete array's `Mesh`, a traced one's abstract mesh), or None."""
  arrays = [x for x in jax.tree.leaves(tree) if isinstance(x, jax.Array)]
  where = (_type_sharding(x) if isinstance(x, Tracer) else x.sharding for x in arrays)
  explicit = next((s for s in where if _explicit(s)), None)
  return explicit.mesh if isinstance(explicit, NamedSharding) else None


def init_with_auto_axes(init: Callable[[Any], Any], params: PyTree) -> Any:
  """``init(params)`` with every Explicit mesh axis of the parameters Auto inside, each leaf
  of the state it makes replicated on that mesh; else ``init(params)`` itself.

  A state initialiser pads, reshapes or casts leaf by leaf (a quantized state's blocks), which
  an Explicit axis refuses on a split dimension, and on jax 0.10 a ``jit`` of arrays typed on
  such a mesh needs it set. Where each leaf then lives is the placement's decision
  (`create_sharded`, a face's ``shard``); replicated is where nothing is lost."""
  mesh = explicit_mesh_of(params)
  if mesh is None:
    return init(params)
  replicated = NamedSharding(mesh, PartitionSpec())
  unplaced = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, params
  )
  out = jax.tree.map(lambda _: replicated, jax.eval_shape(init, unplaced))
  return jax.sharding.auto_axes(init, out_sharding=out)(params)


def _type_sharding(x: Any) -> Any:
  """The sharding ``x``'s type carries (under ``jit``) or ``x`` has (outside)."""
  return getattr(jax.typeof(x), "sharding", None)


def _explicit(where: Any) -> bool:
  """Whether ``where`` is on a mesh with an Explicit axis and names no Auto one."""
  if not isinstance(where, NamedSharding):
    return False
  types = dict(zip(where.mesh.axis_names, where.mesh.axis_types, strict=True))
  named = [a for entry in where.spec if entry is not None for a in _mesh_axis_set(entry)]
  explicit = jax.sharding.AxisType.Explicit
  return explicit in types.values() and all(types[a] == explicit for a in named)


def _mesh_axis_set(mesh_axes: MeshAxes) -> set[str]:
  if mesh_axes is None:
    return set()
  return {mesh_axes} if isinstance(mesh_axes, str) else set(mesh_axes)


def _check_rules(rules: Any) -> None:
  if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
    raise PartitionRuleError(
      f"logical_axis_rules must be a sequence of (logical_name, mesh_axes) pairs, got {rules!r}"
    )
  for rule in rules:
    ok = isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)
    mesh_axes = rule[1] if ok else None
    ok = ok and (
      mesh_axes is None
      or isinstance(mesh_axes, str)
      or (isinstance(mesh_axes, (tuple, list)) and all(isinstance(a, str) for a in mesh_axes))
    )
    if not ok:
      raise PartitionRuleError(
        f"the logical axis rule {rule!r} is not a (logical_name, mesh_axes) pair, where "
        "mesh_axes is a mesh axis name, a tuple of them, or None. Example: ('mlp', 'model')."
      )


def logical_to_mesh(tree: PyTree, rules: LogicalAxisRules | None) -> PyTree:
  """`logical_to_mesh_axes` on every PartitionSpec of ``tree`` (None stays None).

  Args:
    tree: a tree of logical `PartitionSpec` objects (or None).
    rules: ``(logical_name, mesh_axes)`` pairs; None: the names are mesh axes.

  Returns:
    The tree with mesh-axis `PartitionSpec` objects.

  Raises:
    optcore.PartitionRuleError: rules that are not ``(name, mesh_axes)`` pairs.

  Example:
    >>> from jax.sharding import PartitionSpec as P
    >>> from optcore import logical_to_mesh
    >>> mesh_axes = logical_to_mesh({'w': P('embed', 'mlp'), 'b': P('mlp')}, [('mlp', 'model')])
    >>> mesh_axes == {'w': P(None, 'model'), 'b': P('model')}
    True
  """
  return jax.tree.map(lambda spec: logical_to_mesh_axes(spec, rules), tree)


def logical_to_mesh_sharding(
  tree: PyTree, mesh: Mesh, rules: LogicalAxisRules | None = None
) -> PyTree:
  """A `NamedSharding` on ``mesh`` for every logical PartitionSpec of ``tree``.

  Raises `PartitionRuleError` naming the path when a spec uses an axis that
  ``mesh`` does not have.

  Args:
    tree: a tree of logical `PartitionSpec` objects.
    mesh: the device mesh.
    rules: ``(logical_name, mesh_axes)`` pairs; None: the names are mesh axes.

  Returns:
    The tree with a `NamedSharding` at each spec.

  Raises:
    optcore.PartitionRuleError: a spec uses an axis the mesh does not have
      (named by its path).

  Example:
    >>> import jax, numpy as np
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> from optcore import logical_to_mesh_sharding
    >>> mesh = Mesh(np.array(jax.devices()[:1]), ('model',))
    >>> shardings = logical_to_mesh_sharding({'w': P('embed', 'mlp')}, mesh, [('mlp', 'model')])
    >>> shardings['w'].spec == P(None, 'model')
    True
  """
  keyed, treedef = jax.tree_util.tree_flatten_with_path(tree)
  out = []
  for keys, spec in keyed:
    if not isinstance(spec, PartitionSpec):
      raise PartitionRuleError(
        f"at {paths.path_str(keys)!r}: expected a PartitionSpec, found {spec!r}"
      )
    mesh_spec = logical_to_mesh_axes(spec, rules)
    unknown = sorted(
      {a for entry in mesh_spec for a in _mesh_axis_set(entry)} - set(mesh.axis_names)
    )
    if unknown:
      raise PartitionRuleError(
        f"at {paths.path_str(keys)!r}: {spec} maps to {mesh_spec}, which names the mesh "
        f"axes {unknown}; the mesh has {list(mesh.axis_names)}. Fix the logical axis rules "
        "or the mesh."
      )
    out.append(NamedSharding(mesh, mesh_spec))
  return treedef.unflatten(out)


def ways(mesh: Mesh, entry: Any) -> int:
  """How many ways a spec entry (a mesh axis, a tuple of them, or None) splits a dimension."""
  return math.prod(mesh.shape[a] for a in _mesh_axis_set(entry))


def check_divisible(shapes: PyTree, shardings: PyTree) -> None:
  """Raises `PartitionRuleError` naming the first leaf whose sharded dimension
  the mesh does not divide evenly."""
  keyed, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  for (keys, leaf), sharding in zip(keyed, treedef.flatten_up_to(shardings), strict=True):
    for dim, (size, entry) in enumerate(zip(leaf.shape, sharding.spec, strict=False)):
      split = ways(sharding.mesh, entry)
      if size % split:
        raise PartitionRuleError(
          f"at {paths.path_str(keys)!r}: dimension {dim} of shape {tuple(leaf.shape)} has size "
          f"{size}, which the mesh axes {entry!r} ({split} ways) do not divide. Give that "
          "dimension another logical axis, or map its axis to None in the rules."
        )
