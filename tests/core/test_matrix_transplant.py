"""`optcore.transplant` from AdamW into SOAP and Shampoo: their per-parameter states have no
leaf in Adam's layout (SOAP's moments live in an eigenbasis that does not exist yet,
Shampoo's momenta are sums of grafted updates), so each parameter's state starts anew, whole,
and the report says so leaf by leaf; the step carries over, and the new optimizer then runs
exactly as one created fresh at that step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optcore

PARAMS = {"w": jnp.ones((4, 3)) * 0.1, "b": jnp.zeros(3)}
GRADS = {"w": jnp.arange(12.0).reshape(4, 3) / 12, "b": jnp.ones(3)}


@pytest.mark.parametrize(
  "make",
  [
    lambda: optcore.contrib.soap(3e-3, precondition_frequency=2),
    lambda: optcore.contrib.shampoo(1e-2, 8, start_preconditioning_step=1),
  ],
  ids=["soap", "shampoo"],
)
def test_from_adamw_every_parameter_starts_anew_and_the_report_says_why(make):
  adamw = optcore.adamw(1e-3).create(PARAMS)
  for _ in range(3):
    adamw = adamw.apply_gradient(GRADS)
  moved, report = optcore.transplant(make().create(adamw.target), adamw.state_dict())

  assert [e.path for e in report.kept] == ["step"]
  dropped = {e.path for e in report.dropped}
  assert {"param_states/0/mu/w", "param_states/0/nu/w", "param_states/0/mu/b"} <= dropped
  initialised = {e.path: e.note for e in report.initialised}
  params_state = [p for p in initialised if p.startswith("param_states/") and "count" not in p]
  assert params_state and all(initialised[p] for p in params_state)  # each with its reason
  assert "param_states/count" in initialised

  fresh = make().create(adamw.target)
  assert int(moved.state.step) == 3 and int(fresh.state.step) == 0
  for _ in range(3):
    moved, fresh = moved.apply_gradient(GRADS), fresh.apply_gradient(GRADS)
  jax.tree.map(np.testing.assert_array_equal, moved.target, fresh.target)
