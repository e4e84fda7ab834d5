"""What every definition wrapper shares: a flag it does not change is the wrapped definition's
(per-example gradients, legacy state dicts, constructor-only hyper-parameters, ...), by
construction, so a new flag on `OptimizerDef` reaches every wrapper without a line in it."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import optcore
from optcore import legacy

WRAPPERS = {
  "accumulate": lambda d: optcore.accumulate(d, every=2),
  "ema": lambda d: optcore.ema(d, 0.9),
  "mixed_precision": lambda d: optcore.mixed_precision(d, state_dtype=jnp.bfloat16),
}
INNER = {
  "adam": lambda: optcore.adam(1e-2),
  "legacy-adafactor": lambda: legacy.Adafactor(1e-2),
  "legacy-momentum": lambda: legacy.Momentum(0.1),
  "dpsgd": lambda: optcore.contrib.dpsgd(0.1, l2_norm_clip=1.0, noise_multiplier=0.0, seed=0),
  "multi": lambda: optcore.MultiOptimizer(("w", optcore.adam(1e-2)), ("b", optcore.sgd(0.1))),
}


@pytest.mark.parametrize("inner", sorted(INNER))
@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_wrapper_keeps_every_flag_it_does_not_change(wrapper, inner):
  wrapped_def = INNER[inner]()
  if wrapper == "accumulate" and wrapped_def.per_example_gradients:
    with pytest.raises(TypeError, match="per-example"):
      WRAPPERS[wrapper](wrapped_def)
    return
  opt_def = WRAPPERS[wrapper](wrapped_def)
  changed = type(opt_def).changes
  for flag in optcore.OptimizerDef.FLAGS:
    want = changed.get(flag, getattr(wrapped_def, flag))
    assert getattr(opt_def, flag) == want, flag


@pytest.mark.parametrize("wrapper", ["ema", "mixed_precision"])
def test_per_example_gradients_pass_through_a_wrapper_as_bare_dpsgd_takes_them(wrapper):
  """ema(dpsgd) and mixed_precision(dpsgd) refused the gradients bare dpsgd takes (issue 37)."""
  params = {"w": jnp.ones((3,)), "b": jnp.zeros((2,))}
  per_example = {"w": jnp.arange(12.0).reshape(4, 3) / 10, "b": jnp.ones((4, 2))}
  bare = INNER["dpsgd"]().create(params).apply_gradient(per_example)
  opt = WRAPPERS[wrapper](INNER["dpsgd"]()).create(params).apply_gradient(per_example)
  for name in params:
    np.testing.assert_allclose(opt.target[name], bare.target[name], rtol=1e-6)
  with pytest.raises(optcore.TreeMismatchError, match="'/w'"):
    opt.apply_gradient({"w": jnp.ones((4, 2)), "b": jnp.ones((4, 2))})
