"""Every example in optcore_equinox's docstrings runs and prints what it says."""

from __future__ import annotations

import pytest
from doctests import failures_in, modules_of

import optcore_equinox


@pytest.mark.parametrize("module", modules_of(optcore_equinox), ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
  failures = failures_in(module, optcore_equinox)
  assert failures == 0, f"{failures} docstring example(s) failed in {module.__name__}"
