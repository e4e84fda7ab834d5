"""Checks of what a step is given: gradients that fit the parameters, a learning
rate, float parameters. Each raises an error naming the path and the fix."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from optcore._src.ground import paths

PyTree = Any


def require_params(
  optimizer: str, params: PyTree, reads: str = "the weight decay reads them"
) -> None:
  """ValueError where an optax ``update`` that reads the parameters is given none: what reads
  them and the call that passes them.

  Example:
    >>> from optcore._src.ground.checks import require_params
    >>> require_params("mars", None, "its decay")
    Traceback (most recent call last):
    ValueError: mars: update needs params (its decay): tx.update(grads, state, params).
  """
  if params is None:
    raise ValueError(
      f"{optimizer}: update needs params ({reads}): tx.update(grads, state, params)."
    )


class TreeMismatchError(ValueError):
  """Two trees that should have the same structure do not."""


TreeMismatchError.__module__ = "optcore"


@paths.allows_deep_trees
def check_same_structure(reference: PyTree, other: PyTree, what: str) -> None:
  """Raises `TreeMismatchError` naming the first path where ``other`` differs."""
  if jax.tree.structure(reference) == jax.tree.structure(other):
    return
  container = _first_container_difference(reference, other, what, "")
  if container is not None:
    raise TreeMismatchError(container)
  named = lambda tree: {
    "/" + "/".join(names): leaf for names, leaf in paths.leaves_with_names(tree, keep_none=True)[0]
  }
  ref_by_path, other_by_path = named(reference), named(other)
  for name, leaf in ref_by_path.items():
    if leaf is None:
      if other_by_path.get(name) is not None and name in other_by_path:
        raise TreeMismatchError(
          f"{what} has {_describe(other_by_path[name])} at {name!r}, where the parameters have "
          f"None (no parameter there). Give None at {name!r} too, or put the parameter in the "
          "tree you optimise."
        )
      continue
    if name not in other_by_path:
      raise TreeMismatchError(
        f"{what} has no array at {name!r}, where the parameters have one. Give a gradient for "
        f"every parameter (use jnp.zeros_like for a parameter that gets none)."
      )
    if other_by_path[name] is None:
      raise TreeMismatchError(
        f"{what} has None at {name!r}, where the parameters have an array. Replace None "
        f"gradients with zeros (jnp.zeros_like(param)) or leave that parameter out of the "
        f"optimised tree."
      )
  extra = sorted(set(other_by_path) - set(ref_by_path))
  raise TreeMismatchError(
    f"{what} does not have the structure of the parameters"
    + (f": it has extra entries at {extra[:5]}" if extra else "")
    + f". Expected {jax.tree.structure(reference)}, found {jax.tree.structure(other)}."
  )


def check_gradients(optimizer_def: Any, params: PyTree, grads: PyTree, what: str = "grads") -> None:
  """Raises `TreeMismatchError` naming the path where ``grads`` do not fit
  ``params``: another structure, a None or missing gradient, or a leaf of
  another shape (a (2, 1) gradient for a (2,) parameter would broadcast
  silently). Shapes are static, so under ``jit`` this costs nothing per step.

  Args:
    optimizer_def: the definition (per-example gradients have a leading axis).
    params: the parameters.
    grads: the gradients to check.
    what: how the message names ``grads``.

  Returns:
    None: the gradients fit.

  Raises:
    optcore.TreeMismatchError: another structure, a None or missing gradient, or
      a leaf of another shape (named by its path).

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> params = {'b': jnp.zeros(2)}
    >>> optcore.check_gradients(optcore.adam(1e-2), params, {'b': jnp.ones((2, 1))})
    Traceback (most recent call last):
    ...
    optcore.TreeMismatchError: grads has shape (2, 1) at '/b', where the parameter has shape (2,)...
  """
  check_same_structure(params, grads, what)
  per_example = optimizer_def.per_example_gradients
  named, _ = paths.leaves_with_names(params)
  for (names, param), grad in zip(named, jax.tree.leaves(grads), strict=True):
    want, found = np.shape(param), np.shape(grad)
    fits = found[1:] == want if per_example else found == want
    if not fits:
      expected = f"(examples, {', '.join(map(str, want))})" if per_example else str(want)
      raise TreeMismatchError(
        f"{what} has shape {found} at {'/' + '/'.join(names)!r}, where the parameter has shape "
        f"{want}; expected a gradient of shape {expected}. Pass the gradient of the loss with "
        "respect to this parameter (jax.grad gives each the parameter's shape)."
      )


class MissingHyperParameterError(ValueError, AssertionError):
  """A step without a value the algorithm needs (a learning rate). An
  AssertionError too: flax.optim's algorithms asserted ``'no learning rate provided.'``."""


MissingHyperParameterError.__module__ = "optcore"


