"""optcore for Flax.

Importing it makes optcore's paths canonical for nnx: a Variable's ``.value``
level is left out, so ``{'kernel': Param(...)}`` reads ``/kernel`` in
selectors and state dicts, as a Linen param does. The flax.optim and T5X
optimizer surfaces come in a later release. Use the core directly today:

  >>> import jax.numpy as jnp
  >>> import optcore, optcore_flax
  >>> opt = optcore.adam(1e-3).create({'params': {'Dense_0': {'kernel': jnp.ones((2, 2))}}})
  >>> optcore_flax.__version__ == optcore.__version__
  True
"""

from importlib.metadata import version as _version

from flax import nnx as _nnx

import optcore as _optcore

_optcore.register_hidden_level(_nnx.Variable)

__version__ = _version("optcore-flax")
__all__: list[str] = []
