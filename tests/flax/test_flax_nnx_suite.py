"""Flax's own NNX optimizer tests pass on the NNX face with only the import line changed
(``from flax import nnx`` -> ``from optcore_flax import nnx``): every test, none left out.

The suite is the installed Flax's (see `flax_nnx_suite`), fetched before pytest by
``nox -s tests``; it runs in a subprocess, with a conftest that counts the face's ``update``
calls, so a run that never reached the face fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from flax_nnx_suite import (
  FACE_IMPORT,
  FETCH_COMMAND,
  ORIGINAL_IMPORT,
  cached_suite,
  flax_version,
  with_face,
)

COUNTING_CONFTEST = """
import os
import optcore_flax.nnx as face

_update = face.Optimizer.update
CALLS = []


def _counted(self, *args, **kwargs):
  CALLS.append(type(self).__name__)
  return _update(self, *args, **kwargs)


face.Optimizer.update = _counted


def pytest_sessionfinish(session):
  with open(os.environ["FACE_CALLS"], "w") as f:
    f.write(" ".join(CALLS))
"""


def _suite_text() -> str:
  path = cached_suite(flax_version())
  if not path.exists():
    pytest.skip(
      f"Flax {flax_version()}'s NNX optimizer suite is not fetched ({path} is missing): "
      f"`nox -s tests` fetches it before pytest, or run `{FETCH_COMMAND}` online"
    )
  return path.read_text()


def test_the_swap_changes_one_line_only():
  text = _suite_text()
  swapped = with_face(text)
  before, after = text.splitlines(), swapped.splitlines()
  changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
  assert changed == [(ORIGINAL_IMPORT.strip(), FACE_IMPORT.strip())]


def test_flax_nnx_optimizer_suite_passes_on_the_face(tmp_path):
  (tmp_path / "optimizer_test.py").write_text(with_face(_suite_text()))
  (tmp_path / "conftest.py").write_text(COUNTING_CONFTEST)
  report, calls = tmp_path / "report.xml", tmp_path / "calls.txt"
  env = {**os.environ, "FACE_CALLS": str(calls)}
  env.pop("XLA_FLAGS", None)  # Flax's suite runs on one device, as in Flax's CI
  result = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
  suite = ET.parse(report).getroot().find("testsuite")
  assert suite is not None
  counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
  assert counts["tests"] >= 30 and counts["failures"] == counts["errors"] == 0, counts
  assert counts["skipped"] == 0, counts
  kinds = set(Path(calls).read_text().split())
  assert {"Optimizer", "ModelAndOptimizer"} <= kinds, kinds  # both faces ran


def test_with_no_fetched_suite_the_test_skips_naming_the_command(tmp_path, monkeypatch):
  monkeypatch.setenv("OPTCORE_TEST_CACHE", str(tmp_path))
  with pytest.raises(pytest.skip.Exception, match=r"not fetched .*nox -s tests.*flax_nnx_suite"):
    _suite_text()


def test_fetching_offline_fails_only_on_ci(tmp_path, monkeypatch, capsys):
  import flax_nnx_suite

  def unreachable(*args, **kwargs):
    raise OSError("Network is unreachable")

  monkeypatch.setenv("OPTCORE_TEST_CACHE", str(tmp_path))
  monkeypatch.setattr(flax_nnx_suite.urllib.request, "urlopen", unreachable)
  monkeypatch.delenv("CI", raising=False)
  assert flax_nnx_suite.main() == 0
  assert "will skip" in capsys.readouterr().err
  monkeypatch.setenv("CI", "true")
  assert flax_nnx_suite.main() == 1
  assert not list(tmp_path.rglob("*.py"))
