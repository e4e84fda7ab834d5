"""optcore for Flax: flax.optim and T5X's optimizer API, drop-in, on today's Flax.

* `optcore_flax.optim`: the removed ``flax.optim`` (v0.5.3);
  `install_legacy_namespace` makes ``from flax import optim`` give it.
* `optcore_flax.optimizers` and `optcore_flax.adafactor`: ``t5x.optimizers``
  and ``t5x.adafactor``.
* `optcore_flax.nnx.Optimizer`: ``nnx.Optimizer`` over any optcore definition.
* Linen logical partitioning in, optimizer axes and shardings out
  (`param_logical_axes`, `derive_logical_axes`, `optimizer_shardings`,
  `create_sharded`).

Importing it registers optcore's `Optimizer` and `OptimizerState` with
``flax.serialization`` (``to_bytes``/``from_bytes`` give flax.optim's layout)
and leaves an nnx Variable's ``.value`` level out of optcore's paths.

  >>> import jax.numpy as jnp, flax
  >>> import optcore_flax
  >>> optimizer = optcore_flax.optim.Adam(1e-3).create({'w': jnp.ones(2)})
  >>> sorted(flax.serialization.to_state_dict(optimizer)['state'])
  ['param_states', 'step']
"""

import sys as _sys
from importlib.metadata import version as _version

import flax as _flax
import flax.core as _flax_core
import jax as _jax
from flax import nnx as _nnx
from flax import serialization as _serialization
from flax import traverse_util as _traverse_util

import optcore as _optcore
from optcore_flax import adafactor as adafactor
from optcore_flax import nnx as nnx
from optcore_flax import optim as optim
from optcore_flax import optimizers as optimizers
from optcore_flax._linen import create_sharded as create_sharded
from optcore_flax._linen import derive_logical_axes as derive_logical_axes
from optcore_flax._linen import optimizer_shardings as optimizer_shardings
from optcore_flax._linen import param_logical_axes as param_logical_axes

_optcore.register_hidden_level(_nnx.Variable)


def _flax_traversal_mask(traversal, params):
  """The mask a ``flax.traverse_util`` traversal picks (flax.optim's and T5X's
  selectors): a ModelParamTraversal by its filter, any other traversal (e.g.
  ``t_identity['a']``) by marking what its ``update`` reaches."""
  if isinstance(traversal, _traverse_util.ModelParamTraversal):
    return _optcore.ModelParamTraversal(traversal._filter_fn).mask(params)
  # Traversals write into dicts: mark a mutable copy, then give it the params' structure.
  unpicked = _flax_core.unfreeze(_jax.tree.map(lambda _: False, params))
  picked = traversal.update(lambda sub: _jax.tree.map(lambda _: True, sub), unpicked)
  return _jax.tree.unflatten(_jax.tree.structure(params), _jax.tree.leaves(picked))


_optcore.register_selector_type(_traverse_util.Traversal, _flax_traversal_mask)
# msgpack has no typed PRNG keys (noisy_sgd, dpsgd): their key data is written instead.
_serialization.register_serialization_state(
  _optcore.Optimizer,
  lambda optimizer: _optcore.adapter.key_data_for_export(optimizer.state_dict()),
  lambda optimizer, state_dict: optimizer.restore_state(state_dict),
  override=True,
)
# A grouped optimizer writes the ungrouped state dict (it restores either way).
_serialization.register_serialization_state(
  _optcore.GroupedOptimizer,
  lambda optimizer: _optcore.adapter.key_data_for_export(optimizer.state_dict()),
  lambda optimizer, state_dict: optimizer.restore_state(state_dict),
  override=True,
)
_serialization.register_serialization_state(
  _optcore.OptimizerState,
  lambda state: _optcore.adapter.key_data_for_export(_optcore.to_state_dict(state)),
  lambda state, state_dict: _optcore.from_state_dict(state, state_dict),
  override=True,
)


def install_legacy_namespace() -> None:
  """Makes ``from flax import optim`` and ``import flax.optim`` give
  `optcore_flax.optim`, and ``flax.optim.adam`` (and every other flax.optim
  submodule) its submodule, so a program written for flax.optim runs with one
  added line. Opt-in; idempotent.

  Returns:
    None; ``sys.modules`` and ``flax.optim`` now point at `optcore_flax.optim`.

  Example:
    >>> import optcore_flax
    >>> optcore_flax.install_legacy_namespace()
    >>> from flax import optim
    >>> optim is optcore_flax.optim
    True
  """
  _sys.modules["flax.optim"] = optim
  for name in optim.SUBMODULES:
    _sys.modules[f"flax.optim.{name}"] = getattr(optim, name)
  setattr(_flax, "optim", optim)  # noqa: B010  (flax has no optim attribute to declare it)


__version__ = _version("optcore-flax")
__all__ = [
  "adafactor",
  "create_sharded",
  "derive_logical_axes",
  "install_legacy_namespace",
  "nnx",
  "optim",
  "optimizer_shardings",
  "optimizers",
  "param_logical_axes",
]
