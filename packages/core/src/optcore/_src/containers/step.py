"""One optimizer step, as every face takes it: the checks, the hyper-parameters
for this step (every override refusal included), then the update."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optcore._src.axes import sharding
from optcore._src.ground import paths
from optcore._src.ground.checks import check_gradients
from optcore._src.persistence import placement

PyTree = Any


def apply_step(
  optimizer_def: Any,
  params: PyTree | None,
  state: Any,
  grads: PyTree,
  /,
  *,
  extra_args: Mapping[str, Any] | None = None,
  apply_updates: bool = True,
  **hyper_param_overrides: Any,
) -> tuple[PyTree, Any]:
  """One step of ``optimizer_def``: ``(new_params, new_state)``, or with
  ``apply_updates=False`` ``(updates, new_state)`` in optax's sense.

  ``grads`` are checked against ``params`` (structure, None, shapes) first,
  then ``hyper_param_overrides`` are resolved by the definition's
  `update_hyper_params` (which refuses what cannot take effect), then the
  update runs; state kept in host memory is brought to the device for it and
  the new state put back (`placement`). Every face calls this, so all refuse
  the same inputs with the same errors.

  Args:
    optimizer_def: the definition.
    params: the parameters (None only with ``apply_updates=False`` for a
      definition that needs none).
    state: their `OptimizerState`.
    grads: the gradients, in the parameters' structure.
    extra_args: keyword arguments for an optax update that takes them.
    apply_updates: False: return optax-style updates instead of new parameters.
    **hyper_param_overrides: values for this step only (``learning_rate=lr``).

  Returns:
    ``(new_params, new_state)``, or ``(updates, new_state)``.

  Raises:
    optcore.TreeMismatchError: ``grads`` does not fit ``params`` (named by path).
    TypeError: an override the definition does not have or refuses.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt_def = optcore.sgd(0.1)
    >>> params = {'w': jnp.ones(2)}
    >>> state = opt_def.init_state(params)
    >>> new_params, state = optcore.adapter.step(
    ...     opt_def, params, state, {'w': jnp.ones(2)}, learning_rate=0.5)
    >>> new_params['w'], int(state.step)
    (Array([0.5, 0.5], dtype=float32), 1)
  """
  if params is not None:
    grads = paths.conform(params, grads)  # a dict and a FrozenDict are one container
    check_gradients(optimizer_def, params, grads)
  elif apply_updates:
    raise ValueError("params must be provided if apply_updates is True")
  hyper_params = optimizer_def.update_hyper_params(**hyper_param_overrides)
  update = optimizer_def.apply_gradient if apply_updates else optimizer_def.compute_updates
  state, on_host = placement.to_device(state)  # state_memory_kind="pinned_host"
  new_params, new_state = sharding.with_auto_axes(  # on an Explicit mesh: see its docstring
    lambda params, state, grads, extra: update(hyper_params, params, state, grads, **extra),
    (grads if params is None else params, state),
    params,
    state,
    grads,
    extra_args or {},
  )
  return new_params, placement.to_host(new_state, on_host)
