"""Selecting parameters by path, for any pytree.

Paths come from `jax.tree_util` key paths and read as Flax's do:
``'/Dense_0/kernel'`` for a dict, a FrozenDict or an Equinox module alike
(see `optcore._src.ground.paths`). A selector says which leaves an optimizer acts on:

- a `ModelParamTraversal` (flax.optim's);
- a predicate ``(path, value) -> bool``;
- a regular expression (a string or a compiled pattern), searched in the path;
- a mask: a tree of booleans with the parameters' structure, or a prefix of it
  (``{'encoder': True, 'head': False}``), as `optax.masked` takes;
- a function of one argument that maps the parameters to such a mask;
- an object of a type given to `register_selector_type` (the Flax adapter
  registers ``flax.traverse_util``'s traversals this way).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any, cast

import jax
import numpy as np

from optcore._src.ground import paths

PyTree = Any
Selector = Any


class SelectorError(ValueError):
  """A selector that cannot be applied to the parameters."""


SelectorError.__module__ = "optcore"


def leaves_with_paths(tree: PyTree) -> tuple[list[tuple[str, Any]], Any]:
  """``([(path, leaf), ...], treedef)`` in flatten order, with the canonical paths
  errors and selectors use (``'/a/0/b'``; an Equinox attribute or a treeo field
  reads ``/name``, registered hidden levels are left out).

  Args:
    tree: any pytree (dicts, lists, Equinox modules, treeo Trees, FrozenDicts).

  Returns:
    ``([(path, leaf), ...], treedef)``.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> tree = {'dense': {'kernel': jnp.ones(2)}, 'ws': [jnp.ones(1)]}
    >>> named, _ = optcore.leaves_with_paths(tree)
    >>> [path for path, _ in named]
    ['/dense/kernel', '/ws/0']
  """
  named, treedef = paths.leaves_with_names(tree)
  return [("/" + "/".join(names), leaf) for names, leaf in named], treedef


class ModelParamTraversal:
  """Selects the parameters whose path and value pass ``filter_fn`` (flax.optim's).

  Paths are '/'-joined with a leading slash, as in Flax: ``'/Dense_0/kernel'``.
  Works on any pytree: dicts, FrozenDicts, lists and tuples, Equinox modules.

  Args:
    filter_fn: ``(path: str, value) -> bool``.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import ModelParamTraversal
    >>> params = {'Dense_0': {'kernel': jnp.ones((2, 2)), 'bias': jnp.zeros(2)}}
    >>> kernels = ModelParamTraversal(lambda path, _: path.endswith('/kernel'))
    >>> [x.shape for x in kernels.iterate(params)]
    [(2, 2)]
    >>> kernels.update(lambda x: x * 3, params)['Dense_0']['kernel'][0, 0]
    Array(3., dtype=float32)
  """

  def __init__(self, filter_fn: Callable[[str, Any], bool]):
    if not callable(filter_fn):
      raise TypeError(
        f"ModelParamTraversal takes a function (path, value) -> bool, got {filter_fn!r}"
      )
    self._filter_fn = filter_fn

  def mask(self, inputs: PyTree) -> PyTree:
    """A tree of booleans shaped like ``inputs``: True where the filter passes."""
    leaves, treedef = leaves_with_paths(inputs)
    return treedef.unflatten([bool(self._filter_fn(path, leaf)) for path, leaf in leaves])

  def iterate(self, inputs: PyTree) -> Iterator[Any]:
    """The selected leaves, in the tree's flatten order (sorted keys for dicts)."""
    for path, leaf in leaves_with_paths(inputs)[0]:
      if self._filter_fn(path, leaf):
        yield leaf

  def update(self, fn: Callable[[Any], Any], inputs: PyTree) -> PyTree:
    """A copy of ``inputs`` with ``fn`` applied to every selected leaf."""
    leaves, treedef = leaves_with_paths(inputs)
    return treedef.unflatten(
      [fn(leaf) if self._filter_fn(path, leaf) else leaf for path, leaf in leaves]
    )

  def set(self, values: list[Any], inputs: PyTree) -> PyTree:
    """A copy of ``inputs`` with the selected leaves replaced by ``values``, in order."""
    values = list(values)
    selected = sum(1 for _ in self.iterate(inputs))
    if len(values) != selected:
      raise SelectorError(f"set() got {len(values)} values for {selected} selected parameters")
    replacements = iter(values)
    return self.update(lambda _: next(replacements), inputs)

  def __repr__(self) -> str:
    return f"ModelParamTraversal({self._filter_fn!r})"


_SELECTOR_TYPES: dict[type, Callable[[Any, PyTree], PyTree]] = {}


def register_selector_type(cls: type, to_mask: Callable[[Any, PyTree], PyTree]) -> None:
  """Teaches `selector_mask` (and so `MultiOptimizer` and ``create(focus=...)``)
  a new kind of selector: ``to_mask(selector, params)`` returns the boolean
  mask (or a prefix of it) that an instance of ``cls`` picks.

  Framework adapters use it for their own traversal types, so the core needs
  no framework import.

  Args:
    cls: the selector's class.
    to_mask: ``(selector, params) -> mask`` (booleans, or a prefix of the params' tree).

  Returns:
    None; later calls of `selector_mask` know ``cls``.

  Raises:
    TypeError: ``cls`` is not a class or ``to_mask`` is not callable.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> class Named:
    ...   def __init__(self, *names):
    ...     self.names = names
    >>> optcore.register_selector_type(
    ...     Named, lambda sel, params: {k: k in sel.names for k in params})
    >>> optcore.selector_mask(Named('w'), {'w': jnp.ones(2), 'b': jnp.ones(2)})
    {'b': False, 'w': True}
  """
  if not isinstance(cls, type) or not callable(to_mask):
    raise TypeError(
      f"register_selector_type(cls, to_mask) takes a class and a function (selector, params) -> "
      f"mask; got {cls!r} and {to_mask!r}"
    )
  _SELECTOR_TYPES[cls] = to_mask


def selector_mask(selector: Selector, params: PyTree) -> PyTree:
  """The boolean mask, shaped like ``params``, that ``selector`` picks.

  Args:
    selector: a `ModelParamTraversal`, a ``(path, value) -> bool`` predicate, a
      regex searched in each ``'/a/b'`` path, a (prefix) mask tree of booleans,
      a function from the params to such a mask, or a registered type.
    params: the parameters.

  Returns:
    A tree of booleans shaped like ``params``.

  Raises:
    optcore.SelectorError: a bad regex, or a mask that does not fit ``params``
      (named by its path).

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import selector_mask
    >>> params = {'encoder': {'kernel': jnp.ones(2), 'bias': jnp.ones(2)}, 'head': jnp.ones(3)}
    >>> selector_mask(r'/kernel$', params)
    {'encoder': {'bias': False, 'kernel': True}, 'head': False}
    >>> selector_mask({'encoder': True, 'head': False}, params)
    {'encoder': {'bias': True, 'kernel': True}, 'head': False}
  """
  if isinstance(selector, ModelParamTraversal):
    return selector.mask(params)
  for cls, to_mask in _SELECTOR_TYPES.items():
    if isinstance(selector, cls):
      return _check_mask(to_mask(selector, params), params, f"the mask of {selector!r}")
  if isinstance(selector, (str, re.Pattern)):
    return _regex_mask(selector, params)
  if callable(selector) and not _is_pytree_node(selector):
    if _positional_arity(selector) >= 2:
      return ModelParamTraversal(cast(Callable[[str, Any], bool], selector)).mask(params)
    return _check_mask(selector(params), params, "the mask returned by the selector function")
  return _check_mask(selector, params, "the mask")


def _regex_mask(pattern: str | re.Pattern, params: PyTree) -> PyTree:
  try:
    compiled = re.compile(pattern)
  except re.error as e:
    raise SelectorError(
      f"the selector {pattern!r} is not a valid regular expression: {e}"
    ) from None
  return ModelParamTraversal(lambda path, _: compiled.search(path) is not None).mask(params)


def _positional_arity(fn: Callable[..., Any]) -> int:
  try:
    parameters = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return 1
  kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
    return 2
  return sum(1 for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty)


def _is_pytree_node(x: Any) -> bool:
  """Equinox modules are callable pytrees: as selectors they are masks, not functions."""
  return not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x))


def _check_mask(mask: PyTree, params: PyTree, what: str) -> PyTree:
  """Broadcasts a (prefix) mask over ``params``; every mask leaf must be a bool."""
  for path, leaf in leaves_with_paths(mask)[0]:
    if not _is_bool(leaf):
      raise SelectorError(
        f"{what} has {leaf!r} at {path!r}; a mask holds booleans (True: optimise, False: "
        "leave frozen). Build it with jax.tree.map(lambda x: <bool>, params)."
      )
  try:
    mask = paths.conform(params, mask)
    return jax.tree.map(lambda m, sub: jax.tree.map(lambda _: bool(m), sub), mask, params)
  except ValueError as e:
    raise SelectorError(
      f"{what} does not have the structure of the parameters (nor of a prefix of it): "
      f"{e}. A mask mirrors the parameters, with True or False at each leaf or subtree."
    ) from None


def _is_bool(x: Any) -> bool:
  if isinstance(x, (bool, np.bool_)):
    return True
  return isinstance(x, (np.ndarray, jax.Array)) and x.shape == () and x.dtype == bool
