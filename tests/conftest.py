"""Strict JAX for every test: no silent rank promotion.

Strict dtype promotion (jax_numpy_dtype_promotion="strict") stays off: optax
0.2.8 itself mixes int32 step counts with float32 in its bias corrections
(adam, lamb, radam, yogi, ...) and fails under it.
"""

import jax

jax.config.update("jax_numpy_rank_promotion", "raise")
