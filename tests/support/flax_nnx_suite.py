"""Flax's own NNX optimizer tests (``tests/nnx/optimizer_test.py`` of the installed Flax),
run against the NNX face with one line changed: ``from flax import nnx`` becomes
``from optcore_flax import nnx``.

No copy of Flax's file is kept here: it comes from the source distribution of the installed
Flax version on PyPI (checked against PyPI's sha256), so the suite is always the one of the Flax
the tests run with. Nothing downloads inside pytest: ``nox -s tests`` runs this file as a script
before pytest (``python tests/support/flax_nnx_suite.py``), which fetches the suite into
``OPTCORE_TEST_CACHE`` (default ``~/.cache/optcore-tests``); the test reads the cache alone and
skips, naming that command, where it holds no copy.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
import urllib.request
from importlib import metadata
from pathlib import Path

SUITE = "tests/nnx/optimizer_test.py"
ORIGINAL_IMPORT = "from flax import nnx\n"
FACE_IMPORT = "from optcore_flax import nnx\n"


def flax_version() -> str:
  return metadata.version("flax")


def cache_dir() -> Path:
  return Path(os.environ.get("OPTCORE_TEST_CACHE", Path.home() / ".cache" / "optcore-tests"))


FETCH_COMMAND = "python tests/support/flax_nnx_suite.py"


def cached_suite(version: str) -> Path:
  """Where Flax ``version``'s ``tests/nnx/optimizer_test.py`` is kept once fetched."""
  return cache_dir() / f"flax-{version}" / SUITE


def fetch_suite(version: str) -> Path:
  """Fetches Flax ``version``'s ``tests/nnx/optimizer_test.py`` from its sdist on PyPI into
  the cache (nothing is fetched when it is there already) and returns its path.

  Raises:
    OSError: PyPI could not be reached.
    RuntimeError: PyPI has no sdist of that version, or it fails PyPI's sha256.
  """
  cached = cached_suite(version)
  if cached.exists():
    return cached
  index = urllib.request.Request(  # PEP 691: the simple index, as JSON
    "https://pypi.org/simple/flax/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
  )
  with urllib.request.urlopen(index, timeout=60) as r:
    files = json.load(r)["files"]
  sdists = [f for f in files if f["filename"] == f"flax-{version}.tar.gz"]
  if not sdists:
    raise RuntimeError(f"flax {version} has no source distribution on PyPI to read {SUITE} from")
  with urllib.request.urlopen(sdists[0]["url"], timeout=120) as r:
    data = r.read()
  if hashlib.sha256(data).hexdigest() != sdists[0]["hashes"]["sha256"]:
    raise RuntimeError(f"flax {version}'s sdist does not match PyPI's sha256")
  with tarfile.open(fileobj=io.BytesIO(data)) as archive:
    text = archive.extractfile(f"flax-{version}/{SUITE}").read().decode()  # type: ignore[union-attr]
  cached.parent.mkdir(parents=True, exist_ok=True)
  cached.write_text(text)
  return cached


def with_face(text: str) -> str:
  """``text`` with its one ``from flax import nnx`` line importing the face instead."""
  lines = text.splitlines(keepends=True)
  at = [i for i, line in enumerate(lines) if line == ORIGINAL_IMPORT]
  if len(at) != 1:
    raise AssertionError(
      f"{SUITE} has {len(at)} lines {ORIGINAL_IMPORT.strip()!r}; the one-line swap needs one"
    )
  lines[at[0]] = FACE_IMPORT
  return "".join(lines)


def main() -> int:
  """Fetches the installed Flax's suite. Where PyPI cannot be reached the test will skip, so
  this says so and succeeds, unless ``CI`` is set: there a skip would hide the suite."""
  version = flax_version()
  try:
    path = fetch_suite(version)
  except (OSError, RuntimeError) as e:
    print(f"could not fetch Flax {version}'s {SUITE} from PyPI: {e}", file=sys.stderr)
    if os.environ.get("CI"):
      return 1
    print("test_flax_nnx_suite.py will skip; run this again online to run it", file=sys.stderr)
    return 0
  print(f"Flax {version}'s {SUITE}: {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
