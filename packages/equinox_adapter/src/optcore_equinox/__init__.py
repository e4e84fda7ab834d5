"""optcore for Equinox.

This release holds the package and its dependencies only; the ``eqx.Module``
optimizer comes in a later release.

  >>> import optcore, optcore_equinox
  >>> optcore_equinox.__version__ == optcore.__version__
  True
"""

from importlib.metadata import version as _version

import equinox as _equinox  # noqa: F401  (the framework this adapter serves)

import optcore as _optcore  # noqa: F401

__version__ = _version("optcore-equinox")
__all__: list[str] = []
