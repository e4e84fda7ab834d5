"""optcore.grouped: small leaves and their state in one buffer per dtype.

The numbers are compared with raw optax per leaf (and with the ungrouped
legacy definitions), jitted on both sides with the same gradients fed in.
No layout is bitwise another on every CPU: XLA's CPU backend contracts a
multiply and an add (``p + (-lr) * u``) into one fused multiply-add in some
loops and not in others, by how it vectorises each array (a 1600-element leaf
fused, a 128-element one did not, on an AVX-512 machine; lion's 128-element
kernel then moved 1 or 2 ulps from optax per leaf in 5 of its elements). So
the algorithms whose maths is only multiplies, adds and signs are held to one
rounding per step (``ulps=steps`` at the leaf's scale); where there is a
division or a square root, XLA's CPU code for one buffer and for many small
arrays differs in a few more elements (raw optax on the concatenated array
differs from raw optax per leaf the same way), and the tests hold grouped to
optax per leaf within a few float32 ulps (rtol 2e-6).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tree_testing import assert_trees_within_ulps

import optcore
from optcore import legacy

SHAPES = {"w1": (16, 8), "b1": (8,), "w2": (3, 5, 2), "s": (), "big": (40, 40), "b2": (7,)}
MAX_LEAF_SIZE = 1000  # big (1600 elements) stays per leaf


def make_params(seed: int = 0, dtype=jnp.float32) -> dict:
  key = jax.random.key(seed)
  return {
    name: jax.random.normal(jax.random.fold_in(key, i), shape, dtype)
    for i, (name, shape) in enumerate(SHAPES.items())
  }


def gradient_sequence(params, steps: int = 4) -> list:
  key = jax.random.key(100)
  return [
    jax.tree.map(
      lambda p, i=i: jax.random.normal(jax.random.fold_in(key, i), p.shape, p.dtype), params
    )
    for i in range(steps)
  ]


def flat(tree) -> jax.Array:
  return jnp.concatenate([jnp.reshape(x, (-1,)) for x in jax.tree.leaves(tree)])


def run_grouped(opt_def, params, grads):
  opt = optcore.grouped(opt_def, max_leaf_size=MAX_LEAF_SIZE).create(params)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for g in grads:
    opt = step(opt, g)
  return opt


def run_optax(tx, params, grads):
  state = tx.init(params)
  step = jax.jit(lambda p, s, g: _apply(tx, p, s, g))
  for g in grads:
    params, state = step(params, state, g)
  return params, state


def _apply(tx, params, state, grads):
  updates, state = tx.update(grads, state, params)
  return optax.apply_updates(params, updates), state


# No division, no square root: the two layouts differ at most by where XLA fused a multiply-add,
# one rounding a step. Each case is an alias and its arguments, given to optax and optcore alike.
EXACT = {
  "sgd": ("sgd", {"learning_rate": 0.1}),
  "sgd_momentum": ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
  "sgd_nesterov": ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
  "lion": ("lion", {"learning_rate": 1e-2, "weight_decay": 1e-3}),
  "sign_sgd": ("sign_sgd", {"learning_rate": 0.1}),
  "signum": ("signum", {"learning_rate": 0.1}),
  "rprop": ("rprop", {"learning_rate": 0.1}),
}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_optimizers_match_per_leaf_optax_to_one_rounding_a_step(name):
  params = make_params()
  grads = gradient_sequence(params)
  alias, kwargs = EXACT[name]
  opt = run_grouped(getattr(optcore, alias)(**kwargs), params, grads)
  want_params, want_state = run_optax(getattr(optax, alias)(**kwargs), params, grads)
  assert opt.packed_target.buffers[0].shape[0] < sum(x.size for x in jax.tree.leaves(params))
  assert_trees_within_ulps(opt.target, want_params, ulps=len(grads))
  assert_trees_within_ulps(opt.state.param_states, want_state, ulps=len(grads))


ELEMENTWISE = sorted(optcore.ELEMENTWISE_OPTAX)


def _alias(name: str):
  lr = 0.5 if name == "adadelta" else 1e-2
  return getattr(optcore, name)(lr), getattr(optax, name)(lr)


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_every_elementwise_alias_matches_per_leaf_optax(name):
  params = make_params()
  grads = gradient_sequence(params)
  opt_def, tx = _alias(name)
  opt = run_grouped(opt_def, params, grads)
  want_params, want_state = run_optax(tx, params, grads)
  assert jax.tree.structure(opt.state.param_states) == jax.tree.structure(want_state)
  for got, want in zip(jax.tree.leaves(opt.target), jax.tree.leaves(want_params), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
  for got, want in zip(
    jax.tree.leaves(opt.state.param_states), jax.tree.leaves(want_state), strict=True
  ):
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
  # The large leaf is not grouped: exactly optax's.
  np.testing.assert_array_equal(opt.target["big"], want_params["big"])


LEGACY = {
  "GradientDescent": lambda: legacy.GradientDescent(0.1),
  "Momentum": lambda: legacy.Momentum(0.1, beta=0.9, weight_decay=1e-3, nesterov=True),
  "Adam": lambda: legacy.Adam(1e-2, weight_decay=1e-3),
  "AdaBelief": lambda: legacy.AdaBelief(1e-2),
  "Adadelta": lambda: legacy.Adadelta(1.0),
  "Adagrad": lambda: legacy.Adagrad(1e-2),
  "RMSProp": lambda: legacy.RMSProp(1e-2, centered=True),
}


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_legacy_algorithms_match_their_ungrouped_definitions(name):
  params = make_params()
  grads = gradient_sequence(params)
  opt = run_grouped(LEGACY[name](), params, grads)
  ref = LEGACY[name]().create(params)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for g in grads:
    ref = step(ref, g)
  assert jax.tree.structure(opt.state) == jax.tree.structure(ref.state)
  if name in ("GradientDescent", "Momentum"):  # multiplies and adds: one rounding a step
    assert_trees_within_ulps((opt.target, opt.state), (ref.target, ref.state), ulps=len(grads))
    return
  for got, want in zip(
    jax.tree.leaves((opt.target, opt.state)), jax.tree.leaves((ref.target, ref.state)), strict=True
  ):
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def _is_grouped(x) -> bool:
  return isinstance(x, optcore.GroupedParams)


def chex_equal(got, want) -> None:
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(a, b)


def test_small_leaves_share_one_buffer_per_dtype_and_large_ones_stay():
  params = make_params()
  params["half"] = jnp.ones((4, 4), jnp.bfloat16)
  params["half_big"] = jnp.ones((64, 64), jnp.bfloat16)
  opt = optcore.grouped(optcore.adam(1e-3), max_leaf_size=MAX_LEAF_SIZE).create(params)
  packed = opt.packed_target
  dtypes = sorted(dtype for _, dtype, _ in packed.layout.buffers)
  assert dtypes == ["bfloat16", "float32"]
  small32 = sum(int(np.prod(s)) for s in SHAPES.values() if int(np.prod(s)) < MAX_LEAF_SIZE)
  sizes = {dtype: size for _, dtype, size in packed.layout.buffers}
  assert sizes == {"float32": small32, "bfloat16": 16}
  assert [x.shape for x in packed.ungrouped] == [(40, 40), (64, 64)]
  assert packed.ungrouped[0] is params["big"]  # not copied
  chex_equal(opt.target, params)
  assert opt.target["half"].dtype == jnp.bfloat16
  # The state is grouped the same way: one mu and one nu buffer per dtype.
  mu = opt.packed_state.param_states[0].mu
  assert isinstance(mu, optcore.GroupedParams)
  assert [b.dtype for b in mu.buffers] == [b.dtype for b in packed.buffers]


def test_buffers_fill_up_to_max_buffer_size_in_the_parameters_order():
  params = {f"p{i}": jnp.full((30,), float(i)) for i in range(5)}
  params["big"] = jnp.ones(250)
  opt_def = optcore.grouped(optcore.sgd(0.1, momentum=0.9), max_leaf_size=300, max_buffer_size=70)
  opt = opt_def.create(params)
  # p0+p1 (60), p2+p3 (60), p4 (30): 'big' (250) is below max_leaf_size, over the buffer size
  sizes = [size for _, _, size in opt.packed_target.layout.buffers]
  assert sizes == [250, 60, 60, 30]
  grads = jax.tree.map(lambda x: jnp.linspace(-1.0, 1.0, x.size), params)
  want_params, want_state = run_optax(optax.sgd(0.1, momentum=0.9), params, [grads] * 3)
  for _ in range(3):
    opt = jax.jit(lambda o, g: o.apply_gradient(g))(opt, grads)
  assert_trees_within_ulps(opt.target, want_params, ulps=3)  # one fused multiply-add a step
  assert_trees_within_ulps(opt.state.param_states, want_state, ulps=3)


def test_max_leaf_size_counts_elements():
  params = {"a": jnp.ones(9), "b": jnp.ones(10)}
  layout = optcore.grouped(optcore.sgd(0.1), max_leaf_size=10).layout(params)
  assert [e.buffer for e in layout.entries] == [0, -1]


def test_state_dict_is_the_ungrouped_one_and_restores_both_ways():
  params = make_params()
  grads = gradient_sequence(params)
  opt = run_grouped(optcore.adamw(1e-2), params, grads)
  ref = optcore.adamw(1e-2).create(params)
  for g in grads:
    ref = ref.apply_gradient(g)
  sd, ref_sd = opt.state_dict(), ref.state_dict()
  assert jax.tree.structure(sd) == jax.tree.structure(ref_sd)
  # grouped -> ungrouped
  restored = optcore.adamw(1e-2).create(params).restore_state(sd)
  chex_equal(restored.target, opt.target)
  chex_equal(restored.state, opt.state)
  # ungrouped -> grouped, and the restored optimizer keeps stepping as the reference does
  fresh = optcore.grouped(optcore.adamw(1e-2), max_leaf_size=MAX_LEAF_SIZE).create(params)
  back = fresh.restore_state(ref_sd)
  assert isinstance(back.packed_target, optcore.GroupedParams)
  chex_equal(back.target, ref.target)
  chex_equal(back.state, ref.state)
  assert int(back.packed_state.step) == len(grads)


def test_a_grouped_optimizer_has_every_method_of_an_optimizer_with_its_results():
  """Issue 49: one container's methods, not a second copy of some of them: compute_gradient,
  optimize, current_hyper_params, transplant and the read-outs give a grouped optimizer what
  they give the ungrouped one, and keep it grouped."""
  params = make_params()
  grads = gradient_sequence(params, 1)[0]
  loss = lambda p: sum(jnp.sum(x**2) for x in jax.tree.leaves(p))
  opt = optcore.grouped(optcore.adam(1e-2), max_leaf_size=MAX_LEAF_SIZE).create(params)
  ref = optcore.adam(1e-2).create(params)
  assert not set(dir(ref)) - set(dir(opt)) - {"replicate", "unreplicate", "target_shardings"}
  loss_value, grad = opt.compute_gradient(loss)
  want_loss, want_grad = ref.compute_gradient(loss)
  assert float(loss_value) == float(want_loss)
  chex_equal(grad, want_grad)
  with pytest.warns(DeprecationWarning, match="optimize"):
    stepped, _ = opt.optimize(loss)
  assert isinstance(stepped.packed_target, optcore.GroupedParams)
  assert int(stepped.state.step) == 1
  assert float(opt.current_hyper_params()["learning_rate"]) == pytest.approx(1e-2)
  # an ungrouped checkpoint of the same algorithm: every moment kept, the layout grouped still
  old = ref.apply_gradient(grads)
  moved, report = opt.transplant(old.state_dict())
  assert isinstance(moved.packed_state.param_states[0].mu, optcore.GroupedParams)
  assert {"param_states/0/mu/w1", "param_states/0/nu/big"} <= {e.path for e in report.kept}
  chex_equal(moved.state, old.state)
  chex_equal(moved.target, opt.target)  # the target is this optimizer's
  with pytest.raises(TypeError, match="keeps no schedule-free state"):
    _ = opt.eval_params
  with pytest.raises(TypeError, match="cannot keep one"):
    _ = opt.ema_params


def test_a_legacy_state_dict_restores_grouped():
  params = make_params()
  ref = legacy.Adam(0.1).create(params).apply_gradient(gradient_sequence(params, 1)[0])
  opt = optcore.grouped(legacy.Adam(0.1), max_leaf_size=MAX_LEAF_SIZE).create(params)
  opt = opt.restore_state(ref.state_dict())
  chex_equal(opt.state, ref.state)
  assert opt.state_dict().keys() == ref.state_dict().keys()


def test_a_bad_state_dict_names_the_parameter_and_changes_nothing():
  params = make_params()
  opt = optcore.grouped(optcore.adam(1e-3), max_leaf_size=MAX_LEAF_SIZE).create(params)
  sd = optcore.adam(1e-3).create(params).state_dict()
  sd["target"]["b1"] = np.zeros(9, np.float32)
  with pytest.raises(optcore.StateDictError, match="b1"):
    opt.restore_state(sd)
  chex_equal(opt.target, params)


def test_wrong_gradients_are_named_by_path():
  params = make_params()
  opt = optcore.grouped(optcore.adam(1e-3), max_leaf_size=MAX_LEAF_SIZE).create(params)
  grads = jax.tree.map(jnp.ones_like, params)
  grads["b1"] = jnp.ones((8, 1))
  with pytest.raises(optcore.TreeMismatchError, match=r"shape \(8, 1\) at '/b1'"):
    opt.apply_gradient(grads)
  del grads["b1"]
  with pytest.raises(optcore.TreeMismatchError, match="'/b1'"):
    opt.apply_gradient(grads)


def test_overrides_reach_the_wrapped_definition():
  params = make_params()
  grads = gradient_sequence(params, 2)
  opt = optcore.grouped(optcore.adam(1e-3), max_leaf_size=MAX_LEAF_SIZE).create(params)
  ref = optcore.adam(1e-3).create(params)
  step = jax.jit(lambda o, g, lr: o.apply_gradient(g, learning_rate=lr))
  for g, lr in zip(grads, [0.1, 0.05], strict=True):
    opt, ref = step(opt, g, lr), step(ref, g, lr)
  for got, want in zip(jax.tree.leaves(opt.target), jax.tree.leaves(ref.target), strict=True):
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
  with pytest.raises(TypeError, match="unknown hyper-parameter 'lr'"):
    opt.apply_gradient(grads[0], lr=0.1)


def test_a_multi_optimizer_is_grouped_per_group():
  params = make_params()
  grads = gradient_sequence(params, 3)
  make = lambda: optcore.MultiOptimizer(
    (r"w", optcore.sgd(0.1, momentum=0.9)), (r"b|big", optcore.lion(1e-2))
  )
  opt = run_grouped(make(), params, grads)
  groups = sorted(group for group, _, _ in opt.packed_target.layout.buffers)
  assert groups == [-1, 0, 1]  # 's' is selected by no group: frozen, in a buffer of its own
  ref = make().create(params)
  for g in grads:
    ref = jax.jit(lambda o, g: o.apply_gradient(g))(ref, g)
  assert_trees_within_ulps((opt.target, opt.state), (ref.target, ref.state), ulps=len(grads))
  np.testing.assert_array_equal(opt.target["s"], params["s"])
  assert jax.tree.structure(opt.state_dict()) == jax.tree.structure(ref.state_dict())


def test_gradients_of_the_packed_buffers_are_the_per_leaf_ones_concatenated():
  params = make_params()
  opt = optcore.grouped(optcore.sgd(0.1), max_leaf_size=MAX_LEAF_SIZE).create(params)
  loss = lambda p: sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(p))
  value, per_leaf = opt.compute_gradient(loss)  # as Optimizer.compute_gradient: per leaf
  assert value == loss(params)
  chex_equal(per_leaf, jax.grad(loss)(opt.target))
  packed_grads = jax.grad(lambda packed: loss(packed.unpack()))(opt.packed_target)
  assert isinstance(packed_grads, optcore.GroupedParams)
  chex_equal(packed_grads.unpack(), per_leaf)
  chex_equal(opt.apply_gradient(packed_grads).target, opt.apply_gradient(per_leaf).target)
  # Differentiating through unpack concatenates the per-leaf gradients: one copy, no padding.
  jaxpr = str(jax.make_jaxpr(jax.grad(lambda pk: loss(pk.unpack())))(opt.packed_target))
  assert "concatenate" in jaxpr and " pad" not in jaxpr


def test_replace_takes_the_ungrouped_views():
  params = make_params()
  opt = optcore.grouped(optcore.sgd(0.1, momentum=0.9), max_leaf_size=MAX_LEAF_SIZE).create(params)
  doubled = jax.tree.map(lambda x: 2 * x, params)
  new = opt.replace(target=doubled)
  chex_equal(new.target, doubled)
  assert new.packed_target.layout == opt.packed_target.layout
  state = jax.tree.map(jnp.ones_like, opt.state)
  chex_equal(opt.replace(state=state).state, state)


@pytest.mark.parametrize(
  "opt_def, reason",
  [
    (lambda: optcore.lamb(1e-3), "lamb is not one of the element-wise optax optimizers"),
    (lambda: optcore.lars(1e-3), "lars is not one of"),
    (lambda: optcore.adafactor(1e-3), "adafactor is not one of"),
    (lambda: optcore.noisy_sgd(1e-3, key=jax.random.key(0)), "noisy_sgd is not one of"),
    (
      lambda: optcore.chain([optax.clip_by_global_norm(1.0), optcore.adam(1e-3)]),
      "chain is not one of",
    ),
    (lambda: optcore.adamw(1e-3, mask=lambda p: p), "adamw has a weight-decay mask"),
    (lambda: legacy.LAMB(1e-3), "LAMB is not element-wise"),
    (lambda: legacy.LARS(1e-3), "LARS is not element-wise"),
    (lambda: legacy.WeightNorm(legacy.Adam(1e-3)), "WeightNorm is not element-wise"),
    (lambda: optcore.t5x.Adafactor(1e-3), "Adafactor is not element-wise"),
    (
      lambda: optcore.MultiOptimizer(("a", optcore.adam(1e-3)), ("b", optcore.lamb(1e-3))),
      "lamb is not one of",
    ),
  ],
)
def test_optimizers_that_reduce_per_parameter_are_refused(opt_def, reason):
  with pytest.raises(optcore.UngroupableError, match=reason):
    optcore.grouped(opt_def())


def test_bad_arguments_are_refused():
  with pytest.raises(ValueError, match="max_leaf_size must be a positive int"):
    optcore.grouped(optcore.adam(1e-3), max_leaf_size=0)
  with pytest.raises(ValueError, match="max_buffer_size must be a positive int"):
    optcore.grouped(optcore.adam(1e-3), max_buffer_size=2.5)
  with pytest.raises(TypeError, match="takes an optimizer definition"):
    optcore.grouped(optax.adam(1e-3))
  with pytest.raises(TypeError, match="grouped already"):
    optcore.grouped(optcore.grouped(optcore.adam(1e-3)))
  with pytest.raises(TypeError, match="cannot: they own the parameters"):
    optcore.grouped(optcore.adam(1e-3)).as_optax()
  with pytest.raises(TypeError, match=r"Group the whole: optcore.grouped\(optcore.MultiOptimizer"):
    optcore.MultiOptimizer(("w", optcore.grouped(optcore.adam(1e-3))))


def test_a_face_that_owns_its_parameters_refuses_and_says_why():
  with pytest.raises(TypeError, match=r"owns its parameters.*no reliable gain"):
    optcore.adapter.as_definition(optcore.grouped(optcore.adam(1e-3)), "my_face.Optimizer")


def test_integer_parameters_are_refused_as_ungrouped_ones_are():
  with pytest.raises(TypeError) as grouped_error:
    optcore.grouped(optcore.adam(1e-3)).create({"i": jnp.ones(3, jnp.int32)})
  with pytest.raises(TypeError) as plain_error:
    optcore.adam(1e-3).create({"i": jnp.ones(3, jnp.int32)})
  assert str(grouped_error.value) == str(plain_error.value)


def test_definitions_are_static_and_do_not_retrace():
  params = make_params()
  traces = []

  def step(opt, g):
    traces.append(1)
    return opt.apply_gradient(g)

  jitted = jax.jit(step)
  for g in gradient_sequence(params, 3):
    opt = optcore.grouped(optcore.adam(1e-3), max_leaf_size=MAX_LEAF_SIZE).create(params)
    jitted(opt, g)
  assert len(traces) == 1


def test_a_config_names_a_grouped_definition_and_round_trips():
  config = {
    "name": "grouped",
    "max_leaf_size": 4096,
    "max_buffer_size": 100000,
    "optimizer": {"name": "multi", "groups": [
      {"select": "w", "optimizer": {"name": "adamw", "learning_rate": 1e-3}},
      {"select": "b", "optimizer": {"name": "legacy.Momentum", "learning_rate": 0.1}},
    ]},
  }  # fmt: skip
  opt_def = optcore.config.from_config(config)
  assert isinstance(opt_def, optcore.Grouped) and opt_def.max_leaf_size == 4096
  assert optcore.config.to_config(opt_def) == config
  assert optcore.config.from_config(optcore.config.to_config(opt_def)) == opt_def
  with pytest.raises(
    optcore.config.ConfigError, match=r"^at 'config': grouped\(lamb\) is not possible"
  ):
    optcore.config.from_config(
      {"name": "grouped", "optimizer": {"name": "lamb", "learning_rate": 0.1}}
    )
  with pytest.raises(optcore.config.ConfigError, match="'grouped' takes"):
    optcore.config.from_config({"name": "grouped", "max_leaf_size": 10})


def test_a_replaced_target_of_another_shape_is_refused_by_path():
  """replace(target=...) with a (3, 2) array for a (2, 3) parameter was read back reshaped."""
  params = make_params()
  opt = optcore.grouped(optcore.sgd(0.1), max_leaf_size=MAX_LEAF_SIZE).create(params)
  wrong = {**params, "w1": jnp.ones((8, 16))}
  with pytest.raises(optcore.TreeMismatchError, match=r"'/w1' is float32\[8, 16\].*\[16, 8\]"):
    opt.replace(target=wrong)
  with pytest.raises(optcore.TreeMismatchError, match="'/b1' is bfloat16"):
    opt.replace(target={**params, "b1": params["b1"].astype(jnp.bfloat16)})
  doubled = jax.tree.map(lambda x: 2 * x, params)
  chex_equal(opt.replace(target=doubled).target, doubled)
