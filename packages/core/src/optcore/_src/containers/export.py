"""A definition as an optax transformation, for optax-based trainers
(`flax.training.train_state.TrainState`, `flax.nnx.Optimizer`, a plain optax loop)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec

from optcore._src.containers.step import apply_step
from optcore._src.ground import paths
from optcore._src.ground.hyper_params import KNOWN_ALIASES, OPTAX_EXTRA_ARGS
from optcore._src.ground.user_warnings import warn

PyTree = Any


def split_update_arguments(
  kwargs: dict[str, Any], reads: frozenset[str] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
  """``(hyper_param_overrides, extra_args)`` from the keywords of an ``update``: optax's extra
  arguments (``value``, ``grad``, ``value_fn``) and those the definition declares it reads
  (``reads``, `OptimizerDef.extra_arg_names`: `qk_clip`'s ``qk_logits``) are extra arguments;
  every other keyword is an override, for `step` to honour or refuse.

  Args:
    kwargs: the keywords an ``update`` was given.
    reads: the definition's `OptimizerDef.extra_arg_names` (None: optax's only).

  Returns:
    ``(overrides, extra_args)``, two dicts.

  Example:
    >>> from optcore import adapter
    >>> adapter.split_update_arguments({'learning_rate': 0.1, 'value': 2.0})
    ({'learning_rate': 0.1}, {'value': 2.0})
  """
  names = OPTAX_EXTRA_ARGS | (reads or frozenset())
  extra = {k: v for k, v in kwargs.items() if k in names}
  return {k: v for k, v in kwargs.items() if k not in names}, extra


def optax_update_arguments(
  optimizer_def: Any, kwargs: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
  """``(hyper_param_overrides, extra_args)`` from the keywords of an ``as_optax().update``, by
  optax's contract: a hyper-parameter of the definition is this step's override; every other
  keyword is an extra argument, passed on where the definition reads it
  (`OptimizerDef.extra_arg_names`) and ignored elsewhere, as an optax chain hands every member
  every keyword and each ignores what it does not use. A keyword one or two letters from a
  hyper-parameter's name warns, naming it: it is likely a typo that would otherwise do nothing.

  Args:
    optimizer_def: the definition whose ``as_optax()`` was called.
    kwargs: the keywords its ``update`` was given.

  Returns:
    ``(overrides, extra_args)``, two dicts.

  Example:
    >>> import optcore
    >>> from optcore import adapter
    >>> adapter.optax_update_arguments(optcore.sgd(0.1), {'learning_rate': 0.2, 'value': 1.0})
    ({'learning_rate': 0.2}, {'value': 1.0})
    >>> adapter.optax_update_arguments(optcore.legacy.Momentum(0.1), {'value': 1.0})
    ({}, {})
  """
  names = optimizer_def.overridable_names()
  overrides = {k: v for k, v in kwargs.items() if k in names}
  rest = {k: v for k, v in kwargs.items() if k not in names}
  for key in rest:
    meant = [n for n in KNOWN_ALIASES.get(key.lower(), ()) if n in names]
    meant += sorted(n for n in names if len(key) > 3 and _edit_distance(key, n) <= 2)
    if meant:
      warn(
        f"{optimizer_def.display_name()}.as_optax().update: {key!r} is no hyper-parameter, so "
        f"it goes on as an extra argument and changes nothing here; did you mean {meant[0]!r}?"
      )
  reads = optimizer_def.extra_arg_names()
  extra = rest if reads is None else {k: v for k, v in rest.items() if k in reads}
  return overrides, extra


def _edit_distance(a: str, b: str) -> int:
  """Levenshtein's distance: the insertions, deletions and substitutions from ``a`` to ``b``."""
  row = list(range(len(b) + 1))
  for i, x in enumerate(a, 1):
    previous, row[0] = row[0], i
    for j, y in enumerate(b, 1):
      previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
  return row[-1]


