"""The Flax NNX face: ``nnx.Optimizer``'s API over any optcore definition.

`Optimizer` is ``flax.nnx.Optimizer`` (it subclasses it: the same constructor, ``step``,
``opt_state``, ``update(model, grads, **kwargs)``, the same ``nnx.state(optimizer)`` layout for
orbax checkpoints), taking an optcore definition or a plain optax transformation, so that
replacing the import line is enough. On top it carries what optcore adds, under the names every
face uses: hyper-parameter overrides as ``update`` keywords (honoured under ``nnx.jit`` without a
recompile per value, a misspelt one refused), ``ema_params``, ``current_hyper_params``,
``state_dict``/``restore_state`` in optcore's portable layout, and ``transplant``.

Placement comes from each trained variable's metadata, read before any rule resolves it: its
logical names (``out_sharding``, a stack axis ``nnx.vmap``/``nnx.scan`` added among them), its
``sharding_rules``, ``optimizer_sharding`` and ``mesh``. Each state leaf is laid out as the
definition derives from its parameter's names, every counter replicated on the parameters'
mesh, and each update keeps the parameters and the state where they were on Auto and Explicit
meshes alike; the state's variables carry their placement in their metadata, so a checkpoint
restored into ``nnx.eval_shape``'s optimizer lands there (docs: "NNX: what the face does
beyond nnx.Optimizer").

The module stands in for ``flax.nnx`` itself: every other name (``nnx.Linear``, ``nnx.jit``,
``nnx.state``, ...) is ``flax.nnx``'s, so a program written against ``nnx.Optimizer`` runs on
optcore with one line changed, ``from flax import nnx`` to ``from optcore_flax import nnx``.
`ModelAndOptimizer` is Flax's class of that name (the optimizer that holds its model) over the
face.

Example:
  >>> import jax, jax.numpy as jnp
  >>> from flax import nnx
  >>> import optcore
  >>> from optcore_flax import nnx as ocnnx
  >>> model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
  >>> optimizer = ocnnx.Optimizer(model, optcore.ema(optcore.adamw(1e-2), 0.9), wrt=nnx.Param)
  >>> grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 2))) ** 2))(model)
  >>> _ = optimizer.update(model, grads, learning_rate=1e-3)  # an override, for this step
  >>> int(optimizer.step[...]), sorted(optimizer.ema_params(model))
  (1, ['bias', 'kernel'])
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any as _Any
from typing import Unpack as _Unpack

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

import optcore
from optcore import adapter
from optcore_flax import _nnx_placement as placed

__all__ = ["ModelAndOptimizer", "Optimizer"]

PyTree = _Any
_MISSING: _Any = object()


class Optimizer(nnx.Optimizer):
  """``flax.nnx.Optimizer`` over an optcore definition (or an optax transformation).

  Args:
    model: the NNX module whose ``wrt`` variables are trained.
    tx: an optcore definition (``optcore.adamw(1e-3)``, a `MultiOptimizer`
      whose selectors are path regexes or nnx filters such as ``nnx.LoRAParam``
      or ``nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))``, any wrapper), or an
      optax ``GradientTransformation``. The face reads an nnx filter selector
      on the model's variables once, here.
    wrt: the nnx filter of the trained variables (``nnx.Param``). Required,
      as in current Flax; left out, the optimizer behaves as Flax's before
      0.11 did, with a ``DeprecationWarning``: it trains ``nnx.Param`` and
      holds the model (``optimizer.model``), so ``update(grads)`` works.

  Raises:
    TypeError: ``tx`` is neither a definition nor an optax transformation,
      or a grouped definition (its parameters live in its own buffers).

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import optcore
    >>> from optcore_flax import nnx as ocnnx
    >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    >>> optimizer = ocnnx.Optimizer(model, optcore.sgd(0.1), wrt=nnx.Param)
    >>> before = model.bias[...]
    >>> _ = optimizer.update(model, nnx.state(model, nnx.Param), learning_rate=0.0)
    >>> bool((model.bias[...] == before).all())  # learning_rate=0.0 for this step
    True
  """

  def __init__(self, model: _Any, tx: _Any, *, wrt: _Any = _MISSING, **kwargs: _Any):
    holds_model = wrt is _MISSING
    if holds_model:
      warnings.warn(
        "optcore_flax.nnx.Optimizer without wrt= trains nnx.Param and holds the model, as Flax "
        "before 0.11 did (update(grads)); current Flax requires wrt: pass wrt=nnx.Param and "
        "call update(model, grads), or use ModelAndOptimizer.",
        DeprecationWarning,
        stacklevel=2,
      )
      wrt = nnx.Param
    optimizer_def = adapter.as_definition(tx, "optcore_flax.nnx.Optimizer")
    optimizer_def = _with_variable_selectors(optimizer_def, model, wrt)
    trained = nnx.state(model, wrt)
    variables, treedef = placed.read_variables(trained)
    axes = placed.logical_axes(variables, treedef)
    if axes is not None:  # a definition that reads them (contrib.muon) takes the model's own
      optimizer_def = optimizer_def.with_param_logical_axes(axes)
    self.optimizer_def = optimizer_def
    tx = optimizer_def.as_optax()
    # Where the face places the state (a variable is on a mesh), Flax's copy of each variable's
    # metadata to its state must not shard by it: a quantized moment's blocks or a factored
    # one's rows do not have the variable's dimensions. The face places every leaf below.
    placing = any(v.mesh is not None for v in variables)
    super().__init__(model, placed.without_eager_sharding(tx) if placing else tx, wrt=wrt, **kwargs)
    self.tx = tx
    state_variables = _state_variables(self)
    self._placement = placed.at_creation(
      optimizer_def,
      _as_state(self),
      nnx.as_pure(self.opt_state),
      state_variables,
      nnx.as_pure(trained),
      variables,
      treedef,
    )
    if self._placement is not None:
      held = [v for _, v in state_variables]
      values = placed.place([v.get_value() for v in held], self._placement.state)
      for variable, value in zip(held, values, strict=True):
        variable.set_value(value)
      self._place_step_and_declare(placed.place)
    if holds_model:
      self.model = model

  def update(self, model: _Any, grads: _Any = _MISSING, /, **kwargs: _Any) -> _Any:
    """Applies ``grads`` to ``model``'s ``wrt`` variables and advances the state, as
    ``nnx.Optimizer.update`` does; keywords are hyper-parameter overrides for this step
    (``learning_rate=lr``) or optax's extra arguments (``value``, ``grad``, ``value_fn``).

    Args:
      model: the module the gradients are for (an optimizer made without ``wrt``, the
        pre-0.11 form, holds it: ``update(grads)``).
      grads: the gradients, as ``nnx.grad`` gives them.
      **kwargs: overrides, or optax's extra arguments.

    Returns:
      The updates applied (new minus old values), in the structure of ``model``'s ``wrt``
      state; unused under ``jax.jit``, XLA drops them.

    Raises:
      TypeError: ``grads`` missing on an optimizer that does not hold its model; a keyword
        that is no hyper-parameter of the definition.
      optcore.TreeMismatchError: ``grads`` does not fit the trained variables (named by
        path); the model and the state are left as they were.
    """
    if grads is _MISSING:
      held = vars(self).get("model")
      if held is None:
        raise TypeError(
          "Missing required argument `grads`: update(model, grads), as Flax 0.11 and later "
          "take it. An optimizer made without wrt= (the pre-0.11 form) holds its model and "
          "takes update(grads); so does ModelAndOptimizer."
        )
      model, grads = held, model
    params = nnx.as_pure(self._wrt_state(model))
    grad_arrays = nnx.as_pure(self._wrt_state(grads))
    overrides, extra = adapter.split_update_arguments(
      nnx.as_pure(kwargs), self.optimizer_def.extra_arg_names()
    )
    # adapter.step checks the gradients (a wrong one named by path), honours or refuses each
    # override and keeps host-memory state where it lives; the new parameters are the
    # definition's own (bitwise the core face's; for optax, optax.apply_updates as Flax's).
    new_params, new_state = adapter.step(
      self.optimizer_def, params, _as_state(self), grad_arrays, extra_args=extra, **overrides
    )
    step = self.step[...] + 1
    if self._placement is not None:  # on an Auto mesh nothing else keeps them where they were
      leaves, treedef = jax.tree.flatten(new_params)
      if len(leaves) == len(self._placement.params):
        new_params = treedef.unflatten(placed.keep(leaves, self._placement.params))
      step = placed.keep([step], [self._placement.step])[0]
    self._set_state(new_state)
    nnx.update(model, new_params)
    self.step[...] = step
    return jax.tree.map(jnp.subtract, new_params, params)

  @property
  def state(self) -> optcore.OptimizerState:
    """The optimizer state as every face holds it, arrays unboxed: an `optcore.OptimizerState`
    (for an optax transformation, its state with nnx's ``step``). The read-out functions
    (`optcore.ema_params`, `optcore.current_hyper_params`) read it."""
    return _as_state(self)

  def readout_parameters(self, model: _Any) -> PyTree:
    """The trained variables of ``model`` as arrays, in the optimizer state's structure (what
    `optcore.ema_params` fills the unaveraged leaves from)."""
    return nnx.as_pure(self._wrt_state(model))

  def _wrt_state(self, tree: _Any) -> _Any:
    """``tree``'s ``wrt`` variables, in Flax's graph or tree mode as this optimizer was made
    (``graph=``, Flax 0.12.9 and later)."""
    graph = getattr(self, "graph", None)
    return nnx.state(tree, self.wrt) if graph is None else nnx.state(tree, self.wrt, graph=graph)

  def ema_params(self, model: _Any) -> nnx.State:
    """The moving average of ``model``'s trained variables (an `optcore.ema` anywhere in the
    definition), as an ``nnx.State``: ``nnx.update(model, optimizer.ema_params(model))`` puts it
    in the model. Variables no group averages come back as they are; arrays are on the device.

    Raises:
      TypeError: the definition keeps no average (the message says how to keep one).
    """
    return optcore.ema_params(self, model)

  def eval_params(self, model: _Any) -> nnx.State:
    """``model``'s trained variables at the point a schedule-free definition
    (``optcore.contrib.schedule_free_adamw``, ...) evaluates, as an ``nnx.State``:
    ``nnx.update(model, optimizer.eval_params(model))`` puts them in the model (see
    `optcore.eval_params`).

    Raises:
      TypeError: the definition keeps no schedule-free state.
    """
    return optcore.eval_params(self, model)

  def current_hyper_params(self) -> dict[str, _Any]:
    """The hyper-parameters the next `update` takes unless overridden, for logging (see
    `optcore.current_hyper_params`); works under ``nnx.jit``."""
    return optcore.current_hyper_params(self)

  def state_dict(self) -> dict[str, _Any]:
    """``{'state': {'step', 'param_states'}}``: optcore's portable layout, which every face
    restores (`restore_state`)."""
    return adapter.state_dict(self.optimizer_def, _as_state(self))

  def restore_state(self, state_dict: Mapping[str, _Any]) -> None:
    """Reads a state dict of any face into this optimizer, in place as nnx does; on an error
    nothing changes.

    Raises:
      optcore.StateDictError: a state dict written for another optimizer or other parameters
        (the message names the path).
    """
    restored = adapter.restore_state(self.optimizer_def, _as_state(self), state_dict)
    self._set_state(restored)

  def transplant(self, state_dict: Mapping[str, _Any], model: _Any = None) -> _Any:
    """Fills this optimizer, in place, from a state dict written for another optimizer or other
    parameters, where parameter, role and shape still match (see `optcore.transplant`); returns
    the `optcore.TransplantReport`.

    Raises:
      TypeError: no ``model`` (this optimizer does not hold it).
    """
    if model is None:
      raise TypeError(
        "optcore_flax.nnx.Optimizer.transplant needs the model (it does not hold it): "
        "optimizer.transplant(state_dict, model)."
      )
    state, report = adapter.transplant_state(
      self.optimizer_def, self.readout_parameters(model), _as_state(self), state_dict
    )
    self._set_state(state)
    return report

  def shard(
    self,
    model: _Any,
    mesh: Mesh | optcore.Placement | None = None,
    logical_axis_rules: Sequence[tuple[str, _Any]] | None = None,
    **placement: _Unpack[adapter.StatePlacement],
  ) -> Optimizer:
    """Places this optimizer's state, in place, as ``model``'s partitioning metadata says:
    each state array follows the parameter it belongs to (its ``optimizer_sharding`` or
    ``out_sharding`` names, mapped as nnx maps them by the context's rules, the variable's
    ``sharding_rules`` and then ``logical_axis_rules``; a variable without names is
    replicated), ``state_axis=`` splits every state array over that mesh axis as well (ZeRO-1),
    ``state_memory_kind="pinned_host"`` keeps it in host memory between steps. Each ``update``
    keeps the placement, the parameters' too.

    Args:
      model: the module this optimizer trains.
      mesh: the device mesh, or an `optcore.Placement`; None: the mesh of ``jax.set_mesh``.
      logical_axis_rules: ``(logical_name, mesh_axes)`` pairs for logical names in the
        metadata.
      **placement: ``state_axis=``, ``state_memory_kind=`` (see `optcore.Placement`).

    Returns:
      This optimizer.

    Raises:
      TypeError: no mesh given and none set with ``jax.set_mesh``.
      optcore.PartitionRuleError: a dimension the mesh does not divide, metadata naming a
        number of axes other than its variable's rank (a stack axis ``nnx.vmap`` added without
        ``transform_metadata``), a name that maps to no axis of the mesh (named by path).

    Example (ZeRO-1: a replicated model, its moments split over ``'data'``):
      >>> import jax, numpy as np
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> import optcore
      >>> from optcore_flax import nnx
      >>> model = nnx.Linear(4, 2, rngs=nnx.Rngs(0))
      >>> optimizer = nnx.Optimizer(model, optcore.adam(1e-3), wrt=nnx.Param)
      >>> mesh = Mesh(np.array(jax.devices()[:1]), ('data',))
      >>> _ = optimizer.shard(model, mesh, state_axis='data')
      >>> optimizer.state.param_states[0].mu['kernel'].sharding.spec == P('data', None)
      True
    """
    if mesh is None:
      mesh = jax.sharding.get_mesh()
      if mesh.empty:
        raise TypeError(
          "optcore_flax.nnx.Optimizer.shard needs a mesh: pass mesh=, or call it inside "
          "`with jax.set_mesh(mesh):`."
        )
    state = _as_state(self)
    variables, treedef = placed.read_variables(nnx.state(model, self.wrt))
    shardings, self._placement = placed.for_shard(
      self.optimizer_def,
      state,
      nnx.as_pure(self.opt_state),
      self.readout_parameters(model),
      variables,
      treedef,
      mesh,
      logical_axis_rules,
      placement,
    )
    self._set_state(jax.device_put(state, shardings))
    self._place_step_and_declare(placed.keep)
    return self

  def _place_step_and_declare(self, put: _Any) -> None:
    """Puts the step where the placement keeps it (``put``: `placed.place` at creation,
    `placed.keep` after) and writes the placement into the state variables' metadata."""
    placement = self._placement
    if placement is None:
      return
    self.step.set_value(put([self.step.get_value()], [placement.step])[0])
    held = [v for _, v in _state_variables(self)]
    placed.declare([*held, self.step], [*placement.state, placement.step])

  def _set_state(self, state: optcore.OptimizerState) -> None:
    """Writes ``state`` into this optimizer's variables (their metadata kept)."""
    new = self.optimizer_def.to_optax_state(state, like=nnx.as_pure(self.opt_state))
    variables = jax.tree.leaves(self.opt_state, is_leaf=_is_variable)
    values = jax.tree.leaves(new)
    if len(variables) != len(values):  # restore_state checked the structure; never expected
      raise optcore.StateDictError("the restored state does not fit this optimizer's variables")
    step = None
    if not isinstance(new, optcore.OptimizerState):  # the state keeps no step: nnx's is it
      step = jnp.asarray(state.step, self.step[...].dtype)
    if self._placement is not None:  # every leaf where the placement keeps it, counters too
      values = placed.keep(values, self._placement.state)
      step = None if step is None else placed.keep([step], [self._placement.step])[0]
    if step is not None:
      self.step.set_value(step)
    for variable, value in zip(variables, values, strict=True):
      variable.set_value(value)


