"""Warnings that point at the user's line, whichever face and path raised them.

A hard-coded ``stacklevel`` is right for one call path only: the same check
runs under ``Optimizer.apply_gradient``, ``adapter.step``, a MultiOptimizer
group, an Equinox or Treex optimizer, and inside ``jax.jit``. As JAX does for
its tracebacks, `warn` walks out from its caller past every frame of the
optcore packages (and of the libraries they call back through, such as
``jax.tree.map``) to the first frame of the user's code, and attributes the
warning there.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import warnings

#: Libraries whose frames may stand between two optcore frames (a callback
#: through ``jax.tree.map``, an Equinox filter); skipped on the way out.
_LIBRARIES = ("jax", "jaxlib", "optax", "flax", "equinox", "treeo", "treex")


def _prefixes() -> tuple[str, ...]:
  """The folders of the optcore packages and of the libraries they call through."""
  folders = [sysconfig.get_paths()["stdlib"]]
  for name, module in list(sys.modules.items()):
    top = name.partition(".")[0]
    if name == top and (top.startswith("optcore") or top in _LIBRARIES):
      file = getattr(module, "__file__", None)
      if file:
        folders.append(os.path.dirname(file))
  return tuple(os.path.join(f, "") for f in folders)


def user_stacklevel(skip: int = 1) -> int:
  """The ``stacklevel`` that names the first frame outside optcore and the
  libraries it calls through, seen from ``skip`` frames above this one."""
  prefixes = _prefixes()
  frame = sys._getframe(skip + 1)
  level = 1
  while frame is not None and frame.f_code.co_filename.startswith(prefixes):
    frame = frame.f_back
    level += 1
  return level


def warn(message: str, category: type[Warning] = UserWarning) -> None:
  """Issues ``message`` attributed to the user's line that led to this call.

  For optcore and its adapters: the warning's file and line are the first
  frame outside the optcore packages (and outside the JAX, optax and
  framework code between them), whatever path led here.

  Args:
    message: the warning's text.
    category: the warning class; default `UserWarning`.

  Returns:
    None.

  Example:
    >>> import warnings
    >>> from optcore import adapter
    >>> with warnings.catch_warnings(record=True) as caught:
    ...   warnings.simplefilter("always")
    ...   adapter.warn("the filter selects no leaf")
    >>> caught[0].filename.endswith("optcore/_src/ground/user_warnings.py")
    False
  """
  warnings.warn(message, category, stacklevel=user_stacklevel(skip=1) + 1)
