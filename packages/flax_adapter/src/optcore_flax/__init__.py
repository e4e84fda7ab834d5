"""optcore for Flax.

This release holds the package and its dependencies only; the flax.optim and
T5X optimizer surfaces come in a later release. Use the core directly today:

  >>> import jax.numpy as jnp
  >>> import optcore, optcore_flax
  >>> opt = optcore.adam(1e-3).create({'params': {'Dense_0': {'kernel': jnp.ones((2, 2))}}})
  >>> optcore_flax.__version__ == optcore.__version__
  True
"""

from importlib.metadata import version as _version

import flax as _flax  # noqa: F401  (the framework this adapter serves)

import optcore as _optcore  # noqa: F401

__version__ = _version("optcore-flax")
__all__: list[str] = []