class ModelAndOptimizer(Optimizer):
  """Flax's ``nnx.ModelAndOptimizer`` over the face: the optimizer holds its model
  (``optimizer.model``) and takes ``update(grads, **kwargs)``. Flax marks the class
  deprecated; it is here so that programs using it change only their import line.

  Args:
    model: the NNX module trained.
    tx: an optcore definition or an optax transformation.
    wrt: the nnx filter of the trained variables (``nnx.Param``).

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> from optcore_flax import nnx
    >>> state = nnx.ModelAndOptimizer(nnx.Linear(2, 1, rngs=nnx.Rngs(0)), optcore.sgd(0.1))
    >>> grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 2)))))(state.model)
    >>> _ = state.update(grads)
    >>> int(state.step[...])
    1
  """

  def __init__(self, model: _Any, tx: _Any, *, wrt: _Any = nnx.Param, **kwargs: _Any):
    super().__init__(model, tx, wrt=wrt, **kwargs)
    self.model = model

  def update(self, grads: _Any, /, **kwargs: _Any) -> _Any:  # type: ignore[override]
    """``Optimizer.update(self.model, grads, **kwargs)``."""
    return super().update(self.model, grads, **kwargs)


def __getattr__(name: str) -> _Any:
  """Every other name is ``flax.nnx``'s: the module stands in for it."""
  try:
    return getattr(nnx, name)
  except AttributeError:
    raise AttributeError(f"module 'optcore_flax.nnx' has no attribute {name!r}") from None


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(dir(nnx)))


