"""Treex's Optimizer on treeo, over any optcore configuration."""

from __future__ import annotations

import typing as tp
from collections.abc import Mapping

import jax
import treeo as to

import optcore
from optcore._src.base import check_same_structure
from optcore._src.optax_wrapper import as_definition

PyTree = tp.Any


class Optimizer(to.Tree):
  """Treex's ``Optimizer``: an optax transformation or optcore config as a treeo Tree.

  ``init(params)`` returns a new, initialised optimizer (this one stays
  uninitialised); ``update(grads, params)`` replaces this optimizer's state
  and returns the new parameters (or the updates, with
  ``apply_updates=False``). Under ``jax.jit`` return the optimizer from the
  jitted function to keep its new state. Unlike Treex, the state keeps the
  parameters' structure (not a flat list), so selectors and checkpoints see
  real paths.

  Args:
    optimizer: an optax ``GradientTransformation`` or any `optcore.OptimizerDef`.

  Example:
    >>> import jax, jax.numpy as jnp, optax
    >>> import optcore_treex
    >>> params = {'w': jnp.ones(2)}
    >>> optimizer = optcore_treex.Optimizer(optax.sgd(0.5)).init(params)
    >>> @jax.jit
    ... def train_step(params, optimizer):
    ...   grads = jax.grad(lambda p: jnp.sum(p['w'] ** 2))(params)
    ...   params = optimizer.update(grads, params)
    ...   return params, optimizer
    >>> params, optimizer = train_step(params, optimizer)
    >>> params['w'], int(optimizer.state.step)
    (Array([0., 0.], dtype=float32), 1)
  """

  state: optcore.OptimizerState | None = to.field(None, node=True)
  optimizer_def: optcore.OptimizerDef = to.field(node=False)
  n_leaves: int | None = to.field(None, node=False)

  def __init__(self, optimizer: tp.Any):
    self.optimizer_def = as_definition(optimizer, "optcore_treex.Optimizer")
    self.state = None
    self.n_leaves = None

  @property
  def initialized(self) -> bool:
    return self.state is not None

  def init(self, params: PyTree) -> Optimizer:
    """A new optimizer initialised for ``params``; this one is not changed."""
    module = to.copy(self)
    module.state = self.optimizer_def.init_state(params)
    module.n_leaves = len(jax.tree.leaves(params))
    return module

  def update(
    self,
    grads: PyTree,
    params: PyTree | None = None,
    apply_updates: bool = True,
    **hyper_param_overrides: tp.Any,
  ) -> PyTree:
    """Updates this optimizer's state; returns the new params, or the updates.

    Keyword arguments override hyper-parameters for this step
    (``learning_rate=lr``), an optcore addition to Treex's API.

    Raises:
      RuntimeError: the optimizer is not initialised.
      ValueError: ``params`` is missing with ``apply_updates=True``, or the
        number of leaves differs from ``init``'s.
      optcore.TreeMismatchError: ``grads`` and ``params`` differ in structure.

    A failed update leaves the state as it was.
    """
    if not self.initialized:
      raise RuntimeError(
        "Optimizer is not initialized: use optimizer = optimizer.init(params) first (init "
        "returns a new optimizer)"
      )
    if apply_updates and params is None:
      raise ValueError("params must be provided if apply_updates is True")
    for name, tree in (("params", params), ("grads", grads)):
      if tree is not None and len(jax.tree.leaves(tree)) != self.n_leaves:
        raise ValueError(
          f"{name} must have length {self.n_leaves}, got {len(jax.tree.leaves(tree))}"
        )
    if params is not None:
      check_same_structure(params, grads, "grads")
    optimizer_def = self.optimizer_def
    hyper_params = optimizer_def.update_hyper_params(**hyper_param_overrides)
    if apply_updates or not isinstance(optimizer_def, optcore.OptaxWrapper):
      if params is None:
        raise ValueError(
          f"{optimizer_def!r} computes new parameters from the old ones: pass params"
        )
      new_params, new_state = optimizer_def.apply_gradient(hyper_params, params, self.state, grads)
      output = new_params if apply_updates else jax.tree.map(lambda a, b: a - b, new_params, params)
    else:  # the transformation's own updates: exact, and params optional as in optax
      tx = (
        optimizer_def._build(hyper_params)
        if hyper_param_overrides
        else optimizer_def.optax_optimizer
      )
      output, opt_state = tx.update(grads, self.state.param_states, params)
      new_state = optcore.OptimizerState(self.state.step + 1, opt_state)
    self.state = new_state
    return output

  def state_dict(self) -> dict[str, tp.Any]:
    """``{'state': {'step': ..., 'param_states': ...}}``, the core's layout."""
    self._check_initialized()
    return {"state": self.optimizer_def.state_dict(None, self.state)["state"]}

  def restore_state(self, state_dict: Mapping[str, tp.Any]) -> Optimizer:
    """A new optimizer holding ``state_dict['state']`` (this adapter's, the
    core's or Flax's layout); this one is untouched."""
    self._check_initialized()
    if not isinstance(state_dict, Mapping) or "state" not in state_dict:
      found = sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict).__name__
      raise optcore.StateDictError(f"expected a dict with a 'state' key, found {found}")
    _, state = self.optimizer_def.restore_state(
      None, self.state, {"target": None, "state": state_dict["state"]}
    )
    module = to.copy(self)
    module.state = state
    return module

  def _check_initialized(self) -> None:
    if not self.initialized:
      raise RuntimeError("Optimizer is not initialized: use optimizer = optimizer.init(params)")
