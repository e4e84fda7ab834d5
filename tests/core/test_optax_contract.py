"""``as_optax()`` keeps optax's contract for ``update``'s keywords (issue 49): a hyper-parameter
is this step's override; every other keyword goes on to the transformation, which uses what it
reads and ignores the rest, as optax's own transformations do inside an ``optax.chain``. The
gradients are checked as every face checks them. optax's own suite, every factory rebound to
optcore's ``as_optax()``, is run by ``nox -s optax_suite``; these are its cases in small.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest
from optimizer_catalogue import CASES, Case, grads_and_extra, make_params
from tree_testing import assert_trees_equal

import optcore

PARAMS = {"w": jnp.arange(1.0, 4.0), "b": jnp.ones(())}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_every_optimizer_takes_a_keyword_it_does_not_use_as_optax_does(case: Case):
  """optax's test_optimizers_accept_extra_args over the catalogue: beside the arguments it needs
  (polyak's value, lbfgs' line search, sophia's obj_fn), a keyword nothing reads is ignored, as
  raw optax ignores it; where optax's own transformation refuses it (lbfgs' line search and
  sam check every keyword is consumed), optcore's refuses it too."""
  unknown = {"unexpected_extra_args_your_optimizer_doesnt_expect": 1}
  params = make_params()
  grads, extra = grads_and_extra(case, params)

  def run(tx, **kw):
    return jax.jit(lambda g, s, p: tx.update(g, s, p, **extra, **kw))(
      grads, tx.init(params), params
    )

  raw = optax.with_extra_args_support(case.optax_factory()(**case.optax_kwargs()))
  ours = case.optcore_factory()(**case.optcore_kwargs()).as_optax()
  try:
    run(raw, **unknown)
  except TypeError:
    with pytest.raises(TypeError):
      run(ours, **unknown)
    return
  assert_trees_equal(run(ours, **unknown)[0], run(ours)[0])


def test_a_chain_hands_every_member_every_keyword():
  """A member that needs value (polyak's step size) beside optcore's adam, as optax.chain does:
  the keyword reaches polyak and adam ignores it."""
  tx = optax.chain(optcore.adam(1e-2).as_optax(), optax.scale_by_polyak(max_learning_rate=1.0))
  raw = optax.chain(optax.adam(1e-2), optax.scale_by_polyak(max_learning_rate=1.0))
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  value = jnp.asarray(2.5)
  got, _ = jax.jit(tx.update)(grads, tx.init(PARAMS), PARAMS, value=value)
  want, _ = jax.jit(raw.update)(grads, raw.init(PARAMS), PARAMS, value=value)
  assert_trees_equal(got, want)


def test_skip_bad_steps_judges_the_loss_given_as_value():
  """The form skip_bad_steps' own error advises: update(..., value=loss)."""
  tx = optcore.skip_bad_steps(optcore.sgd(0.1), window=4, warmup=2, watch="loss").as_optax()
  state = tx.init(PARAMS)
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  step = jax.jit(tx.update)
  for loss in (1.0, 1.1, 0.9, 1.0):
    updates, state = step(grads, state, PARAMS, value=jnp.asarray(loss))
    assert float(updates["b"]) == pytest.approx(-0.1)
  updates, state = step(grads, state, PARAMS, value=jnp.asarray(1e6))  # a spike: skipped
  assert float(updates["b"]) == 0.0
  with pytest.raises(TypeError, match=r"^skip_bad_steps\(sgd\) with watch='loss' judges the loss"):
    tx.update(grads, state, PARAMS)


def test_a_hyper_parameter_keyword_is_this_steps_override_and_a_near_miss_warns():
  tx = optcore.sgd(0.1).as_optax()
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  state = tx.init(PARAMS)
  updates, _ = tx.update(grads, state, PARAMS, learning_rate=0.5)
  assert float(updates["b"]) == -0.5
  with pytest.warns(UserWarning, match=r"'learnin_rate' is no hyper-parameter.*'learning_rate'"):
    updates, _ = tx.update(grads, state, PARAMS, learnin_rate=0.5)
  assert float(updates["b"]) == pytest.approx(-0.1)


@pytest.mark.parametrize(
  "opt_def",
  [
    optcore.ema(optcore.sgd(0.1), 0.9),
    optcore.accumulate(optcore.sgd(0.1), 2),
    optcore.legacy.Momentum(0.1),
    optcore.adam(0.1),
  ],
  ids=["ema", "accumulate", "legacy", "optax"],
)
def test_gradients_of_the_wrong_shape_are_refused_naming_the_path(opt_def):
  tx = opt_def.as_optax()
  state = tx.init(PARAMS)
  wrong = {"w": jnp.ones(4), "b": jnp.ones(())}
  with pytest.raises(optcore.TreeMismatchError, match=r"shape \(4,\) at '/w'.*\(3,\)"):
    tx.update(wrong, state, PARAMS)


def test_a_definition_that_reads_no_extra_argument_is_given_none():
  """flax.optim's Momentum takes no extra update arguments: as_optax drops them for it, as an
  optax transformation that needs none ignores them (its own apply_gradient refuses them)."""
  tx = optcore.legacy.Momentum(0.1).as_optax()
  grads = jax.tree.map(jnp.ones_like, PARAMS)
  state = tx.init(PARAMS)
  plain, _ = tx.update(grads, state, PARAMS)
  got, _ = tx.update(grads, state, PARAMS, value=1.0, ignored_kwarg=2)
  assert_trees_equal(got, plain)
  opt = optcore.legacy.Momentum(0.1).create(PARAMS)
  with pytest.raises(TypeError, match="takes no extra update arguments"):
    opt.apply_gradient(grads, extra_args={"value": 1.0})


def test_optcore_holds_the_optax_factories_it_wrapped(monkeypatch):
  """optax's own suite run against optcore rebinds optax.contrib.muon to optcore's: optcore's
  muon called the module attribute and recursed; it holds the factory it wrapped at import."""
  import optax.contrib

  def rebound(*args, **kwargs):
    raise AssertionError("optcore reached the rebound optax.contrib.muon")

  monkeypatch.setattr(optax.contrib, "muon", rebound)
  monkeypatch.setattr(optax, "adam", rebound)
  tx = optcore.contrib.muon(0.01).as_optax()
  params = {"w": jnp.ones((3, 4))}
  tx.update(params, tx.init(params), params)
  optcore.adam(0.1).create(params)
