"""MultiOptimizer: groups by selector, frozen rest, flax.optim's override rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P
from optimizer_catalogue import loss_fn, make_params
from tree_testing import assert_trees_equal

import optcore


def kernel_label(params):
  return jax.tree_util.tree_map_with_path(
    lambda path, _: "kernel" if "kernel" in jax.tree_util.keystr(path) else "rest", params
  )


def test_equals_optax_partition_bitwise():
  params = make_params()
  multi = optcore.MultiOptimizer(
    (r"/kernel$", optcore.adamw(1e-2, weight_decay=0.1)),
    (lambda path, _: not path.endswith("/kernel"), optcore.sgd(0.05, momentum=0.9)),
  )
  tx = optax.partition(
    {"kernel": optax.adamw(1e-2, weight_decay=0.1), "rest": optax.sgd(0.05, momentum=0.9)},
    kernel_label(params),
  )
  opt = multi.create(params)
  state, expected = tx.init(params), params
  step_ours = jax.jit(lambda o: o.apply_gradient(jax.grad(loss_fn)(o.target)))

  @jax.jit
  def step_raw(p, s):
    updates, s = tx.update(jax.grad(loss_fn)(p), s, p)
    return optax.apply_updates(p, updates), s

  for _ in range(5):
    opt = step_ours(opt)
    expected, state = step_raw(expected, state)
  assert_trees_equal(opt.target, expected)


def test_unselected_leaves_are_frozen_with_none_state():
  params = make_params()
  opt = optcore.MultiOptimizer((r"/dense/kernel$", optcore.adam(0.1))).create(params)
  mu = opt.state.param_states[0][0].mu
  assert mu["dense"]["bias"] is None and mu["scale"] is None
  assert mu["dense"]["kernel"].shape == (4, 3)
  moved = opt.apply_gradient(jax.grad(loss_fn)(params))
  np.testing.assert_array_equal(moved.target["scale"], params["scale"])
  np.testing.assert_array_equal(moved.target["dense"]["bias"], params["dense"]["bias"])
  assert not np.array_equal(moved.target["dense"]["kernel"], params["dense"]["kernel"])


def test_focus_optimises_only_the_focus():
  params = make_params()
  opt = optcore.sgd(0.1).create(params, focus=optcore.ModelParamTraversal(lambda p, _: "bias" in p))
  assert isinstance(opt.optimizer_def, optcore.MultiOptimizer)
  assert len(opt.optimizer_def.hyper_params) == 1
  moved = opt.apply_gradient(jax.grad(loss_fn)(params))
  np.testing.assert_array_equal(moved.target["dense"]["kernel"], params["dense"]["kernel"])
  assert not np.array_equal(moved.target["dense"]["bias"], params["dense"]["bias"])


def test_both_spellings_and_nesting():
  params = make_params()
  inner = optcore.MultiOptimizer((r"kernel", optcore.sgd(0.1)), (r"bias", optcore.sgd(0.2)))
  a = optcore.MultiOptimizer([(r"/dense/", inner), (r"/scale", optcore.sgd(0.3))])
  b = optcore.MultiOptimizer(
    (r"/dense/kernel", optcore.sgd(0.1)),
    (r"/dense/bias", optcore.sgd(0.2)),
    (r"/scale", optcore.sgd(0.3)),
  )
  grads = jax.grad(loss_fn)(params)
  assert_trees_equal(
    a.create(params).apply_gradient(grads).target, b.create(params).apply_gradient(grads).target
  )


def test_overlapping_selectors_name_the_paths():
  multi = optcore.MultiOptimizer((r"dense", optcore.sgd(0.1)), (r"kernel", optcore.sgd(0.2)))
  with pytest.raises(
    optcore.SelectorError, match=r"overlap at \['/dense/kernel \(selectors 0 and 1\)'\]"
  ):
    multi.create(make_params())


def test_a_selector_that_matches_nothing_warns():
  multi = optcore.MultiOptimizer((r"dense", optcore.sgd(0.1)), (r"nothing_here", optcore.sgd(0.2)))
  with pytest.warns(UserWarning, match=r"selector 1 \('nothing_here'\) matches no parameter"):
    multi.create(make_params())


def test_keyword_overrides_go_to_groups_that_have_them():
  params = make_params()
  grads = jax.grad(loss_fn)(params)
  multi = optcore.MultiOptimizer((r"kernel", optcore.sgd(0.1)), (r"bias|scale", optcore.adam(0.1)))
  opt = multi.create(params)
  frozen = opt.apply_gradient(grads, learning_rate=0.0)
  assert_trees_equal(frozen.target, params)
  # b1 only exists in adam: sgd is left alone, adam takes it.
  hp = opt.optimizer_def.update_hyper_params(b1=0.5)
  assert hp[0] == multi.sub_optimizers[0].hyper_params and hp[1].b1 == 0.5
  with pytest.raises(TypeError, match=r"no sub-optimizer has the hyper-parameter\(s\) \['lr'\]"):
    opt.apply_gradient(grads, lr=0.1)


def test_hyper_params_list_freezes_one_group():
  params = make_params()
  grads = jax.grad(loss_fn)(params)
  opt = optcore.MultiOptimizer(
    (r"kernel", optcore.sgd(0.1)), (r"bias|scale", optcore.sgd(0.1))
  ).create(params)
  hp = opt.optimizer_def.hyper_params
  step = jax.jit(lambda o, h: o.apply_gradient(grads, hyper_params=h))
  moved = step(opt, [hp[0], hp[1].replace(learning_rate=jnp.float32(0.0))])
  np.testing.assert_array_equal(moved.target["scale"], params["scale"])
  assert not np.array_equal(moved.target["dense"]["kernel"], params["dense"]["kernel"])
  with pytest.raises(TypeError, match=r"one entry per group \(2\), got 1"):
    opt.apply_gradient(grads, hyper_params=[hp[0]])


def test_state_dict_round_trip_and_a_different_grouping_fails_cleanly():
  params = make_params()
  grads = jax.grad(loss_fn)(params)
  multi = optcore.MultiOptimizer(
    (r"kernel", optcore.adam(0.1)), (r"bias|scale", optcore.sgd(0.1, momentum=0.9))
  )
  trained = multi.create(params).apply_gradient(grads).apply_gradient(grads)
  restored = multi.create(params).restore_state(trained.state_dict())
  assert_trees_equal(restored.state, trained.state)
  assert_trees_equal(restored.target, trained.target)
  other = optcore.MultiOptimizer(
    (r"kernel|bias", optcore.adam(0.1)), (r"scale", optcore.sgd(0.1, momentum=0.9))
  )
  fresh = other.create(params)
  before = jax.tree.map(np.asarray, fresh.state_dict())
  with pytest.raises(
    optcore.StateDictError, match=r"at 'state/param_states/0/0/mu/dense/bias': expected"
  ):
    fresh.restore_state(trained.state_dict())
  assert_trees_equal(jax.tree.map(np.asarray, fresh.state_dict()), before)


def test_per_parameter_definitions_work_as_sub_optimizers():
  class Sign(optcore.OptimizerDef):
    def __init__(self, learning_rate=0.1):
      super().__init__(optcore.HyperParams(learning_rate=learning_rate))

    def init_param_state(self, param):
      return ()

    def apply_param_gradient(self, step, hyper_params, param, state, grad):
      return param - hyper_params.learning_rate * jnp.sign(grad), state

  params = make_params()
  grads = jax.grad(loss_fn)(params)
  opt = optcore.MultiOptimizer((r"kernel", Sign(0.5)), (r"bias", optcore.sgd(0.1))).create(params)
  opt = opt.apply_gradient(grads, learning_rate=0.25)
  np.testing.assert_allclose(
    opt.target["dense"]["kernel"],
    params["dense"]["kernel"] - 0.25 * jnp.sign(grads["dense"]["kernel"]),
  )
  assert opt.state.param_states[0]["scale"] is None


def test_equal_definitions_with_string_selectors_do_not_retrace():
  traces = []

  @jax.jit
  def step(opt, grads):
    traces.append(1)
    return opt.apply_gradient(grads)

  params = make_params()
  grads = jax.grad(loss_fn)(params)
  for _ in range(3):
    multi = optcore.MultiOptimizer(
      (r"kernel", optcore.adam(1e-3)), (r"bias|scale", optcore.sgd(0.1))
    )
    step(multi.create(params), grads)
  assert len(traces) == 1


def test_bad_pairs_are_a_type_error():
  with pytest.raises(TypeError, match=r"takes \(selector, OptimizerDef\) pairs; argument 0 is"):
    optcore.MultiOptimizer((r"kernel", optax.adam(1e-3)))


def optax_loop(tx, params, steps):
  @jax.jit
  def step(p, s):
    updates, s = tx.update(jax.grad(loss_fn)(p), s, p)
    return optax.apply_updates(p, updates), s

  state = tx.init(params)
  for _ in range(steps):
    params, state = step(params, state)
  return params


def two_groups():
  return optcore.MultiOptimizer(
    (r"/kernel$", optcore.adamw(1e-2, weight_decay=0.1)), (r"/bias$", optcore.lion(1e-3))
  )


def test_as_optax_equals_optax_partition_and_apply_gradient_bitwise():
  params = make_params()

  def label(path, _):
    name = jax.tree_util.keystr(path)
    return "k" if name.endswith("['kernel']") else "b" if name.endswith("['bias']") else "f"

  labels = jax.tree_util.tree_map_with_path(label, params)
  reference = optax.partition(
    {"k": optax.adamw(1e-2, weight_decay=0.1), "b": optax.lion(1e-3), "f": optax.set_to_zero()},
    labels,
  )
  ours = optax_loop(two_groups().as_optax(), params, 5)
  assert_trees_equal(ours, optax_loop(reference, params, 5))
  opt = two_groups().create(params)
  step = jax.jit(lambda o: o.apply_gradient(jax.grad(loss_fn)(o.target)))
  for _ in range(5):
    opt = step(opt)
  assert_trees_equal(ours, opt.target)


def test_as_optax_of_a_wrapped_optimizer_is_the_optax_transformation():
  tx = optax.adam(1e-3)
  exported = optcore.OptaxWrapper(tx).as_optax()
  params = make_params()
  state = tx.init(params)
  # Without keywords its update is optax's own program; init only unboxes nnx Variables.
  assert str(jax.make_jaxpr(exported.update)(params, state, params)) == str(
    jax.make_jaxpr(tx.update)(params, state, params)
  )
  assert_trees_equal(exported.init(params), state)
  assert_trees_equal(
    optax_loop(optcore.adam(1e-3).as_optax(), make_params(), 3),
    optax_loop(optax.adam(1e-3), make_params(), 3),
  )


def test_as_optax_of_a_per_parameter_definition():
  class Momentum(optcore.OptimizerDef):
    def __init__(self, learning_rate=0.1, beta=0.9):
      super().__init__(optcore.HyperParams(learning_rate=learning_rate, beta=beta))

    def init_param_state(self, param):
      return jnp.zeros_like(param)

    def apply_param_gradient(self, step, hyper_params, param, state, grad):
      momentum = hyper_params.beta * state + grad
      return param - hyper_params.learning_rate * momentum, momentum

  params = make_params()
  via_optax = optax_loop(Momentum().as_optax(), params, 4)
  opt = Momentum().create(params)
  for _ in range(4):
    opt = opt.apply_gradient(jax.grad(loss_fn)(opt.target))
  for a, b in zip(jax.tree.leaves(via_optax), jax.tree.leaves(opt.target), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)  # p + (new - p) rounds
  tx = Momentum().as_optax()
  with pytest.raises(ValueError, match=r"params must be provided: Momentum.*new - old"):
    tx.update(params, tx.init(params))


# The state's layout: flax.optim's one tree for per-parameter groups.


def per_parameter_params():
  return {
    "encoder": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)},
    "head": jnp.ones(3),
    "frozen": jnp.full(2, 7.0),
  }


def test_per_parameter_groups_share_one_parameter_shaped_state_tree():
  params = per_parameter_params()
  opt_def = optcore.MultiOptimizer(
    (r"kernel", optcore.legacy.Adam(0.1)), (r"bias|head", optcore.legacy.Momentum(0.1))
  )
  assert opt_def.per_parameter_state
  optimizer = opt_def.create(params)
  states = optimizer.state.param_states
  assert sorted(states) == ["encoder", "frozen", "head"] and states["frozen"] is None
  assert isinstance(states["encoder"]["kernel"], optcore.legacy.AdamParamState)
  assert isinstance(states["head"], optcore.legacy.MomentumParamState)
  grads = jax.tree.map(jnp.ones_like, params)
  stepped = jax.jit(lambda o, g: o.apply_gradient(g))(optimizer, grads)
  # Each leaf moves as its own group's definition alone moves it.
  alone = optcore.legacy.Momentum(0.1).create({"head": params["head"]})
  alone = alone.apply_gradient({"head": grads["head"]})
  np.testing.assert_array_equal(stepped.target["head"], alone.target["head"])
  np.testing.assert_array_equal(stepped.target["frozen"], params["frozen"])
  restored = opt_def.create(params).restore_state(stepped.state_dict())
  assert_trees_equal(restored, stepped)
  axes = opt_def.derive_logical_axes(
    optimizer,
    {"encoder": {"kernel": P("embed", "mlp"), "bias": P("mlp")}, "head": P("mlp"), "frozen": P()},
  )
  assert axes.state.param_states["encoder"]["kernel"].grad_ema == P("embed", "mlp")
  assert axes.state.param_states["frozen"] is None


def test_a_group_wrapping_optax_keeps_one_state_per_group():
  opt_def = optcore.MultiOptimizer(
    (r"kernel", optcore.adam(0.1)), (r"bias", optcore.legacy.Momentum(0.1))
  )
  assert not opt_def.per_parameter_state
  states = opt_def.create(per_parameter_params()).state.param_states
  assert isinstance(states, tuple) and len(states) == 2
  assert states[1]["head"] is None and states[1]["encoder"]["bias"].momentum.shape == (3,)


def test_t5xs_single_sequence_of_pairs_is_accepted():
  pairs = ((r"kernel", optcore.legacy.Adam(0.1)), (r"bias", optcore.legacy.Momentum(0.1)))
  assert optcore.MultiOptimizer(pairs) == optcore.MultiOptimizer(*pairs)
  assert (
    optcore.MultiOptimizer(list(pairs)).sub_optimizers
    == optcore.MultiOptimizer(*pairs).sub_optimizers
  )
  single = optcore.MultiOptimizer((r"kernel", optcore.legacy.Adam(0.1)))  # one pair, not a sequence
  assert len(single.sub_optimizers) == 1


def test_overlapping_selectors_start_with_flax_optims_message():
  opt_def = optcore.MultiOptimizer((r"encoder", optcore.sgd(0.1)), (r"kernel", optcore.sgd(0.1)))
  with pytest.raises(ValueError, match=r"^Multiple optimizers match the same leaves : \{") as e:
    opt_def.create(per_parameter_params())
  assert "'kernel': [0, 1]" in str(e.value) and "/encoder/kernel (selectors 0 and 1)" in str(
    e.value
  )


def test_a_registered_selector_type_selects():
  class Names:
    def __init__(self, *names):
      self.names = names

  optcore.register_selector_type(Names, lambda sel, params: {k: k in sel.names for k in params})
  params = per_parameter_params()
  optimizer = optcore.sgd(0.5).create(params, focus=Names("head"))
  stepped = optimizer.apply_gradient(jax.tree.map(jnp.ones_like, params))
  np.testing.assert_array_equal(stepped.target["head"], params["head"] - 0.5)
  np.testing.assert_array_equal(stepped.target["encoder"]["kernel"], params["encoder"]["kernel"])
  with pytest.raises(TypeError, match="takes a class and a function"):
    optcore.register_selector_type(Names(), lambda s, p: p)


@pytest.mark.parametrize(
  "make",
  [
    lambda: optcore.sgd(0.1, momentum=0.9),
    lambda: optcore.legacy.Adam(1e-2),
    lambda: optcore.ema(optcore.adam(1e-2), 0.9),
    lambda: two_groups(),
  ],
  ids=["optax-sgd", "legacy-adam", "ema", "multi"],
)
def test_a_hyper_parameter_given_to_the_optax_update_is_honoured_as_an_override(make):
  """nnx.Optimizer.update(model, grads, learning_rate=lr) passes its keywords to tx.update."""
  params = make_params()
  tx, opt = make().as_optax(), make().create(params)
  state = tx.init(params)

  @jax.jit
  def step(p, s, lr):
    updates, s = tx.update(jax.grad(loss_fn)(p), s, p, learning_rate=lr)
    return optax.apply_updates(p, updates), s

  for lr in (0.0, 0.05, 0.2):
    before = params
    params, state = step(params, state, lr)
    opt = opt.apply_gradient(jax.grad(loss_fn)(opt.target), learning_rate=lr)
    if lr == 0.0:
      assert_trees_equal(params, before)
  for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(opt.target), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_the_optax_update_warns_of_a_near_miss_and_passes_optax_extras_on():
  """optax's contract: a keyword that is no hyper-parameter goes on and is ignored where unused;
  one a letter or two from a hyper-parameter warns, naming it, and changes nothing."""
  params = make_params()
  tx = optcore.adam(1e-3).as_optax()
  plain, _ = tx.update(params, tx.init(params), params)
  with pytest.warns(UserWarning, match="'lerning_rate' is no hyper-parameter.*'learning_rate'"):
    got, _ = tx.update(params, tx.init(params), params, lerning_rate=0.1)
  assert_trees_equal(got, plain)
  # optax's extra arguments reach a transformation that reads them (polyak_sgd's loss value).
  polyak = optcore.polyak_sgd(max_learning_rate=1.0).as_optax()
  grads = jax.grad(loss_fn)(params)
  got, _ = polyak.update(grads, polyak.init(params), params, value=loss_fn(params))
  raw = optax.polyak_sgd(max_learning_rate=1.0)
  want, _ = raw.update(grads, raw.init(params), params, value=loss_fn(params))
  assert_trees_equal(got, want)


def test_an_accumulated_optax_definition_updates_without_params_as_multisteps_does():
  """accumulate(...).as_optax() refused update(grads, state) without params, which
  optax.MultiSteps accepts (issue 42); a definition that needs them still says so."""
  params = make_params()
  tx = optcore.accumulate(optcore.adam(0.1), every=2).as_optax()
  ref = optax.MultiSteps(optax.adam(0.1), every_k_schedule=2)
  state, ref_state = tx.init(params), ref.init(params)
  update, ref_update = jax.jit(tx.update), jax.jit(ref.update)  # no params: both
  for _ in range(3):
    grads = jax.grad(loss_fn)(params)
    updates, state = update(grads, state)
    want, ref_state = ref_update(grads, ref_state)
    assert_trees_equal(updates, want)
  legacy_tx = optcore.legacy.Adam(0.1).as_optax()
  with pytest.raises(ValueError, match="params must be provided"):
    legacy_tx.update(params, legacy_tx.init(params))
