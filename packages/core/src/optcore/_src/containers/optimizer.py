"""The optimizer's state and the immutable Optimizer container (flax.optim's and T5X's).

An `OptimizerState` holds the step and the per-parameter state; an `Optimizer`
ties a definition, a state and the parameters (the target) together. Both are
pytrees that pass through `jax.jit`; the definition is static data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from optcore._src.axes import sharding
from optcore._src.containers.step import apply_step
from optcore._src.ground.state import OptimizerState
from optcore._src.ground.user_warnings import warn
from optcore._src.persistence import schedule_free
from optcore._src.persistence.transplant import TransplantReport, transplant_state

PyTree = Any
T = TypeVar("T")


@dataclasses.dataclass(frozen=True, eq=False)
class Pins:
  """Static shardings, one per target leaf, that a step keeps the target on.

  A hint, not part of the optimizer's identity: all pins compare equal, so an optimizer pinned
  by `create_sharded`, the same optimizer without pins (``jax.eval_shape(opt_def.create,
  params)``, the tree `derive_shardings` returns, a plain `create`) and one restored onto
  another mesh have equal tree structures: the shardings of one serve as ``in_shardings`` or
  ``out_shardings`` of another, and ``jax.tree.map`` takes them together. The price: a jitted
  step traced once keeps the pins of its first call for optimizers of the same structure, so
  moving an optimizer to another mesh takes a new ``jax.jit`` of the step."""

  shardings: tuple[Any, ...] | None = None
  # ZeRO-1: where each leaf's update is computed (split like its state) before it is gathered
  # onto ``shardings``; pinning the result alone moved that work and its rounding (jax 0.10's
  # ZeRO-1 steps stopped being bitwise the one-device run's).
  split: tuple[Any, ...] | None = None

  @classmethod
  def of(cls, shardings: PyTree, split: PyTree | None = None) -> Pins:
    """Pins from a tree of target shardings (and of their ZeRO-1 split)."""
    return cls(tuple(jax.tree.leaves(shardings)), split and tuple(jax.tree.leaves(split)))

  def __eq__(self, other: object) -> bool:
    return isinstance(other, Pins)

  def __hash__(self) -> int:
    return hash(Pins)


class BoundOptimizer(Generic[T]):
  """What every optimizer bound to its target has, read through ``target``, ``state`` and
  ``replace`` alone: `Optimizer` holds them as they are, `GroupedOptimizer` in the buffers of
  its layout. One implementation of each, so the two containers cannot drift apart."""

  optimizer_def: Any
  if TYPE_CHECKING:  # each container's own: dataclass fields, or views of its buffers

    @property
    def target(self) -> T: ...

    @property
    def state(self) -> OptimizerState: ...

  def apply_gradient(self, grads: PyTree, **kwargs: Any) -> Self:
    """One step (each container's own: see `Optimizer.apply_gradient`)."""
    raise NotImplementedError

  def replace(self, **changes: Any) -> Self:
    """A copy with ``target=`` and/or ``state=`` replaced (each container's own)."""
    raise NotImplementedError

  def _stepped(
    self,
    held: tuple[PyTree, OptimizerState],
    grads: PyTree,
    extra_args: Mapping[str, Any] | None,
    overrides: Mapping[str, Any],
    pins: Pins,
  ) -> tuple[PyTree, OptimizerState]:
    """Both containers' step on what they hold (``(target, state)``, grouped or not): the new
    target, kept on ``pins``, and the new state."""
    new_target, new_state = apply_step(
      self.optimizer_def,
      *held,
      grads,
      extra_args=extra_args,
      apply_updates=True,  # reserved: an override of that name is an error, not a mode
      **overrides,
    )
    return keep_shardings(new_target, pins), new_state

  def compute_gradient(self, loss_fn: Callable[[T], Any]) -> tuple:
    """flax.optim's helper: the loss and its gradient with respect to the target.

    Args:
      loss_fn: ``target -> loss``, or ``target -> (loss, aux)``.

    Returns:
      ``(loss, grad)``, or ``(loss, aux, grad)`` when ``loss_fn`` returns ``(loss, aux)``.

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore
      >>> opt = optcore.sgd(0.1).create({'w': jnp.ones(2)})
      >>> loss, grad = opt.compute_gradient(lambda p: jnp.sum(p['w'] ** 2))
      >>> float(loss), grad['w']
      (2.0, Array([2., 2.], dtype=float32))
    """

    def wrapped(target):
      out = loss_fn(target)
      return (out[0], tuple(out[1:])) if isinstance(out, (tuple, list)) else (out, None)

    (loss, aux), grad = jax.value_and_grad(wrapped, has_aux=True)(self.target)
    if aux is None:
      return loss, grad
    return (loss, *aux, grad)

  compute_gradients = compute_gradient

  def optimize(self, loss_fn: Callable[[T], Any], **hyper_param_overrides: Any) -> tuple:
    """flax.optim's deprecated one-call step: ``(new_optimizer, loss[, aux])``,
    the loss computed before the update."""
    warn(
      "Optimizer.optimize() is deprecated (as in flax.optim): compute the gradient with "
      "jax.grad or Optimizer.compute_gradient and call apply_gradient.",
      DeprecationWarning,
    )
    *outputs, grad = self.compute_gradient(loss_fn)
    return (self.apply_gradient(grad, **hyper_param_overrides), *outputs)

  def current_hyper_params(self) -> dict[str, jax.Array]:
    """The hyper-parameters the next `apply_gradient` takes unless overridden,
    for logging: a flat dict of scalar arrays, schedules evaluated at this
    step, per group for a `MultiOptimizer` (``'0/learning_rate'``). Works
    inside ``jit``; a schedule's value changes without a recompile.

    Returns:
      ``{name: scalar array}``: ``'learning_rate'``, ``'0/learning_rate'`` per group, ...

    Example:
      >>> import jax, jax.numpy as jnp, optax
      >>> import optcore
      >>> opt = optcore.sgd(optax.exponential_decay(1.0, 1, 0.5)).create({'w': jnp.ones(1)})
      >>> opt = opt.apply_gradient({'w': jnp.ones(1)}).apply_gradient({'w': jnp.ones(1)})
      >>> jax.jit(lambda o: o.current_hyper_params())(opt)
      {'learning_rate': Array(0.25, dtype=float32)}
    """
    return self.optimizer_def.current_hyper_params(self.state)

  @property
  def eval_params(self) -> T:
    """The target at the point a schedule-free run evaluates (see `optcore.eval_params`);
    TypeError for a definition that keeps no schedule-free state."""
    if not schedule_free.keeps_schedule_free(self.state):
      raise TypeError(
        f"eval_params: {self.optimizer_def.display_name()} keeps no schedule-free state (see "
        "optcore.eval_params)."
      )
    return schedule_free.eval_params(self.state, self.target)

  @property
  def ema_params(self) -> T:
    """The moving average of the target that an `optcore.ema` definition
    keeps, in the target's structure; TypeError for any other definition."""
    return fill_unaveraged(self.optimizer_def.ema_params(self.state), self.target)

  def transplant(
    self, state_dict: Mapping[str, Any], params: None = None
  ) -> tuple[Self, TransplantReport]:
    """This optimizer holding what ``state_dict`` still has for its state (same
    parameter, role and shape), and a report; see `optcore.transplant`. The
    target is this optimizer's; this one is untouched.

    Args:
      state_dict: any face's state dict, or an old flax.optim or T5X checkpoint's.
      params: not taken (this optimizer holds its target); for `optcore.transplant`'s
        one signature.

    Returns:
      ``(new_optimizer, report)``: a `TransplantReport`.

    Raises:
      TypeError: ``params`` given (this optimizer holds its target).
      optcore.StateDictError: ``state_dict`` has no ``'state'`` dict.

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore
      >>> old = optcore.sgd(0.1, momentum=0.9).create({'w': jnp.ones(2)})
      >>> opt, report = optcore.lars(0.1).create({'w': jnp.ones(2)}).transplant(old.state_dict())
      >>> [entry.path for entry in report.kept]
      ['step', 'param_states/3/trace/w']
    """
    if params is not None:
      raise TypeError(
        "Optimizer.transplant: this optimizer holds its parameters (its target); call "
        "optcore.transplant(optimizer, state_dict) without params."
      )
    state, report = transplant_state(self.optimizer_def, self.target, self.state, state_dict)
    return self.replace(state=state), report


@dataclasses.dataclass(frozen=True)
class Optimizer(BoundOptimizer[T]):
  """An optimizer definition bound to its target (the parameters) and state.

  Immutable: `apply_gradient` and `restore_state` return a new Optimizer. A
  pytree whose leaves are the state and the target; the definition is static.
  One made by `OptimizerDef.create_sharded` also holds, as static data, the
  target's shardings (``target_shardings``): each step keeps the new target on
  them, so a plain ``jax.jit`` step never returns the parameters split like a
  ZeRO-1 state.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.sgd(learning_rate=0.1).create({'w': jnp.ones(3)})
    >>> step = jax.jit(lambda opt, g, lr: opt.apply_gradient(g, learning_rate=lr))
    >>> opt = step(opt, {'w': jnp.ones(3)}, 0.5)
    >>> opt.target['w']
    Array([0.5, 0.5, 0.5], dtype=float32)
  """

  optimizer_def: Any  # an OptimizerDef (defined on top of this module)
  state: OptimizerState  # pyright: ignore[reportIncompatibleMethodOverride]  # a field here
  target: T  # pyright: ignore[reportIncompatibleMethodOverride]  # a field here
  # create_sharded's shardings of the target's leaves (see `Pins`): each step constrains the new
  # target to them, so ZeRO-1's split state never leaks into the parameters of a plain jax.jit
  # step. Pins() (none): the compiler decides.
  target_shardings: Pins = dataclasses.field(default_factory=Pins)

  def apply_gradient(
    self,
    grads: PyTree,
    *,
    extra_args: Mapping[str, Any] | None = None,
    **hyper_param_overrides: Any,
  ) -> Optimizer[T]:
    """Applies one update with ``grads``; returns the new Optimizer.

    Args:
      grads: gradients in the structure of ``target``.
      extra_args: keyword arguments for the optax update of
        ``GradientTransformationExtraArgs`` optimizers (``value=loss`` for
        polyak_sgd, ``value``/``grad``/``value_fn`` for lbfgs, ...).
      **hyper_param_overrides: hyper-parameter values for this step only,
        e.g. ``learning_rate=lr``; traced values do not cause recompiles.

    Returns:
      A new Optimizer: the updated target, the state one step on. This one is untouched.

    Raises:
      optcore.TreeMismatchError: ``grads`` lacks a parameter's gradient, has
        one of another shape, or another structure (the message names the path).
      TypeError: an override the definition does not have or refuses.
      optcore.MissingHyperParameterError: no learning rate anywhere.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> import optcore
      >>> opt = optcore.sgd(0.1).create({'w': jnp.ones(2)})
      >>> step = jax.jit(lambda o, g, lr: o.apply_gradient(g, learning_rate=lr))
      >>> opt = step(opt, {'w': jnp.ones(2)}, 0.5)
      >>> opt.target['w'], int(opt.state.step)
      (Array([0.5, 0.5], dtype=float32), 1)
    """
    held = (self.target, self.state)
    target, state = self._stepped(
      held, grads, extra_args, hyper_param_overrides, self.target_shardings
    )
    return self.replace(target=target, state=state)

  def replicate(
    self, devices: Sequence[Any] | None = None, axis_name: str = "batch"
  ) -> Optimizer[T]:
    """flax.optim's (deprecated) data-parallel copy: the target and state with a
    leading device axis for ``jax.pmap(..., axis_name=axis_name)``, under a
    `ReplicatedOptimizer` that averages the gradients across the replicas
    before each step, as flax.optim's did. (``flax.jax_utils.replicate`` and
    an explicit ``lax.pmean`` do the same without it.)"""
    devices = list(devices or jax.local_devices())
    wrapped = self.optimizer_def.replicated(devices, axis_name)
    return replicated(self, devices).replace(optimizer_def=wrapped)

  def unreplicate(self) -> Optimizer[T]:
    """The first device's copy of an optimizer made by `replicate`, under its own
    definition again; ValueError for any other, as in flax.optim."""
    inner = self.optimizer_def.unreplicated()
    if inner is None:
      raise ValueError("Cannot unreplicate an optimizer that is not replicated.")
    return jax.tree.map(lambda x: x[0], self).replace(optimizer_def=inner)

  def state_dict(self) -> dict[str, Any]:
    """The state dict in Flax's layout, for a checkpoint (orbax, msgpack, ...).

    Returns:
      ``{'target': ..., 'state': {'step': ..., 'param_states': ...}}``: nested
      dicts of arrays with string keys; every face reads its ``'state'``.

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore
      >>> written = optcore.adam(1e-3).create({'w': jnp.ones(2)}).state_dict()
      >>> sorted(written), sorted(written['state']['param_states']['0'])
      (['state', 'target'], ['count', 'mu', 'nu'])
    """
    return self.optimizer_def.state_dict(self.target, self.state)

  def restore_state(self, state_dict: Mapping[str, Any]) -> Optimizer[T]:
    """A new Optimizer holding what ``state_dict`` holds; this one is untouched.

    Args:
      state_dict: ``{'target': ..., 'state': ...}`` as `state_dict` writes it
        (or a flax.optim / T5X checkpoint's dict, for their definitions).

    Returns:
      The restored Optimizer.

    Raises:
      optcore.StateDictError: a missing or extra key, a shape or a dtype that
        differ, named by its path (`optcore.transplant` is the lenient way).

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore
      >>> opt = optcore.adam(1e-3).create({'w': jnp.ones(2)})
      >>> saved = opt.apply_gradient({'w': jnp.ones(2)}).state_dict()
      >>> int(opt.restore_state(saved).state.step)
      1
    """
    target, state = self.optimizer_def.restore_state(self.target, self.state, state_dict)
    return self.replace(target=target, state=state)

  def replace(self, **changes: Any) -> Optimizer[T]:
    return dataclasses.replace(self, **changes)

  def _pinned_to(self, shardings: Optimizer[Any], split: Optimizer[Any] | None) -> Optimizer[T]:
    """This optimizer, whose steps keep the target on ``shardings.target``, the update
    computed on ``split.target`` first where ZeRO-1 splits it (`create_sharded` pins what it
    placed; see `keep_shardings`)."""
    return self.replace(target_shardings=Pins.of(shardings.target, split and split.target))


jax.tree_util.register_dataclass(
  Optimizer, data_fields=["state", "target"], meta_fields=["optimizer_def", "target_shardings"]
)


def fill_unaveraged(average: PyTree, params: PyTree) -> PyTree:
  """``average`` with each None (a parameter no `MultiOptimizer` group averages) replaced by the
  parameter itself, so the result is a whole model's parameters.

  Args:
    average: what a definition's ``ema_params(state)`` returns.
    params: the parameters, in the same structure.

  Returns:
    The average where one is kept, the parameter elsewhere.

  Raises:
    ValueError: ``average`` does not have the parameters' structure.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import adapter
    >>> params = {'w': jnp.ones(1), 'b': jnp.ones(1)}
    >>> adapter.fill_unaveraged({'w': jnp.zeros(1), 'b': None}, params)
    {'b': Array([1.], dtype=float32), 'w': Array([0.], dtype=float32)}
  """
  treedef = jax.tree.structure(params)
  pairs = zip(treedef.flatten_up_to(average), jax.tree.leaves(params), strict=True)
  return treedef.unflatten([p if a is None else a for a, p in pairs])


def keep_shardings(target: T, pins: Pins) -> T:
  """``target`` constrained to the shardings ``pins`` hold (one per leaf, each computed on its
  ZeRO-1 split first), where they still fit its leaves.

  Under ``jit`` the compiler picks the updated parameters' sharding from the update's: with
  ZeRO-1 the state, and so the update, is split over the data axis, and without a constraint
  the parameters come back split that way too (``P(None, 'model')`` became
  ``P('data', 'model')``)."""
  shardings = pins.shardings
  if shardings is None:
    return target
  leaves, treedef = jax.tree.flatten(target)
  if len(leaves) != len(shardings):  # replace(target=...) put other parameters in: theirs
    return target
  split = pins.split or shardings

  def keep(x: jax.Array, where: Any, final: Any) -> jax.Array:
    if where != final:
      x = sharding.constrain(x, where)
    return sharding.constrain(x, final)

  return treedef.unflatten(list(map(keep, leaves, split, shardings)))


def replicated(tree: PyTree, devices: Sequence[Any]) -> PyTree:
  """``tree`` with a leading axis of one copy per device, laid out over ``devices``."""
  mesh = jax.sharding.Mesh(np.array(devices), ("replica",))
  sharding = jax.sharding.NamedSharding(mesh, PartitionSpec("replica"))
  copies = lambda x: jnp.broadcast_to(x, (len(devices), *jnp.shape(x)))
  return jax.tree.map(lambda x: jax.device_put(copies(x), sharding), tree)
