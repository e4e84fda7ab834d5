"""The documentation checks every package shares, written once: its docstring examples run, its
entry points document Args, Returns, Raises and an example, its pages' blocks of its variant run,
and its API page lists every public name. A package's test module binds what it needs:

    test_docstring_examples_run = docstring_examples(optcore_equinox)
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from doc_blocks import block_id, blocks_for, documented_names, public_names, run_block
from doctests import failures_in, missing_sections, modules_of


def docstring_examples(package: ModuleType) -> Callable[..., None]:
  """A test, one case a module of ``package``: its docstring examples print what they say."""

  @pytest.mark.parametrize("module", modules_of(package), ids=lambda m: m.__name__)
  def test(module: ModuleType) -> None:
    failures = failures_in(module, package)
    assert failures == 0, f"{failures} docstring example(s) failed in {module.__name__}"

  return test


def entry_point_sections(package: ModuleType, raises: str, quiet: str = "") -> Callable[..., None]:
  """A test, one case an entry point of ``package`` (issue 30), named by its dotted path in
  ``raises`` (those that raise on bad input) or ``quiet`` (those that do not): its docstring has
  Args (where it takes any), Returns, Raises (where it raises) and an example."""
  wanted = {name: True for name in raises.split()} | {name: False for name in quiet.split()}

  def resolve(name: str) -> Any:
    obj: Any = package
    for part in name.split("."):
      obj = getattr(obj, part)
    return obj

  @pytest.mark.parametrize("name", sorted(wanted))
  def test(name: str) -> None:
    assert missing_sections(resolve(name), wanted[name]) == [], name

  return test


def page_blocks(variant: str) -> Callable[..., None]:
  """A test, one case a Python block of the README and the pages that imports ``variant``'s
  framework: it runs as a reader runs it."""

  @pytest.mark.parametrize("block", blocks_for(variant), ids=block_id)
  def test(block: Any) -> None:
    run_block(block)

  return test


def api_reference(package: ModuleType) -> Callable[[], None]:
  """A test: the API reference has an entry for every public name of ``package``."""

  def test() -> None:
    assert documented_names(package.__name__) == public_names(package)

  return test
