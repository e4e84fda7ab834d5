"""What a new user meets first (issue 62): a chain given its members one by one, or a factory
in place of a transformation, is answered at construction with the call that works; a group
that selects nothing lists the paths that exist. (The README's commands as written, nox and uv
in a venv that is not on PATH, are what .ci/run runs every session with.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optcore

PARAMS = {"w": jnp.ones(2)}


def test_chain_given_its_members_one_by_one_says_to_pass_one_list():
  expected = r"too many positional arguments; it takes its transformations as one list: chain\(\["
  with pytest.raises(TypeError, match=expected):
    optcore.chain(optax.clip_by_global_norm(1.0), optcore.sgd(0.1))


@pytest.mark.parametrize(
  "members, found",
  [
    (optax.clip_by_global_norm(1.0), "found GradientTransformation"),
    (optcore.sgd(0.1), "found OptaxWrapper"),
  ],
)
def test_chain_of_one_member_not_in_a_list_is_refused_at_construction(members, found):
  with pytest.raises(TypeError, match=rf"one list .*{found}.*wrap it in a list"):
    optcore.chain(members)


def test_chain_of_a_factory_names_its_index_and_says_to_call_it():
  expected = r"transformations\[1\] is <function clip_by_global_norm.*call it, as in optax\."
  with pytest.raises(TypeError, match=expected):
    optcore.chain([optcore.sgd(0.1), optax.clip_by_global_norm])


def test_an_empty_chain_is_refused():
  with pytest.raises(ValueError, match="transformations is empty"):
    optcore.chain([])


def test_a_chain_of_transformations_and_definitions_still_steps():
  opt = optcore.chain([optax.clip_by_global_norm(1.0), optcore.sgd(1.0)]).create(PARAMS)
  moved = opt.apply_gradient({"w": jnp.array([3.0, 4.0])}).target["w"]
  assert jnp.allclose(moved, jnp.array([1.0 - 0.6, 1.0 - 0.8]))


def test_a_group_that_selects_nothing_lists_the_paths_and_a_selector_for_both_namings():
  # Equinox's eqx.nn.MLP names its matrices /layers/0/weight: Flax's 'kernel$' finds none.
  params = {"layers": [{"weight": jnp.ones((2, 2)), "bias": jnp.zeros(2)}]}
  opt_def = optcore.MultiOptimizer((r"kernel$", optcore.adamw(0.1)), (r"bias$", optcore.sgd(0.1)))
  expected = (
    r"selector 0 \('kernel\$'\) matches no parameter.*stay as they are"
    r".*'/layers/0/bias', '/layers/0/weight'.*\(kernel\|weight\)\$"
  )
  with pytest.warns(UserWarning, match=expected):
    opt_def.create(params)
  both = optcore.MultiOptimizer(
    (r"(kernel|weight)$", optcore.adamw(0.1)), (r"bias$", optcore.sgd(0.1))
  )
  both.create(params)  # quiet: warnings are errors in this suite


def test_the_path_list_says_how_many_there_are_past_six():
  params = {f"p{i}": jnp.ones(1) for i in range(9)}
  with pytest.warns(UserWarning, match=r"'/p5', \.\.\. \(9 in all\)"):
    optcore.MultiOptimizer(("nothing", optcore.sgd(0.1)), (".", optcore.sgd(0.1))).create(params)


def _trajectory(opt_def, steps: int = 30):
  """The parameters after ``steps`` jitted steps through the core face and through
  ``as_optax()`` (optax.apply_updates of its updates)."""
  params = {"w": jnp.linspace(-1.0, 1.0, 64).reshape(8, 8)}
  grads = [{"w": jnp.sin(params["w"] * (i + 1))} for i in range(steps)]
  opt = opt_def.create(params)
  core_step = jax.jit(lambda o, g: o.apply_gradient(g))
  tx = opt_def.as_optax()
  p, s = params, tx.init(params)

  @jax.jit
  def optax_step(p, s, g):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  for g in grads:
    opt = core_step(opt, g)
    p, s = optax_step(p, s, g)
  return np.asarray(opt.target["w"]), np.asarray(p["w"])


def test_ema_gives_the_same_bits_through_as_optax_as_in_the_core_face():
  """Issue 62: as_optax() averaged params + (new - params), one ulp off the core's new
  parameters from about step 20; it now averages params + the wrapped optax updates."""
  core, through_optax = _trajectory(optcore.ema(optcore.adamw(1e-2), 0.9))
  np.testing.assert_array_equal(core, through_optax)


def test_accumulate_every_step_rounds_as_optax_multisteps_does():
  """accumulate(adamw, every=1) is optax.MultiSteps(adamw, 1) to the bit (README: what is
  bitwise); MultiSteps' program rounds up to an ulp away from plain adamw's, in optax too."""
  params = {"w": jnp.linspace(-1.0, 1.0, 64).reshape(8, 8)}
  core, _ = _trajectory(optcore.accumulate(optcore.adamw(1e-2), every=1))
  tx = optax.MultiSteps(optax.adamw(1e-2), every_k_schedule=1)
  p, s = params, tx.init(params)

  @jax.jit  # one program, update and apply, as the core face's step is
  def step(p, s, g):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  for i in range(30):
    p, s = step(p, s, {"w": jnp.sin(params["w"] * (i + 1))})
  np.testing.assert_array_equal(core, np.asarray(p["w"]))
