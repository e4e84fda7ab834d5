"""optcore.transplant: an optimizer's state from a state dict written for another
optimizer or other parameters. Kept leaves carry the old numbers exactly, and the
steps after a transplant are raw optax's from the same state (or the published
flax.optim algorithm's, for an old flax.optim checkpoint)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from legacy_reference import adam_step, momentum_step
from tree_testing import assert_trees_equal

import optcore
from optcore import legacy


def make_params() -> dict:
  key = jax.random.key(0)
  return {
    "dense": {
      "kernel": jax.random.normal(key, (4, 3)),
      "bias": jax.random.normal(jax.random.fold_in(key, 1), (3,)),
    }
  }


def grads_at(i: int, params) -> dict:
  key = jax.random.key(100 + i)
  return jax.tree.map(lambda p: jax.random.normal(jax.random.fold_in(key, p.size), p.shape), params)


def trained(opt, steps=3):
  for i in range(steps):
    opt = opt.apply_gradient(grads_at(i, opt.target))
  return opt


def paths(entries):
  return [entry.path for entry in entries]


def test_adam_state_moves_into_adamw_and_its_steps_are_raw_optaxs_from_that_state():
  params = make_params()
  old = trained(optcore.adam(1e-2).create(params))
  new, report = optcore.transplant(
    optcore.adamw(1e-2, weight_decay=0.1).create(params), old.state_dict()
  )
  assert report.initialised == () and report.dropped == ()
  assert paths(report.kept)[:2] == ["step", "param_states/0/count"]
  assert_trees_equal(new.state.param_states[0], old.state.param_states[0])
  assert int(new.state.step) == 3
  # Raw optax: adamw's state with adam's ScaleByAdamState put in by hand.
  tx = optax.adamw(1e-2, weight_decay=0.1)
  state = tx.init(params)
  state = (old.state.param_states[0], *state[1:])
  p = params

  @jax.jit
  def by_hand(p, state, g):
    updates, state = tx.update(g, state, p)
    return optax.apply_updates(p, updates), state

  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(3, 6):
    p, state = by_hand(p, state, grads_at(i, p))
    new = step(new, grads_at(i, new.target))
  assert_trees_equal(new.target, p)
  assert_trees_equal(new.state.param_states, state)


def flax_optim_adam(params, state, grads, t):
  """flax.optim's Adam (the published algorithm, float64) on every parameter."""
  new_params, new_state = {}, {}
  for name in params:
    if isinstance(params[name], dict):
      new_params[name], new_state[name] = flax_optim_adam(params[name], state[name], grads[name], t)
    else:
      new_params[name], new_state[name] = adam_step(params[name], state[name], grads[name], t, 1e-2)
  return new_params, new_state


def test_a_flax_optim_adam_checkpoint_continues_under_optax_adam_as_flax_optim_did():
  """An old checkpoint, written by the published algorithm (float64 NumPy, cast as
  flax.optim stored it): optax's adam continues it where flax.optim's Adam would."""
  params = jax.tree.map(np.asarray, make_params())
  state = jax.tree.map(
    lambda p: {"grad_ema": np.zeros_like(p), "grad_sq_ema": np.zeros_like(p)}, params
  )
  reference = params
  for t in range(1, 4):
    g = jax.tree.map(np.asarray, grads_at(t - 1, params))
    reference, state = flax_optim_adam(reference, state, g, t)
  f32 = lambda tree: jax.tree.map(lambda x: np.asarray(x, np.float32), tree)
  checkpoint = {
    "target": f32(reference),
    "state": {"step": np.int64(3), "param_states": f32(state)},
  }

  opt, report = optcore.transplant(optcore.adam(1e-2).create(f32(reference)), checkpoint)
  assert report.initialised == () and report.dropped == ()
  kept = {entry.path: entry for entry in report.kept}
  assert kept["param_states/0/count"].source == "step"
  assert kept["param_states/0/mu/dense/kernel"].source == "param_states/dense/kernel/grad_ema"
  assert kept["param_states/0/nu/dense/bias"].source == "param_states/dense/bias/grad_sq_ema"
  assert int(opt.state.param_states[0].count) == 3  # int64 read as the int32 count
  for t in range(4, 7):
    g = jax.tree.map(np.asarray, grads_at(t - 1, params))
    reference, state = flax_optim_adam(reference, state, g, t)
    opt = opt.apply_gradient(jax.tree.map(jnp.asarray, g))
  jax.tree.map(
    lambda a, e: np.testing.assert_allclose(a, e, rtol=2e-6, atol=1e-7), opt.target, reference
  )


