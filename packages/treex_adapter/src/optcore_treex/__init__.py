"""optcore for Treex code, on treeo.

This release holds the package and its dependencies only; Treex's
``Optimizer`` comes in a later release.

  >>> import optcore, optcore_treex
  >>> optcore_treex.__version__ == optcore.__version__
  True
"""

from importlib.metadata import version as _version

import treeo as _treeo  # noqa: F401  (the framework this adapter serves)

import optcore as _optcore  # noqa: F401

__version__ = _version("optcore-treex")
__all__: list[str] = []
