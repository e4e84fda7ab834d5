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