def check_learning_rate(optimizer_def: Any, hyper_params: Any) -> None:
  """Raises `MissingHyperParameterError` when this step's learning rate is None."""
  if isinstance(hyper_params, Mapping) and hyper_params.get("learning_rate", 0) is None:
    name = optimizer_def.display_name()
    raise MissingHyperParameterError(
      f"no learning rate provided. {name} was built without learning_rate: pass it to the "
      f"constructor ({name}(learning_rate=0.1)) or to each step "
      "(apply_gradient(grads, learning_rate=0.1))."
    )


def check_regex(pattern: str, described: str) -> None:
  """ValueError ``"<described> is not a regular expression: <why>"`` unless ``pattern``
  compiles (``described`` names the argument: ``"low_bit_state: states='nu('"``)."""
  try:
    re.compile(pattern)
  except re.error as error:
    raise ValueError(f"{described} is not a regular expression: {error}") from None


def check_float_params(params: PyTree) -> None:
  """Raises TypeError naming the first parameter that is not a float (or
  complex) array: an optimizer would turn a step counter 3 into 2.9 or 2."""
  for names, leaf in paths.leaves_with_names(params)[0]:
    if not hasattr(leaf, "dtype") and not isinstance(leaf, (int, float, complex)):
      raise TypeError(
        f"the parameter at {'/' + '/'.join(names)!r} is of type {type(leaf).__name__} "
        f"({leaf!r:.40}); parameters are float (or complex) arrays. Keep other values out of "
        "the optimised tree, or make this one an array."
      )
    dtype = getattr(leaf, "dtype", None) or np.result_type(leaf)
    if not jnp.issubdtype(dtype, jnp.inexact):
      what = "a PRNG key" if jnp.issubdtype(dtype, jax.dtypes.prng_key) else "dtype"
      raise TypeError(
        f"the parameter at {'/' + '/'.join(names)!r} has {what} {dtype_name(dtype)}; "
        "optimizers update float (or complex) arrays only. Keep other leaves (PRNG keys, counters, "
        "indices) out of the optimised tree, or leave them unselected: "
        "opt_def.create(params, focus=lambda path, x: jnp.issubdtype(x.dtype, jnp.inexact)) "
        "or a MultiOptimizer group that does not select them."
      )


def check_real_params(optimizer: str, params: PyTree) -> None:
  """TypeError naming the first complex parameter, for an optimizer whose algorithm is
  defined on real numbers only (a complex gradient's imaginary part would never move it).

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore._src.ground.checks import check_real_params
    >>> check_real_params("mars", {'w': jnp.ones(2, jnp.complex64)})
    Traceback (most recent call last):
    ...
    TypeError: mars: the parameter at '/w' is complex64; mars is defined on real numbers...
  """
  for names, leaf in paths.leaves_with_names(params)[0]:
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating):
      raise TypeError(
        f"{optimizer}: the parameter at {'/' + '/'.join(names)!r} is {dtype_name(dtype)}; "
        f"{optimizer} is defined on real numbers only (its orthogonalisation, norms and "
        "square roots would drop the imaginary part, which would never move). Optimise the "
        "real and imaginary parts as two real parameters: "
        f"optcore.contrib.split_real_and_imaginary(optcore.contrib.{optimizer}(...))."
      )


def _describe(x: Any) -> str:
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return f"an array of shape {tuple(x.shape)}"
  return f"a {type(x).__name__}"


def dtype_name(dtype: Any) -> str:
  """``float32``; typed PRNG key dtypes (``key<fry>``) have no NumPy name."""
  try:
    return np.dtype(dtype).name
  except TypeError:
    return str(dtype)


def _first_container_difference(reference: PyTree, other: PyTree, what: str, path: str):
  """The message for the first node where ``other`` is another kind of container
  (a tuple where the parameters have a dict), or None."""
  ref_hidden, other_hidden = paths.hidden_child(reference), paths.hidden_child(other)
  if ref_hidden is not None or other_hidden is not None:
    ref_child = ref_hidden[0] if ref_hidden is not None else reference
    other_child = other_hidden[0] if other_hidden is not None else other
    return _first_container_difference(ref_child, other_child, what, path)
  ref_split, other_split = paths.children_with_keys(reference), paths.children_with_keys(other)
  if ref_split is None or other_split is None or reference is None or other is None:
    return None
  if type(reference) is not type(other):
    where = path or "/"
    return (
      f"{what} has a {type(other).__name__} at {where!r} where the parameters have a "
      f"{type(reference).__name__}. Pass {what} in the parameters' structure: jax.grad of a "
      "function of the parameters gives it."
    )
  others = {paths.key_name(k): child for k, child in other_split[0]}
  for key, child in ref_split[0]:
    name = paths.key_name(key)
    if name in others:
      found = _first_container_difference(child, others[name], what, f"{path}/{name}")
      if found is not None:
        return found
  return None
