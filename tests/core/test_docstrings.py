"""Every example in optcore's docstrings runs and prints what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import optcore


def _modules():
  yield optcore
  for info in pkgutil.walk_packages(optcore.__path__, prefix="optcore."):
    yield importlib.import_module(info.name)


@pytest.mark.parametrize("module", list(_modules()), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
  finder = doctest.DocTestFinder(exclude_empty=True)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  for test in finder.find(module, module.__name__, globs={}):
    if test.examples and (test.filename or "").startswith(str(optcore.__path__[0])):
      runner.run(test)
  assert runner.failures == 0, f"{runner.failures} docstring example(s) failed in {module.__name__}"
