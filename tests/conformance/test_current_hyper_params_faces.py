"""current_hyper_params() in every face of `faces.FACES`: the same values, from
the same schedule, at the same step, under each face's own jit."""

from __future__ import annotations

import jax.numpy as jnp
import optax
import pytest
from faces import FACES

import optcore


def params():
  return {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}


@pytest.mark.parametrize("face", FACES, ids=str)
def test_every_face_reports_the_schedule_at_its_step(face):
  schedule = optax.linear_schedule(0.1, 0.0, 10)
  opt_def = optcore.MultiOptimizer(
    ("kernel", optcore.adamw(schedule, weight_decay=0.01)), ("bias", optcore.sgd(0.05))
  )
  handle = face.create(opt_def, params())
  step = face.jit(face.step)
  for i in range(3):
    values = {k: float(v) for k, v in face.current_hyper_params(handle).items()}
    assert values["0/learning_rate"] == pytest.approx(float(schedule(i)), rel=1e-6)
    assert values["0/weight_decay"] == pytest.approx(0.01)
    assert values["1/learning_rate"] == pytest.approx(0.05)
    handle = step(handle, {"kernel": jnp.ones((2, 3)), "bias": jnp.ones(3)}, {})
