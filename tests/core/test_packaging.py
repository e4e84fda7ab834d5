"""The four distributions move in lockstep, and the core imports no framework."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import optcore

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = {"flax": "flax_adapter", "equinox": "equinox_adapter", "treex": "treex_adapter"}


def project(folder: str) -> dict:
  return tomllib.loads((ROOT / "packages" / folder / "pyproject.toml").read_text())["project"]


def test_one_version_and_exact_pins():
  core = project("core")
  version = core["version"]
  assert optcore.__version__ == version
  extras = core["optional-dependencies"]
  for extra, folder in ADAPTERS.items():
    adapter = project(folder)
    assert adapter["version"] == version
    assert f"optcore=={version}" in adapter["dependencies"]
    assert extras[extra] == [f"{adapter['name']}=={version}"]
  assert sorted(extras["all"]) == sorted(
    f"{project(f)['name']}=={version}" for f in ADAPTERS.values()
  )


def test_core_dependencies_are_jax_optax_numpy_only():
  names = {
    d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project("core")["dependencies"]
  }
  assert names == {"jax", "optax", "numpy"}


def test_importing_the_core_loads_no_framework():
  code = (
    "import sys, optcore, optcore.contrib; "
    "frameworks = ('flax', 'equinox', 'treeo', 'treex'); "
    "print(sorted(m for m in sys.modules if m.split('.')[0] in frameworks))"
  )
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert result.stdout.strip() == "[]"


def test_every_package_declares_the_pythons_the_nox_matrix_tests():
  noxfile = ast.parse((ROOT / "noxfile.py").read_text())
  tested = next(
    ast.literal_eval(node.value)
    for node in noxfile.body
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PYTHONS"
  )
  assert tested == ["3.11", "3.12", "3.13"]
  for folder in ("core", *ADAPTERS.values()):
    declared = project(folder)
    assert declared["requires-python"] == f">={tested[0]}", folder
    versions = [
      c.rsplit(" :: ", 1)[1]
      for c in declared["classifiers"]
      if c.startswith("Programming Language :: Python :: 3.")
    ]
    assert versions == tested, folder


def test_every_distribution_has_a_real_readme_urls_and_keywords():
  """The README is the PyPI page: what it is, how to install it, an example (run by the doc
  tests with the package's own dependencies), where the docs are."""
  for folder in ("core", *ADAPTERS.values()):
    declared = project(folder)
    readme = (ROOT / "packages" / folder / declared["readme"]).read_text()
    assert readme.startswith(f"# {declared['name']}\n"), folder
    for section in ("## Install", "## Example", "## Documentation"):
      assert section in readme, (folder, section)
    assert "```python" in readme, folder
    installs = [line for line in readme.splitlines() if line.startswith("pip install ./packages/")]
    assert any(f"./packages/{folder}" in line.split() for line in installs), folder
    assert len(readme) > 800, folder
    assert set(declared["urls"]) == {"Documentation", "Source", "Issues"}, folder
    assert len(declared["keywords"]) >= 4 and "jax" in declared["keywords"], folder
    assert "adapter for" not in declared["description"], folder  # not a placeholder