def test_momentum_moves_between_optax_sgd_and_flax_optims_momentum_both_ways():
  params = make_params()
  old = trained(optcore.sgd(0.1, momentum=0.9).create(params))
  moved, report = optcore.transplant(
    legacy.Momentum(0.1, beta=0.9).create(params), old.state_dict()
  )
  assert report.initialised == () and report.dropped == ()
  assert_trees_equal(
    jax.tree.map(
      lambda s: s.momentum, moved.state.param_states, is_leaf=lambda s: hasattr(s, "momentum")
    ),
    old.state.param_states[0].trace,
  )
  back, report = optcore.transplant(
    optcore.sgd(0.1, momentum=0.9).create(params), moved.state_dict()
  )
  assert report.initialised == () and report.dropped == ()
  assert_trees_equal(back.state, old.state)
  # One more step of flax.optim's Momentum, by the published algorithm.
  g = grads_at(9, params)
  stepped = moved.apply_gradient(g)
  expected = momentum_step(
    np.asarray(params["dense"]["bias"], np.float64),
    {"momentum": np.asarray(old.state.param_states[0].trace["dense"]["bias"], np.float64)},
    np.asarray(g["dense"]["bias"], np.float64),
    4,
    0.1,
  )[0]
  np.testing.assert_allclose(stepped.target["dense"]["bias"], expected, rtol=1e-6)


def test_a_new_head_is_initialised_an_old_one_dropped_a_reshaped_leaf_reported_with_both_shapes():
  params = make_params()
  old_params = {**params, "old_head": {"kernel": jnp.ones((3, 2))}, "proj": jnp.ones((3, 5))}
  old = trained(optcore.adam(1e-2).create(old_params))
  new_params = {**params, "new_head": {"kernel": jnp.ones((3, 7))}, "proj": jnp.ones((3, 6))}
  fresh = optcore.adam(1e-2).create(new_params)
  new, report = optcore.transplant(fresh, old.state_dict())

  initialised = {entry.path: entry for entry in report.initialised}
  assert set(initialised) == {
    "param_states/0/count",
    "param_states/0/mu/new_head/kernel",
    "param_states/0/nu/new_head/kernel",
    "param_states/0/mu/proj",
    "param_states/0/nu/proj",
  }
  assert "no state for" in initialised["param_states/0/mu/new_head/kernel"].note
  proj = initialised["param_states/0/mu/proj"]
  assert proj.source == "param_states/0/mu/proj"
  assert proj.note == "shape (3, 5) in the state dict, (3, 6) here"
  # Adam's count counts for the new head's moments too: kept over moments that start
  # from zero it would skip their bias correction, so it starts anew with them.
  assert initialised["param_states/0/count"].note == "4 of the 8 leaves it counts for start anew"
  assert paths(report.dropped) == [
    "param_states/0/count",
    "param_states/0/mu/old_head/kernel",
    "param_states/0/mu/proj",
    "param_states/0/nu/old_head/kernel",
    "param_states/0/nu/proj",
  ]
  # Kept: the values; initialised: as create made them.
  state = new.state.param_states[0]
  assert_trees_equal(state.mu["dense"], old.state.param_states[0].mu["dense"])
  assert_trees_equal(state.nu["new_head"], fresh.state.param_states[0].nu["new_head"])
  assert_trees_equal(state.mu["proj"], fresh.state.param_states[0].mu["proj"])
  assert int(state.count) == 0 and int(new.state.step) == 3

  table = str(report)
  assert table.splitlines()[0] == "transplant: 5 kept, 5 initialised, 5 dropped"
  assert "  initialised  param_states/0/mu/proj" in table
  assert "shape (3, 5) in the state dict, (3, 6) here" in table


