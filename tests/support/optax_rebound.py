"""A pytest plugin for optax's own test suite: every optax factory optcore wraps is rebound to
``optcore.<name>(...).as_optax()`` (``optax.adam``, ``optax._src.alias.adam``,
``optax.contrib.muon``, ...), so optax's tests judge optcore's optax face.

Run by ``nox -s optax_suite`` as ``pytest -p optax_rebound --pyargs optax``, with this folder
on ``PYTHONPATH``. optcore wraps the factories it captured at import, so the rebinding never
reaches optcore's own calls into optax.
"""

from __future__ import annotations

import functools
from typing import Any

import optax
import optax.contrib
from optax._src import alias

import optcore
from optcore import contrib

REBOUND: list[str] = []


def _rebind(module: Any, name: str, ours: Any) -> None:
  original = getattr(module, name)

  @functools.wraps(original)
  def rebound(*args: Any, **kwargs: Any) -> Any:
    return ours(*args, **kwargs).as_optax()

  setattr(module, name, rebound)
  REBOUND.append(f"{module.__name__}.{name}")


def pytest_configure(config: Any) -> None:
  for name in optcore.OPTAX_ALIASES:
    for module in (alias, optax):
      if hasattr(module, name):
        _rebind(module, name, getattr(optcore, name))
  for name in contrib.CONTRIB_OPTIMIZERS:
    if name not in contrib.OWN_OPTIMIZERS and hasattr(optax.contrib, name):
      _rebind(optax.contrib, name, getattr(contrib, name))


def pytest_report_header(config: Any) -> str:
  return f"optcore: {len(REBOUND)} optax factories rebound to optcore's as_optax()"
