"""Running every docstring example of a package."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from types import ModuleType


def modules_of(package: ModuleType) -> list[ModuleType]:
  found = [package]
  for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
    found.append(importlib.import_module(info.name))
  return found


def failures_in(module: ModuleType, package: ModuleType) -> int:
  """Runs the examples defined in ``module`` (not those it imports); returns the failures."""
  finder = doctest.DocTestFinder(exclude_empty=True)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  for test in finder.find(module, module.__name__, globs={}):
    if test.examples and (test.filename or "").startswith(str(package.__path__[0])):
      runner.run(test)
  return runner.failures


def missing_sections(obj, raises: bool) -> list[str]:
  """The sections an entry point's docstring lacks, optax's ``alias.py`` style: ``Args:``
  (where it takes arguments), ``Returns:``, ``Raises:`` (where it raises on bad input) and
  an example (``>>>``, which the doctest tests run)."""
  import inspect

  doc = inspect.getdoc(obj) or ""
  takes = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
  wanted = {"Args:": bool(takes), "Returns:": True, "Raises:": raises, ">>>": True}
  return [section for section, needed in wanted.items() if needed and section not in doc]