def test_a_count_is_kept_only_with_the_state_it_counts_for():
  """Adam's count without its moments would skip their bias correction: a first
  update of lr / sqrt(1 - b2) instead of lr."""
  old = trained(optcore.adam(1e-2).create({"a": jnp.ones(3)}))
  new, report = optcore.transplant(optcore.adam(1e-2).create({"b": jnp.ones(3)}), old.state_dict())
  assert paths(report.kept) == ["step"]
  count = next(e for e in report.initialised if e.path == "param_states/0/count")
  assert count.note == "none of the state it counts for was kept"
  assert int(new.state.param_states[0].count) == 0


def test_one_parameters_state_is_kept_whole_or_not_at_all():
  """Muon's momentum is a mu too, but adamw's mu beside a nu that starts from zero
  would step by mu / sqrt(nu) ~ 30 times too far: the matrices' state starts anew,
  the Adam branch's (the vector's mu and nu, its count) moves in whole."""
  params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
  old = trained(optcore.contrib.muon(1e-2).create(params))
  new, report = optcore.transplant(optcore.adamw(1e-2).create(params), old.state_dict())
  initialised = {e.path: e.note for e in report.initialised}
  assert (
    initialised["param_states/0/mu/w"] == "kept alone, it would not match the 'nu' that starts anew"
  )
  assert initialised["param_states/0/nu/w"] == "the state dict has no 'nu' for this parameter"
  assert initialised["param_states/0/count"] == "2 of the 4 leaves it counts for start anew"
  kept = {e.path: e.source for e in report.kept}
  assert set(kept) == {"step", "param_states/0/mu/b", "param_states/0/nu/b"}
  assert int(new.state.param_states[0].count) == 0


def test_bfloat16_state_is_cast_into_float32_state_and_reported():
  params = make_params()
  low = optcore.mixed_precision(optcore.adam(1e-2), state_dtype=jnp.bfloat16)
  old = trained(low.create(params))
  new, report = optcore.transplant(optcore.adam(1e-2).create(params), old.state_dict())
  assert report.initialised == () and report.dropped == ()
  mu = next(e for e in report.kept if e.path == "param_states/0/mu/dense/kernel")
  assert mu.source == "param_states/inner/0/mu/dense/kernel"
  assert mu.note == "cast bfloat16 to float32"
  expected = old.state.param_states.inner[0].mu["dense"]["kernel"].astype(jnp.float32)
  np.testing.assert_array_equal(new.state.param_states[0].mu["dense"]["kernel"], expected)


@pytest.mark.parametrize(
  "make",
  [
    lambda: optcore.adam(1e-2),
    lambda: optcore.accumulate(optcore.adam(1e-2), every=3),
    lambda: optcore.ema(optcore.sgd(0.1, momentum=0.9), decay=0.9),
    lambda: legacy.Adam(1e-2),
    lambda: optcore.t5x.Adafactor(1e-2),
    lambda: optcore.MultiOptimizer(
      (r"kernel", optcore.adam(1e-2)), (r"bias", legacy.Momentum(0.1))
    ),
  ],
  ids=["adam", "accumulate", "ema", "legacy-adam", "t5x-adafactor", "multi"],
)
def test_into_the_same_optimizer_a_transplant_is_a_restore(make):
  params = make_params()
  old = trained(make().create(params), steps=4)  # mid-accumulation for every=3
  new, report = optcore.transplant(make().create(params), old.state_dict())
  assert report.initialised == () and report.dropped == ()
  assert all(entry.source == entry.path and not entry.note for entry in report.kept)
  # The state a restore reads (the target stays the optimizer's own).
  assert_trees_equal(new.state, make().create(params).restore_state(old.state_dict()).state)


def test_adam_moves_into_accumulate_and_accumulations_counter_starts_anew():
  params = make_params()
  old = trained(optcore.adam(1e-2).create(params))
  new, report = optcore.transplant(
    optcore.accumulate(optcore.adam(1e-2), every=2).create(params), old.state_dict()
  )
  assert report.dropped == ()
  assert set(paths(report.initialised)) == {
    "param_states/accumulated/dense/bias",
    "param_states/accumulated/dense/kernel",
    "param_states/mini_step",
  }
  assert_trees_equal(new.state.param_states.inner[0], old.state.param_states[0])
  assert int(new.state.param_states.mini_step) == 0


