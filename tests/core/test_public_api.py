"""The public modules of every package say what they export, explicitly.

Each public module of the core re-exports names one by one
(``from ._src.x import y as y``, as Equinox does) so that type checkers and
IDEs see them, and ``__all__`` lists exactly the public names it binds; no
public module of any package star-imports or swaps its own class. The docs' API
pages are compared with these names in `test_docs.py`.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
import types
from pathlib import Path

import pytest

import optcore

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["optcore", "optcore_flax", "optcore_equinox", "optcore_treex"]


def _public_modules() -> list[str]:
  """Every public module of the packages importable here (the others' venvs test theirs)."""
  out = []
  for package in PACKAGES:
    try:
      module = importlib.import_module(package)
    except ImportError:
      continue
    out.append(package)
    for info in pkgutil.walk_packages(module.__path__, prefix=f"{package}."):
      if not any(part.startswith("_") for part in info.name.split(".")):
        out.append(info.name)
  return out


def _tree(module_name: str) -> ast.Module:
  return ast.parse(Path(importlib.import_module(module_name).__file__).read_text())


def _bound_public_names(tree: ast.Module) -> set[str]:
  """The public names a module binds at top level: imports, assignments, defs."""
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.Assign):
      names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
      names.add(node.target.id)
    elif isinstance(node, ast.Try):
      names |= _bound_public_names(ast.Module(body=node.body, type_ignores=[]))
  return {n for n in names if not n.startswith("_") and n != "annotations"}


@pytest.mark.parametrize("module_name", _public_modules())
def test_no_star_import_in_a_public_module(module_name):
  for node in _tree(module_name).body:
    if isinstance(node, ast.ImportFrom):
      assert all(a.name != "*" for a in node.names), f"{module_name}: star import"


CORE_MODULES = ["optcore", *(m for m in _public_modules() if m.startswith("optcore."))]


@pytest.mark.parametrize("module_name", CORE_MODULES)
def test_all_lists_exactly_the_public_names_a_module_binds(module_name):
  module = importlib.import_module(module_name)
  exported = getattr(module, "__all__", None)
  if exported is None:
    pytest.fail(f"{module_name} has no __all__")
  assert len(set(exported)) == len(exported), f"{module_name}: a name twice in __all__"
  # An import that binds a public name is a re-export: listed in __all__, or named with `_`.
  # (The legacy faces, whose modules copy the originals' private names, are judged by
  # their originals' name lists in tests/flax/test_original_names.py.)
  bound = _bound_public_names(_tree(module_name))
  assert set(exported) == bound, (
    f"{module_name}: in __all__ only {sorted(set(exported) - bound)}, "
    f"bound but not in __all__ {sorted(bound - set(exported))}"
  )


def test_no_public_module_swaps_its_own_class():
  for name in _public_modules():
    assert type(sys.modules[name]) is types.ModuleType, name


def test_every_optax_alias_and_contrib_optimizer_is_exported():
  assert set(optcore.OPTAX_ALIASES) <= set(optcore.__all__)
  assert set(optcore.contrib.CONTRIB_OPTIMIZERS) <= set(optcore.contrib.__all__)


def test_the_derived_lists_are_read_from_the_modules_that_define_the_things():
  # A wrapper added as one more line in optax_aliases.py or contrib.py is picked up
  # with no other edit: the lists are read from the module namespace.
  import optax

  from optcore._src.definitions.optax_wrapper import wrap_optax_optimizer, wrapped_names

  namespace = {"adam": wrap_optax_optimizer(optax.adam), "sgd": wrap_optax_optimizer(optax.sgd)}
  namespace |= {"_private": wrap_optax_optimizer(optax.lion), "not_a_wrapper": optax.adam}
  assert wrapped_names(namespace, optax) == ("adam", "sgd")
