"""Learning-rate schedules optax does not have: warmup-stable-decay with the cooldown shapes
the large trainers use (see `warmup_stable_decay`). Every one is an optax schedule
(``count -> rate``), for ``learning_rate=`` or a live override.

Example:
  >>> import jax.numpy as jnp
  >>> import optcore
  >>> lr = optcore.schedules.warmup_stable_decay(1e-3, total_steps=1000, decay_shape='1-sqrt')
  >>> opt = optcore.adamw(lr).create({'w': jnp.ones(2)})
  >>> round(float(optcore.current_hyper_params(opt)['learning_rate']), 6)  # no warm-up: the peak
  0.001
"""

from optcore._src.ground.schedules import DECAY_SHAPES as DECAY_SHAPES
from optcore._src.ground.schedules import warmup_stable_decay as warmup_stable_decay

__all__ = ["DECAY_SHAPES", "warmup_stable_decay"]