def test_the_state_dict_of_a_face_without_a_target_transplants():
  params = make_params()
  old = trained(optcore.adam(1e-2).create(params))
  written = optcore.adapter.state_dict(old.optimizer_def, old.state)
  assert set(written) == {"state"}
  _, report = optcore.transplant(optcore.nadam(1e-2).create(params), written)
  assert report.initialised == () and report.dropped == ()


def test_the_optimizer_given_is_untouched():
  params = make_params()
  old = trained(optcore.adam(1e-2).create(params))
  fresh = optcore.adam(1e-2).create(params)
  before = jax.tree.map(np.array, fresh)
  optcore.transplant(fresh, old.state_dict())
  assert_trees_equal(fresh, before)


def test_kept_leaves_land_where_the_optimizer_placed_its_state():
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
  params = {"w": jnp.ones((4, 2))}
  old = trained(optcore.adam(1e-2).create(params))
  fresh = optcore.adam(1e-2).create(params)
  fresh = fresh.replace(
    state=jax.tree.map(lambda x: jax.device_put(x, sharding) if x.ndim else x, fresh.state)
  )
  new, _ = optcore.transplant(fresh, old.state_dict())
  assert new.state.param_states[0].mu["w"].sharding.memory_kind == "pinned_host"
  np.testing.assert_array_equal(
    new.state.param_states[0].mu["w"], old.state.param_states[0].mu["w"]
  )


def test_the_table_shows_a_dozen_rows_per_category_and_counts_the_rest():
  params = {f"w{i:02d}": jnp.ones(2) for i in range(20)}
  old = trained(optcore.sgd(0.1, momentum=0.9).create(params))
  _, report = optcore.transplant(optcore.sgd(0.1, momentum=0.9).create(params), old.state_dict())
  lines = str(report).splitlines()
  assert lines[0] == "transplant: 21 kept, 0 initialised, 0 dropped"
  assert lines[-1].split() == ["kept", "...", "and", "9", "more"]
  assert len(lines) == 1 + 12 + 1


def test_wrong_inputs_are_named():
  opt = optcore.adam(1e-2).create(make_params())
  with pytest.raises(
    optcore.StateDictError,
    match="expected a state dict with a 'state' dict, found a dict with keys \\['params'\\]",
  ):
    optcore.transplant(opt, {"params": {}})
  with pytest.raises(
    TypeError, match=r"expected an optimizer of an optcore face .* found OptaxWrapper"
  ):
    optcore.transplant(optcore.adam(1e-2), opt.state_dict())
  with pytest.raises(TypeError, match="holds its parameters"):
    optcore.transplant(opt, opt.state_dict(), make_params())


def test_list_shaped_parameters_move_their_count_by_role_as_dicts_do():
  """With parameters [w, b] the path param_states/0/count was read as parameter 0's state, so
  adam's count (5) was kept beside a new parameter's zero moments: its first update was 2.5x a
  fresh adam's (issue 37). The count is a count, in a list as in a dict."""
  shapes = [(3,), (2,)]
  as_list = [jnp.ones(s) for s in shapes]
  as_dict = {"a": jnp.ones(shapes[0]), "b": jnp.ones(shapes[1])}
  reports = []
  for old_params, new_params in [
    (as_list, [*as_list, jnp.ones(4)]),
    (as_dict, {**as_dict, "c": jnp.ones(4)}),
  ]:
    old = optcore.adam(1e-2).create(old_params)
    for _ in range(5):
      old = old.apply_gradient(jax.tree.map(jnp.ones_like, old_params))
    new, report = optcore.adam(1e-2).create(new_params).transplant(old.state_dict())
    assert int(new.state.param_states[0].count) == 0  # restarted with the new moments
    reports.append([(entry.path.split("/")[-1] == "count", entry.note) for entry in report.kept])
    reports.append(sorted(e.path.rsplit("/", 1)[0] for e in report.initialised))
  assert reports[0] == reports[2]
  assert reports[1] == reports[3]  # the count and the new parameter's mu and nu, in both
