"""Trajectories against a committed reference (the authors' code's run, in
`tests/reference_data`): each step's parameters, through the core face and through
``as_optax()``, each under ``jax.jit``, within a tolerance the caller measured."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax


def as_jax(tree: Mapping[str, Any]) -> dict[str, jax.Array]:
  """A flat dict of NumPy arrays (a reference's inputs) as JAX arrays."""
  return {k: jnp.asarray(v) for k, v in tree.items()}


def check_step(
  reference: Mapping[str, np.ndarray], atol: float, name: str, step: int, params: dict, route: str
) -> None:
  """Each of ``params`` within ``atol`` of ``reference['{name}/step{step}/{leaf}']``."""
  for key, value in params.items():
    np.testing.assert_allclose(
      np.asarray(value), reference[f"{name}/step{step}/{key}"], rtol=0, atol=atol,
      err_msg=f"{name} through {route}, step {step}, leaf {key!r}",
    )  # fmt: skip


def check_core_face(
  reference: Mapping[str, np.ndarray], atol: float, name: str, opt: Any, grads: Iterable[dict]
) -> Any:
  """Steps ``opt`` (an `optcore.Optimizer`) by each of ``grads`` with a jitted
  ``apply_gradient``, checking every step's target; returns the last optimizer."""
  step = jax.jit(lambda opt, g: opt.apply_gradient(g))
  for i, grad in enumerate(grads, start=1):
    opt = step(opt, as_jax(grad))
    check_step(reference, atol, name, i, opt.target, "create().apply_gradient")
  return opt


def run_as_optax(
  tx: optax.GradientTransformation, params: Mapping[str, Any], grads: Iterable[Mapping[str, Any]]
) -> dict[str, jax.Array]:
  """``params`` after a jitted ``tx.update`` and ``optax.apply_updates`` for each of ``grads``
  (NumPy or JAX arrays), from ``tx.init``: what a reference's last step is held against."""
  params = as_jax(params)
  state = tx.init(params)

  @jax.jit
  def step(params: dict, state: Any, grad: dict) -> tuple[dict, Any]:
    updates, state = tx.update(grad, state, params)
    return optax.apply_updates(params, updates), state

  for grad in grads:
    params, state = step(params, state, as_jax(grad))
  return params


def check_as_optax(
  reference: Mapping[str, np.ndarray],
  atol: float,
  name: str,
  tx: optax.GradientTransformation,
  state: Any,
  params: dict[str, jax.Array],
  grads: Iterable[dict],
) -> None:
  """Steps ``params`` from ``state`` by each of ``grads`` with a jitted ``tx.update`` and
  ``optax.apply_updates``, checking every step's parameters."""
  update = jax.jit(tx.update)
  for i, grad in enumerate(grads, start=1):
    updates, state = update(as_jax(grad), state, params)
    params = optax.apply_updates(params, updates)
    check_step(reference, atol, name, i, params, "as_optax()")
