"""The Python blocks of the README and of every documentation page, and how to run one.

A block runs in the test variant of the framework it imports (none: the core's; more than one,
or orbax: the "all" variant), so each runs where its dependencies are installed. A block written
as ```{code-block} python`` with a ``:name:`` is one side of a migration guide (``<guide>-before``
or ``<guide>-after``): its guide's test runs it and compares the numbers, so the generic tests
leave named blocks alone, and `GUIDE_BLOCKS` lists every name a guide test claims.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# The variant whose venv has what a block imports: the framework's adapter or the framework.
FRAMEWORKS = {
  "flax": ("optcore_flax", "flax"),
  "equinox": ("optcore_equinox", "equinox"),
  "treex": ("optcore_treex", "treeo", "treex"),
}
# Every named block, by the test module that runs it.
GUIDE_BLOCKS = {
  "flax-optim-before": "tests/flax/test_migration_flax.py",
  "flax-optim-after": "tests/flax/test_migration_flax.py",
  "t5x-before": "tests/flax/test_migration_flax.py",
  "t5x-after": "tests/flax/test_migration_flax.py",
  "nnx-before": "tests/flax/test_migration_flax.py",
  "nnx-after": "tests/flax/test_migration_flax.py",
  "nnx-as-optax": "tests/flax/test_migration_flax.py",
  "trainstate-before": "tests/flax/test_migration_flax.py",
  "trainstate-after": "tests/flax/test_migration_flax.py",
  "equinox-before": "tests/equinox/test_migration_equinox.py",
  "equinox-after": "tests/equinox/test_migration_equinox.py",
  "treex-before": "tests/treex/test_migration_treex.py",
  "treex-after": "tests/treex/test_migration_treex.py",
}
FENCE = re.compile(
  r"^(?P<indent>[ \t]*)```(?:python|\{code-block\} python)[ \t]*\n(?P<body>.*?)^(?P=indent)```",
  re.M | re.S,
)


@dataclass(frozen=True)
class Block:
  page: str  # relative to the repository root
  line: int  # of the block's first line of code
  name: str | None
  source: str
  #: the page's earlier blocks, run first, where the page reads as one session
  #: (`SESSION_MARK`: a tutorial whose blocks build on each other)
  before: tuple[str, ...] = ()
  #: whether the page's blocks need 8 devices (`MESH_MARK`)
  on_mesh: bool = False

  @property
  def variant(self) -> str | None:
    source = "\n".join([*self.before, self.source])
    found = {
      variant
      for variant, modules in FRAMEWORKS.items()
      if any(re.search(rf"^\s*(import|from)\s+{m}\b", source, re.M) for m in modules)
    }
    if self.on_mesh and len(found) == 1:  # its framework's 8-device tests (Flax has orbax)
      return f"{found.pop()}-mesh"
    if len(found) > 1 or re.search(r"^\s*(import|from)\s+orbax\b", source, re.M):
      return "all"
    return found.pop() if found else None

  def __str__(self) -> str:
    return f"{self.page}:{self.line}"


def pages() -> list[Path]:
  skip = {DOCS / "_build", DOCS / "_generated"}
  found = [p for p in sorted(DOCS.rglob("*.md")) if not any(s in p.parents for s in skip)]
  # The packages' READMEs are their PyPI pages: their examples run too.
  return [ROOT / "README.md", *sorted(ROOT.glob("packages/*/README.md")), *found]


#: A page that holds this line runs its blocks as one session, in order: each block's test runs
#: the blocks before it first.
SESSION_MARK = "<!-- doc-blocks: one session -->"
#: A page that holds this line runs its blocks on 8 devices: in its framework's 8-device tests
#: (variant ``"<framework>-mesh"``: tests/flax/mesh for Flax).
MESH_MARK = "<!-- doc-blocks: 8 devices -->"


def _blocks_of(page: Path) -> list[Block]:
  text = page.read_text()
  session = SESSION_MARK in text
  on_mesh = MESH_MARK in text
  blocks = []
  for match in FENCE.finditer(text):
    indent = len(match["indent"])
    lines = [line[indent:] for line in match["body"].splitlines()]
    name = None
    while lines and lines[0].startswith(":"):
      option, _, value = lines.pop(0)[1:].partition(":")
      if option == "name":
        name = value.strip()
    while lines and not lines[0].strip():
      lines.pop(0)
    first = text.count("\n", 0, match.start("body")) + 1
    first += len(match["body"].splitlines()) - len(lines)
    source = "\n".join(lines) + "\n"
    before = tuple(b.source for b in blocks) if session else ()
    blocks.append(Block(str(page.relative_to(ROOT)), first, name, source, before, on_mesh))
  return blocks


BLOCKS = [block for page in pages() for block in _blocks_of(page)]


def blocks_for(variant: str | None) -> list[Block]:
  """The unnamed blocks that run in ``variant`` (None: the core's)."""
  return [b for b in BLOCKS if b.name is None and b.variant == variant]


def named_block(name: str) -> Block:
  found = [b for b in BLOCKS if b.name == name]
  assert len(found) == 1, f"expected one block named {name!r}, found {[str(b) for b in found]}"
  return found[0]


def run_block(block: Block) -> dict:
  """Runs ``block`` as a reader runs it (JAX's defaults: the suite raises on rank promotion);
  returns its namespace. Tracebacks point at the page's lines."""
  namespace: dict = {"__name__": "__doc_block__"}
  with jax.numpy_rank_promotion("allow"):
    for earlier in block.before:
      exec(compile(earlier, f"{ROOT / block.page} (an earlier block)", "exec", dont_inherit=True),
           namespace)  # fmt: skip
    # dont_inherit: this module's `from __future__ import annotations` is not the reader's
    source = "\n" * (block.line - 1) + block.source
    exec(compile(source, str(ROOT / block.page), "exec", dont_inherit=True), namespace)
  return namespace


def block_id(block: Block) -> str:
  return str(block)


def documented_names(package: str) -> set[str]:
  """The dotted names ``docs/api/<package>.md`` has an entry for (autodoc, optax-alias, or
  ``py:data`` for a constant whose docstring autodoc cannot see)."""
  text = (DOCS / "api" / f"{package}.md").read_text()
  entries = r"^\.\. (?:auto\w+|optax-alias|py:data):: (\S+)"
  return set(re.findall(entries, text, re.M)) - {package}


def public_names(module) -> set[str]:
  """Every name of ``module.__all__``, dotted, and of its public submodules' ``__all__``."""
  names = set()
  for name in module.__all__:
    names.add(f"{module.__name__}.{name}")
    value = getattr(module, name)
    if getattr(value, "__name__", None) == f"{module.__name__}.{name}":  # a submodule
      names |= {f"{value.__name__}.{n}" for n in getattr(value, "__all__", ())}
  return names
