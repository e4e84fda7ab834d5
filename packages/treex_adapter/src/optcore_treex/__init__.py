"""optcore for Treex code, on treeo.

Importing it makes optcore's paths canonical for treeo: a Tree's internal
flattened-index level is left out, so a field ``w`` reads ``/w`` in selectors
and state dicts. Treex's ``Optimizer`` comes in a later release.

  >>> import optcore, optcore_treex
  >>> optcore_treex.__version__ == optcore.__version__
  True
"""

from importlib.metadata import version as _version

import treeo as _treeo

import optcore as _optcore

_optcore.register_hidden_level(_treeo.Tree)

__version__ = _version("optcore-treex")
__all__: list[str] = []
