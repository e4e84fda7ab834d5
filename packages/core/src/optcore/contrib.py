"""optax.contrib's optimizers as optcore definitions: ``optcore.contrib.<name>``.

The list is derived from the installed ``optax.contrib`` (see
`CONTRIB_OPTIMIZERS`). Optimizer wrappers (mechanize, sam, schedule_free,
split_real_and_imaginary) take optax transformations or optcore definitions.

Example:
  >>> import jax.numpy as jnp
  >>> import optcore
  >>> opt = optcore.contrib.adopt(learning_rate=1e-3).create({'w': jnp.ones(2)})
  >>> opt.apply_gradient({'w': jnp.ones(2)}, learning_rate=0.0).target['w']
  Array([1., 1.], dtype=float32)
"""

import optax.contrib as _contrib

from optcore._src.aliases import optax_contrib_names as _optax_contrib_names
from optcore._src.optax_wrapper import wrap_optax_optimizer as _wrap

#: The optax.contrib optimizers wrapped here, derived from the installed optax.
CONTRIB_OPTIMIZERS: tuple[str, ...] = tuple(_optax_contrib_names())

for _name in CONTRIB_OPTIMIZERS:
  globals()[_name] = _wrap(getattr(_contrib, _name), name=f"contrib.{_name}")
del _name

__all__ = ["CONTRIB_OPTIMIZERS", *CONTRIB_OPTIMIZERS]