_FILTER_NAMES = ("OfType", "Any", "All", "Not", "PathContains", "PathIn", "WithTag", "Everything")
_FILTER_TYPES = tuple(
  getattr(nnx.filterlib, n) for n in (*_FILTER_NAMES, "Nothing") if hasattr(nnx.filterlib, n)
)


def _is_variable_filter(selector: _Any) -> bool:
  """An nnx filter over variables (a Variable type, a tuple of filters, one of nnx's filter
  objects), as opposed to optcore's own selectors (a regex, a predicate, a mask)."""
  if isinstance(selector, type):
    return issubclass(selector, nnx.Variable)
  if isinstance(selector, tuple) and selector:
    return all(_is_variable_filter(s) for s in selector)
  return isinstance(selector, _FILTER_TYPES)


def _with_variable_selectors(opt_def: _Any, model: _Any, wrt: _Any) -> _Any:
  """``opt_def`` with each selector that is an nnx filter, in any `MultiOptimizer` of its tree
  (a group's, or one inside ``ema``, ``accumulate`` ...), replaced by the boolean mask it picks
  on ``model``'s ``wrt`` variables; the definition itself where it has none."""
  variables = None

  def mask(selector: _Any) -> _Any:
    nonlocal variables
    variables = nnx.state(model, wrt) if variables is None else variables
    picks = nnx.filterlib.to_predicate(selector)
    return jax.tree_util.tree_map_with_path(
      lambda path, v: bool(picks(tuple(getattr(k, "key", k) for k in path), v)),
      variables,
      is_leaf=_is_variable,
    )

  def resolve(d: _Any, _: _Any) -> _Any:
    if not isinstance(d, optcore.MultiOptimizer) or not any(map(_is_variable_filter, d.traversals)):
      return d
    pairs = zip(d.traversals, d.sub_optimizers, strict=True)
    resolved = optcore.MultiOptimizer(
      *((mask(s) if _is_variable_filter(s) else s, o) for s, o in pairs)
    )
    resolved.hyper_params = list(d.hyper_params)
    return resolved

  return adapter.map_definitions(resolve, opt_def)


def _is_variable(x: _Any) -> bool:
  return isinstance(x, nnx.Variable)


def _state_variables(optimizer: Optimizer) -> list[tuple[str, nnx.Variable]]:
  """The optimizer state's variables with their paths, in the order of its leaves."""
  named, _ = optcore.leaves_with_paths(nnx.as_pure(optimizer.opt_state))
  variables = jax.tree.leaves(optimizer.opt_state, is_leaf=_is_variable)
  return [(path, v) for (path, _), v in zip(named, variables, strict=True)]


def _as_state(optimizer: Optimizer) -> optcore.OptimizerState:
  """The state as an `optcore.OptimizerState` (an optax transformation's with nnx's step)."""
  step = jnp.asarray(optimizer.step[...], jnp.int32)
  return optimizer.optimizer_def.from_optax_state(nnx.as_pure(optimizer.opt_state), step)
