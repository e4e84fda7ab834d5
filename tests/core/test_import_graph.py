"""The core's import graph: acyclic but for flax.optim's own ``focus`` pair, no
function-level import without a comment saying why, and adapters that use
only public optcore names."""

from __future__ import annotations

import ast
from pathlib import Path

import optcore

CORE = Path(optcore.__file__).parent
ADAPTERS = Path(__file__).parents[2] / "packages"


def module_name(path: Path) -> str:
  parts = path.relative_to(CORE.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in CORE.rglob("*.py")}


def imported(node: ast.Import | ast.ImportFrom) -> list[str]:
  """The optcore modules an import statement loads (a name that is a module counts as one)."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names if a.name.split(".")[0] == "optcore"]
  if not node.module or node.module.split(".")[0] != "optcore":
    return []
  return [
    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
    for a in node.names
  ]


def module_level_imports(tree: ast.Module) -> set[str]:
  """The module's imports, those under ``if TYPE_CHECKING:`` included: a cycle a type checker
  walks is a cycle (optimizer -> transplant -> serialization -> optimizer hid there)."""
  found: set[str] = set()
  for node in tree.body:
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
      for inner in node.body:
        if isinstance(inner, (ast.Import, ast.ImportFrom)):
          found.update(imported(inner))
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      found.update(imported(node))
  return found


def function_level_imports(tree: ast.Module) -> list[ast.stmt]:
  inside = []
  for fn in ast.walk(tree):
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for node in ast.walk(fn):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and imported(node):
          inside.append(node)
  return inside


def graph() -> dict[str, set[str]]:
  return {
    name: module_level_imports(ast.parse(path.read_text())) - {name}
    for name, path in MODULES.items()
  }


def cycles(edges: dict[str, set[str]]) -> list[set[str]]:
  """The strongly connected components with more than one module (Tarjan)."""
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  found: list[set[str]] = []

  def visit(v: str) -> None:
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = set()
      while True:
        w = stack.pop()
        component.add(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(component)

  for v in edges:
    if v not in index:
      visit(v)
  return found


def test_the_core_has_no_import_cycle():
  assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
  edges = graph()
  edges["optcore._src.ground.paths"] = edges["optcore._src.ground.paths"] | {
    "optcore._src.definitions.base"
  }
  assert any(
    "optcore._src.definitions.base" in c and "optcore._src.ground.paths" in c for c in cycles(edges)
  )


def test_the_only_function_level_import_is_focus_and_says_why():
  where = []
  for name, path in MODULES.items():
    source = path.read_text()
    lines = source.splitlines()
    for node in function_level_imports(ast.parse(source)):
      comment = lines[node.lineno - 2].strip()
      assert comment.startswith("#") or "#" in lines[node.lineno - 1], (name, node.lineno)
      where.append((name, imported(node)))
  assert where == [("optcore._src.definitions.base", ["optcore._src.definitions.multi_optimizer"])]


def test_adapters_import_only_public_optcore_names():
  private = []
  for path in ADAPTERS.glob("*_adapter/src/**/*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
        private += [(path.name, n) for n in names if n and n.startswith("optcore._src")]
  assert private == []
  assert len(list(ADAPTERS.glob("*_adapter/src/**/*.py"))) > 10  # the adapters were found


def optimizer_modules() -> set[str]:
  """The modules whose factory `optcore.contrib` wraps (``from optcore._src.optimizers.soap
  import soap as _soap``, then ``soap = _wrap(_soap, ...)``): read from the export list, not
  kept by hand."""
  tree = ast.parse((CORE / "contrib.py").read_text())
  return {
    node.module
    for node in tree.body
    if isinstance(node, ast.ImportFrom)
    and node.module.startswith("optcore._src.")
    and any(
      a.asname == f"_{a.name}" and a.name == node.module.rsplit(".", 1)[1] for a in node.names
    )
  }


def test_an_optimizer_module_is_imported_by_the_export_lists_alone():
  """Issue 61: adding an optimizer touches its module and one export line; what several share
  (SOAP's preconditioners, torch's lerp) lives in a shared module, never in one of them."""
  optimizers = optimizer_modules()
  assert {
    "optcore._src.optimizers.soap",
    "optcore._src.optimizers.shampoo",
    "optcore._src.optimizers.dion",
  } <= optimizers
  importers = {
    (name, target)
    for name, targets in graph().items()
    for target in targets
    if target in optimizers and "._src." in name
  }
  assert importers == set()


#: The role folders of ``optcore/_src``, lowest first (docs/development.md's map): a module
#: imports only from its own folder and from lower ones; folders of one rank are peers that
#: never import each other. ``_src``'s own modules and the public ones sit above them all.
LAYERS = {
  "ground": 0,
  "persistence": 1,
  "axes": 2,
  "containers": 3,
  "definitions": 4,
  "wrappers": 5,
  "optimizers": 5,
  "legacy": 5,
}
TOP = len(set(LAYERS.values()))


def folder_of(module: str) -> str:
  parts = module.split(".")
  if parts[:2] != ["optcore", "_src"] or len(parts) == 3:
    return ""  # a public module or one at _src's top
  return parts[2]


def rank_of(module: str) -> int:
  return LAYERS[folder_of(module)] if folder_of(module) else TOP


def test_src_keeps_at_most_twelve_modules_at_its_top_and_every_folder_is_placed():
  top = sorted(p.name for p in (CORE / "_src").glob("*.py"))
  assert len(top) <= 12, top
  folders = {p.name for p in (CORE / "_src").iterdir() if p.is_dir() and p.name != "__pycache__"}
  assert folders == set(LAYERS)


def test_a_lower_folder_never_imports_a_higher_one_nor_a_peer():
  wrong = sorted(
    (name, target)
    for name, targets in graph().items()
    for target in targets
    if folder_of(name) != folder_of(target) and rank_of(name) <= rank_of(target)
    and not (rank_of(name) == rank_of(target) == TOP)
  )  # fmt: skip
  assert wrong == []


def test_the_layer_check_sees_an_upward_import():
  edges = graph()
  paths, soap = "optcore._src.ground.paths", "optcore._src.optimizers.soap"
  assert rank_of(paths) < rank_of(soap) and soap in MODULES
  wrong = [(a, b) for a, bs in {paths: {soap}}.items() for b in bs if rank_of(a) <= rank_of(b)]
  assert wrong == [(paths, soap)] and paths in edges


def test_the_development_map_lists_every_module():
  """docs/development.md's rooms table names each module by its place (``ground/paths.py``)."""
  text = (CORE.parents[3] / "docs" / "development.md").read_text()
  modules = sorted(
    str(p.relative_to(CORE / "_src"))
    for p in (CORE / "_src").rglob("*.py")
    if p.name != "__init__.py"
  )
  missing = [m for m in modules if f"`{m}`" not in text]
  assert missing == []
