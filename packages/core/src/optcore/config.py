"""Optimizer configs as plain data: one JSON/YAML-able dict drives every adapter.

A config names an optimizer and its hyper-parameters::

  {"name": "adamw", "learning_rate": 1e-3, "weight_decay": 0.1}

`to_config` writes the hyper-parameters that differ from their defaults.
``name`` is an optax alias (``"adamw"``), a contrib optimizer
(``"contrib.muon"``; optcore's own, ``"soap"``, also without ``contrib.``), a
legacy algorithm (``"legacy.Adam"``), T5X's Adafactor
(``"adafactor.Adafactor"``), ``"chain"`` (``"transformations"``: a list of
optimizer configs or optax transforms ``{"transform": "clip_by_global_norm",
"max_norm": 1.0}``), ``"multi"`` (``"groups"``: a list of ``{"select":
regex, "optimizer": config}``) or ``"grouped"`` (`optcore.grouped`:
``{"optimizer": config, "max_leaf_size": 65536}``). A hyper-parameter may be a schedule by name:
``{"schedule": "cosine_decay_schedule", "init_value": 1e-3, "decay_steps":
1000}``; dtypes are written by name (``"bfloat16"``).

Example:
  >>> import optcore
  >>> config = {
  ...   "name": "multi",
  ...   "groups": [
  ...     {"select": "kernel$", "optimizer": {"name": "adamw", "learning_rate": 1e-3}},
  ...     {"select": "bias$", "optimizer": {"name": "legacy.Momentum", "learning_rate": 0.1}},
  ...   ],
  ... }
  >>> opt_def = optcore.config.from_config(config)
  >>> optcore.config.from_config(optcore.config.to_config(opt_def)) == opt_def
  True
"""

from optcore._src.config import ConfigError as ConfigError
from optcore._src.config import Schedule as Schedule
from optcore._src.config import from_config as from_config
from optcore._src.config import to_config as to_config

__all__ = ["ConfigError", "Schedule", "from_config", "to_config"]