def as_optax(optimizer_def: Any) -> optax.GradientTransformationExtraArgs:
  """`OptimizerDef.as_optax`: the state is the `OptimizerState`, the updates are the one
  step every face takes (`step.apply_step`: gradients checked against the parameters, overrides
  resolved, state in host memory brought in), in optax's form; ``update``'s keywords are read
  by `optax_update_arguments`."""

  def init_fn(params: PyTree) -> Any:
    state = optimizer_def.init_state(paths.unbox(params))
    return state.replace(
      param_states=boxed_like_parameters(optimizer_def, state.param_states, params)
    )

  def update_fn(updates: PyTree, state: Any, params: PyTree = None, **kwargs: Any):
    overrides, extra = optax_update_arguments(optimizer_def, kwargs)
    # params may be None where the definition needs none (accumulate of an optax definition,
    # as optax.MultiSteps takes it); compute_updates says so for one that does.
    boxed = state
    updates, new_state = apply_step(
      optimizer_def,
      paths.unbox(params),
      paths.unbox(state),
      paths.unbox(updates),
      extra_args=extra,
      apply_updates=False,
      **overrides,
    )
    return updates, paths.rebox_like(new_state, boxed)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def boxed_like_parameters(optimizer_def: Any, param_states: Any, params: PyTree) -> Any:
  """``param_states`` with each parameter-shaped leaf boxed as its parameter is: an nnx Param's
  moments keep its sharding metadata, as optax's own ``init`` of boxed parameters gives them,
  so ``nnx.Optimizer`` reads the moments' partition specs from them. Unboxed parameters, or a
  state whose axes the definition cannot derive, give ``param_states`` as they are."""
  boxes, treedef = jax.tree.flatten(params, is_leaf=paths.is_box)
  if not any(map(paths.is_box, boxes)):
    return param_states
  arrays = [paths.unboxed(b) for b in boxes]
  # One token per dimension of each parameter: a state leaf that derives all of parameter i's
  # tokens, in order, has parameter i's shape and layout.
  tokens = [PartitionSpec(*(f"{i}/{d}" for d in range(np.ndim(a)))) for i, a in enumerate(arrays)]
  try:
    axes = optimizer_def.derive_param_states_axes(
      param_states, treedef.unflatten(arrays), treedef.unflatten(tokens)
    )
  except Exception:
    return param_states
  leaves, state_treedef = jax.tree.flatten(param_states)
  specs = [s for s in state_treedef.flatten_up_to(axes) if s is not None]
  if len(specs) != len(leaves):
    return param_states
  owner = {tuple(t): i for i, t in enumerate(tokens) if len(t)}

  def box(leaf: Any, spec: Any) -> Any:
    i = owner.get(tuple(spec)) if isinstance(spec, PartitionSpec) else None
    return leaf if i is None or not paths.is_box(boxes[i]) else paths.box_as(boxes[i], leaf)

  return state_treedef.unflatten(list(map(box, leaves, specs)))


class ExportMethods:
  """`OptimizerDef`'s export to optax."""

  def as_optax(self) -> optax.GradientTransformationExtraArgs:
    """This definition as an optax transformation, for `flax.training.train_state.TrainState`,
    `flax.nnx.Optimizer` or a plain optax loop.

    Its state is the `OptimizerState`; its updates are ``new_params - params``,
    so ``optax.apply_updates`` lands on the new parameters up to float rounding
    (definitions that wrap optax export their own transformation and are exact).
    A hyper-parameter passed to ``update`` is honoured for that step, as an
    override of `Optimizer.apply_gradient` is (``nnx.Optimizer.update(model,
    grads, learning_rate=lr)``; a traced value does not recompile). Every other
    keyword is an extra argument, as in optax's contract: a definition that reads
    it gets it (``value`` for a wrapped ``polyak_sgd`` or
    ``skip_bad_steps(watch="loss")``), the others ignore it, so the
    transformation works in an ``optax.chain`` with members that need their own;
    a keyword a letter or two from a hyper-parameter warns. Gradients are checked
    against ``params`` as every face checks them.

    Returns:
      An ``optax.GradientTransformationExtraArgs``; its ``update`` needs ``params``
      unless the definition computes no new parameters (``accumulate`` of a wrapped optax
      definition takes ``update(grads, state)``, as ``optax.MultiSteps`` does).

    Raises:
      TypeError: a definition whose state cannot be optax's (``optcore.grouped``
        keeps the parameters in its own layout).

    Example:
      >>> import jax.numpy as jnp, optax
      >>> import optcore
      >>> class Halve(optcore.OptimizerDef):
      ...   def __init__(self):
      ...     super().__init__(optcore.HyperParams())
      ...   def init_param_state(self, param):
      ...     return ()
      ...   def apply_param_gradient(self, step, hyper_params, param, state, grad):
      ...     return param / 2, state
      >>> tx = Halve().as_optax()
      >>> params = {'w': jnp.array([4.0])}
      >>> updates, state = tx.update(params, tx.init(params), params)
      >>> optax.apply_updates(params, updates)['w'], int(state.step)
      (Array([2.], dtype=float32), 1)

    A hyper-parameter given to ``update`` takes effect for that step:

      >>> tx = optcore.sgd(0.1).as_optax()
      >>> updates, _ = tx.update(params, tx.init(params), params, learning_rate=0.5)
      >>> updates['w']
      Array([-2.], dtype=float32)
    """

    return as_optax(self)

  def from_optax_state(self, optax_state: Any, step: Any) -> Any:
    """The `OptimizerState` (``init_state``'s layout, which state dicts, restores and read-outs
    take) that ``optax_state``, the state of this definition's `as_optax`, holds; ``step`` is
    the step count where that state keeps none (an ``nnx.Optimizer``'s ``step``).

    Args:
      optax_state: what ``as_optax().init``/``update`` returned, arrays unboxed.
      step: the number of updates applied, for a state that does not count them.

    Returns:
      The `OptimizerState`.

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore
      >>> opt_def = optcore.adam(1e-3)
      >>> tx_state = opt_def.as_optax().init({'w': jnp.ones(2)})
      >>> state = opt_def.from_optax_state(tx_state, 0)
      >>> sorted(opt_def.state_dict(None, state)['state']['param_states']['0'])
      ['count', 'mu', 'nu']
    """
    del step  # the generic as_optax keeps the OptimizerState itself
    return optax_state

  def to_optax_state(self, state: Any, like: Any = None) -> Any:
    """The inverse of `from_optax_state`: ``state`` as this definition's `as_optax` keeps it.
    ``like`` is a state of `as_optax` for the same parameters, where the layout needs it (a
    `MultiOptimizer` of flax.optim's per-parameter definitions)."""
    del like
    return state
