"""optcore for Treex code, on treeo and modern JAX.

`Optimizer` is Treex's optimizer (a ``treeo.Tree``) over an optax
transformation or any optcore config. Importing this package also makes
treeo 0.2.2's ``to.copy``, ``to.filter``, ``to.merge``, ``to.map`` and
``to.apply`` work on JAX >= 0.6, for treeo only (``jax`` itself is not
changed), and leaves a Tree's internal flattened-index level out of optcore's
paths, so a field ``w`` reads ``/w`` in selectors and state dicts.

  >>> import jax.numpy as jnp, optax, treeo as to
  >>> import optcore_treex
  >>> to.copy({'w': jnp.ones(2)})['w']
  Array([1., 1.], dtype=float32)
"""

from importlib.metadata import version as _version

import treeo as _treeo

import optcore as _optcore
from optcore_treex import _treeo_compat
from optcore_treex._optimizer import Optimizer as Optimizer

_treeo_compat.install()
_optcore.register_hidden_level(_treeo.Tree)

__version__ = _version("optcore-treex")
__all__ = ["Optimizer"]
