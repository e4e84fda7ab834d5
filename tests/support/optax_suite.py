"""optax's own test suite (shipped in its wheel) judges optcore's optax face: run it as it is,
then with every factory rebound to ``optcore.<name>(...).as_optax()`` (the `optax_rebound`
plugin), and fail on each test that fails only rebound. A test that fails with optax alone is
optax's (or this environment's), not optcore's, and is listed apart.

    python tests/support/optax_suite.py [PYTEST_ARGS]   # what nox -s optax_suite runs
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).parent


def failures(report: Path) -> set[str]:
  """The ids of the tests that failed or erred in a junit report."""
  failed = set()
  for case in ET.parse(report).getroot().iter("testcase"):
    if case.find("failure") is not None or case.find("error") is not None:
      failed.add(f"{case.get('classname')}::{case.get('name')}")
  return failed


def run(report: Path, *args: str) -> None:
  """optax's suite under its own settings: an empty pytest config beside ``report``, not this
  repository's (whose ``filterwarnings = error`` fails optax's tests on optax's own warnings)."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
  config = report.with_suffix(".ini")
  config.write_text("[pytest]\n")
  command = [sys.executable, "-m", "pytest", "-q", "-c", str(config), "-p", "no:cacheprovider"]
  command += [f"--rootdir={report.parent}", f"--junitxml={report}"]
  subprocess.run([*command, *args, "--pyargs", "optax"], env=env, check=False)


def main(args: list[str]) -> int:
  with tempfile.TemporaryDirectory() as tmp:
    raw, ours = Path(tmp) / "raw.xml", Path(tmp) / "ours.xml"
    run(raw, *args)
    run(ours, "-p", "optax_rebound", *args)
    optax_own, rebound = failures(raw), failures(ours)
  for name in sorted(optax_own):
    print(f"fails with optax alone (not optcore's): {name}")
  mine = sorted(rebound - optax_own)
  for name in mine:
    print(f"fails only with optcore's as_optax(): {name}")
  print(f"optax's suite: {len(optax_own)} failing alone, {len(mine)} failing only rebound")
  return 1 if mine else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
