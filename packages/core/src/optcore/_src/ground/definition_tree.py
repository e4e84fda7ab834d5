"""The one walk over a tree of definitions: a wrapper's wrapped definition, a `MultiOptimizer`'s
groups, flax.optim's `WeightNorm`'s wrapped optimizer, the definitions among an optax
combinator's arguments (``chain``'s members) are a definition's children.

Each definition declares its children (`OptimizerDef.children`), how to make a copy of itself
with others (`OptimizerDef.with_children`), and which part of the parameters each child sees
(`OptimizerDef.child_params`: a group its own leaves). Every walk goes through this module, so
a wrapper anywhere in the tree is seen by every walk: binding logical axes, T5X's factor rules,
a face's selectors, finding a wrapper for a read-out.

Example:
  >>> import optcore
  >>> from optcore._src.ground import definition_tree
  >>> groups = optcore.MultiOptimizer(('w', optcore.sgd(0.1)), ('b', optcore.adam(0.1)))
  >>> opt_def = optcore.ema(groups)
  >>> [d.display_name() for d in definition_tree.iter_definitions(opt_def)]
  ['ema(MultiOptimizer)', 'MultiOptimizer', 'sgd', 'adam']
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

PyTree = Any
T = TypeVar("T")


def iter_definitions(opt_def: Any) -> Iterator[Any]:
  """``opt_def`` and every definition below it, parents before their children, in order.

  Args:
    opt_def: the root definition.

  Returns:
    An iterator over the definitions of the tree.

  Example:
    >>> import optcore
    >>> from optcore import adapter
    >>> opt_def = optcore.skip_bad_steps(optcore.t5x.Adafactor(0.1))
    >>> [type(d).__name__ for d in adapter.iter_definitions(opt_def)]
    ['SkipBadSteps', 'Adafactor']
  """
  yield opt_def
  for child in opt_def.children():
    yield from iter_definitions(child)


def find_all(opt_def: Any, kind: type[T] | tuple[type, ...]) -> list[T]:
  """Every definition of type ``kind`` in ``opt_def``'s tree, parents first."""
  return [d for d in iter_definitions(opt_def) if isinstance(d, kind)]


def map_definitions(fn: Callable[[Any, PyTree], Any], opt_def: Any, params: PyTree = None) -> Any:
  """``opt_def`` rebuilt from the leaves up: each definition's children are mapped first (each
  with its part of ``params``, `OptimizerDef.child_params`), then ``fn(definition, params)``
  gives its replacement. A definition whose children and ``fn`` change nothing is returned as
  it is (the same object), so an unchanged tree stays one definition for ``jax.jit``.

  Args:
    fn: ``(definition, params) -> definition``; return the definition itself to keep it.
    opt_def: the root.
    params: what the root sees (logical axes, a mask, the parameters), or None.

  Returns:
    The new root, or ``opt_def`` where nothing changed.

  Example:
    >>> import optcore
    >>> from optcore import adapter
    >>> opt_def = optcore.ema(optcore.MultiOptimizer(('w', optcore.sgd(0.1))), 0.9)
    >>> faster = lambda d, _: d.with_hyper_params(d.hyper_params.replace(learning_rate=0.5)) if (
    ...     isinstance(d, optcore.OptaxWrapper)) else d
    >>> new = adapter.map_definitions(faster, opt_def)
    >>> new.optimizer_def.sub_optimizers[0].hyper_params.learning_rate, new is not opt_def
    (0.5, True)
    >>> adapter.map_definitions(lambda d, _: d, opt_def) is opt_def
    True
  """
  children = opt_def.children()
  if children:
    parts = opt_def.child_params(params) if params is not None else [None] * len(children)
    new = tuple(map_definitions(fn, c, p) for c, p in zip(children, parts, strict=True))
    if any(n is not c for n, c in zip(new, children, strict=True)):
      opt_def = opt_def.with_children(new)
  return fn(opt_def, params)
