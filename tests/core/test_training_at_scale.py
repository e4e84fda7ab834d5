"""Training at scale in the core: accumulate, mixed_precision, state_memory_kind.

Numbers are compared with the plain optax equivalents (optax.MultiSteps, an
optax loop on float32 copies of the parameters) and with the on-device step;
the 8-device mesh runs are in tests/distributed/test_training_at_scale_mesh.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, PartitionSpec

import optcore
from optcore import legacy

SHAPES = {"w": (6, 4), "b": (4,), "s": ()}


def make_params(dtype=jnp.float32, seed: int = 0) -> dict:
  key = jax.random.key(seed)
  return {
    n: jax.random.normal(jax.random.fold_in(key, i), s, dtype)
    for i, (n, s) in enumerate(SHAPES.items())
  }


def grads_at(i: int, params) -> dict:
  key = jax.random.key(1000 + i)
  return jax.tree.map(
    lambda p: jax.random.normal(jax.random.fold_in(key, p.size), p.shape, p.dtype), params
  )


def cast(tree, dtype):
  """``tree`` with every real floating leaf in ``dtype``."""
  floating = lambda x: jnp.issubdtype(x.dtype, jnp.floating)
  return jax.tree.map(lambda x: x.astype(dtype) if floating(x) else x, tree)


def assert_bitwise(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


# accumulate


@pytest.mark.parametrize(
  "name,kwargs",
  [
    ("adam", {"learning_rate": 1e-2}),
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
    ("adamw", {"learning_rate": 1e-2, "weight_decay": 0.1}),
    ("lion", {"learning_rate": 1e-3}),
    ("adafactor", {"learning_rate": 1e-2}),
  ],
)
@pytest.mark.parametrize("every", [1, 3])
def test_accumulate_equals_multisteps_bitwise(name, kwargs, every):
  params = make_params()
  opt = optcore.accumulate(getattr(optcore, name)(**kwargs), every=every).create(params)
  tx = optax.MultiSteps(getattr(optax, name)(**kwargs), every_k_schedule=every)
  raw_state = tx.init(params)
  raw_params = params

  @jax.jit
  def raw_step(p, s, g):
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(2 * every + 1):
    g = grads_at(i, params)
    opt = step(opt, g)
    raw_params, raw_state = raw_step(raw_params, raw_state, g)
    assert_bitwise(opt.target, raw_params)
    assert_bitwise(opt.state.param_states.accumulated, raw_state.acc_grads)
    assert_bitwise(opt.state.param_states.inner, raw_state.inner_opt_state)
    assert int(opt.state.step) == int(raw_state.gradient_step)
    assert int(opt.state.param_states.mini_step) == int(raw_state.mini_step)


def test_accumulate_is_one_step_on_the_mean_gradient():
  params = make_params()
  gs = [grads_at(i, params) for i in range(4)]
  opt = optcore.accumulate(optcore.adam(1e-2), every=4).create(params)
  for g in gs[:3]:
    opt = opt.apply_gradient(g)
    assert_bitwise(opt.target, params)  # nothing applied yet
  opt = opt.apply_gradient(gs[3])
  mean = jax.tree.map(lambda *xs: sum(xs) / 4, *gs)
  once = optcore.adam(1e-2).create(params).apply_gradient(mean)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), opt.target, once.target
  )


def test_accumulate_legacy_and_override_of_the_applying_call():
  params = make_params()
  gs = [grads_at(i, params) for i in range(2)]
  opt = optcore.accumulate(legacy.Momentum(0.1, beta=0.9), every=2).create(params)
  step = jax.jit(lambda o, g, lr: o.apply_gradient(g, learning_rate=lr))
  opt = step(opt, gs[0], 100.0)  # not applied: its override is unused
  opt = step(opt, gs[1], 0.5)
  mean = jax.tree.map(lambda a, b: a + (b - a) / 2, gs[0], gs[1])
  want = legacy.Momentum(0.1, beta=0.9).create(params).apply_gradient(mean, learning_rate=0.5)
  assert_bitwise(opt.target, want.target)
  assert_bitwise(opt.state.param_states.inner, want.state.param_states)


def test_accumulate_state_dict_mid_accumulation_resumes_exactly():
  params = make_params()
  opt_def = optcore.accumulate(optcore.adam(1e-2), every=3)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  straight = opt_def.create(params)
  for i in range(4):  # one update, then one gradient into the next mean
    straight = step(straight, grads_at(i, params))
  saved = straight.state_dict()
  assert set(saved["state"]["param_states"]) == {"inner", "accumulated", "mini_step"}
  assert int(saved["state"]["param_states"]["mini_step"]) == 1
  resumed = opt_def.create(jax.tree.map(jnp.zeros_like, params)).restore_state(saved)
  for i in range(4, 9):
    straight = step(straight, grads_at(i, params))
    resumed = step(resumed, grads_at(i, params))
  assert_bitwise(resumed, straight)


def test_accumulate_dtype_and_multioptimizer():
  params = make_params(jnp.bfloat16)
  opt_def = optcore.accumulate(
    optcore.MultiOptimizer(("w", optcore.adam(1e-2)), ("b|s", optcore.sgd(0.1))), every=2
  )
  opt = opt_def.create(params)
  assert {x.dtype for x in jax.tree.leaves(opt.state.param_states.accumulated)} == {
    jnp.dtype(jnp.float32)
  }
  opt = opt.apply_gradient(grads_at(0, params)).apply_gradient(grads_at(1, params))
  assert int(opt.state.step) == 1 and opt.target["w"].dtype == jnp.bfloat16
  bf = optcore.accumulate(optcore.sgd(0.1), every=2, dtype=jnp.bfloat16).create(params)
  assert bf.state.param_states.accumulated["w"].dtype == jnp.bfloat16


def test_accumulate_partition_rules_cover_its_state():
  params = make_params()
  axes = {"w": PartitionSpec("embed", "mlp"), "b": PartitionSpec("mlp"), "s": PartitionSpec()}
  opt_def = optcore.accumulate(optcore.adam(1e-2), every=2)
  logical = opt_def.derive_logical_axes(opt_def.create(params), axes)
  acc = logical.state.param_states
  assert acc.accumulated == axes and acc.mini_step == PartitionSpec()
  assert acc.inner[0].mu == axes


@pytest.mark.parametrize(
  "build,match",
  [
    (lambda: optcore.accumulate(optcore.sgd(0.1), every=0), "every must be an integer >= 1; got 0"),
    (
      lambda: optcore.accumulate(optcore.sgd(0.1), every=2.0),
      "every must be an integer >= 1; got 2.0",
    ),
    (lambda: optcore.accumulate(optax.sgd(0.1), every=2), "OptaxWrapper"),
    (
      lambda: optcore.accumulate(optcore.accumulate(optcore.sgd(0.1), every=2), every=2),
      "wraps accumulate twice",
    ),
    (lambda: optcore.accumulate(optcore.sgd(0.1), every=2, dtype=jnp.int32), "dtype"),
    (
      lambda: optcore.accumulate(
        optcore.contrib.dpsgd(0.1, l2_norm_clip=1.0, noise_multiplier=0.1, seed=0), every=2
      ),
      "per-example gradients",
    ),
    (
      lambda: optcore.accumulate(optcore.grouped(optcore.sgd(0.1)), every=2),
      r"accumulate\(grouped\(sgd\)\)",
    ),
    (
      lambda: optcore.grouped(optcore.accumulate(optcore.sgd(0.1), every=2)),
      r"accumulate\(sgd\)",
    ),
  ],
)
def test_accumulate_refusals_name_what_is_wrong(build, match):
  with pytest.raises((TypeError, ValueError), match=match):
    build()


# mixed_precision


def test_state_dtype_stores_every_floating_leaf_and_computes_in_float32():
  params = make_params()
  for inner in (
    optcore.adam(1e-2),
    legacy.Adam(1e-2),
    optcore.adafactor(1e-2),
    legacy.RMSProp(0.01),
  ):
    opt_def = optcore.mixed_precision(inner, state_dtype=jnp.bfloat16)
    opt = opt_def.create(params)
    step = jax.jit(lambda o, g: o.apply_gradient(g))

    # The reference, by hand: the state kept in bfloat16, read back in float32.
    @jax.jit
    def ref_step(p, stored, g, inner=inner):
      p, new = inner.apply_gradient(inner.hyper_params, p, cast(stored, jnp.float32), g)
      return p, cast(new, jnp.bfloat16)

    ref_params, ref_state = params, cast(inner.init_state(params), jnp.bfloat16)
    for i in range(3):
      g = grads_at(i, params)
      opt = step(opt, g)
      ref_params, ref_state = ref_step(ref_params, ref_state, g)
      assert_bitwise(opt.target, ref_params)
      assert_bitwise(opt.state.param_states.inner, ref_state.param_states)
    floats = [
      x
      for x in jax.tree.leaves(opt.state.param_states.inner)
      if jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    assert floats and {x.dtype for x in floats} == {jnp.dtype(jnp.bfloat16)}, inner
    ints = [x for x in jax.tree.leaves(opt.state) if jnp.issubdtype(x.dtype, jnp.integer)]
    assert all(x.dtype == jnp.int32 for x in ints)


def test_master_weights_equal_an_optax_loop_on_float32_copies():
  params = make_params(jnp.bfloat16)
  opt_def = optcore.mixed_precision(optcore.adam(1e-3), master_dtype=jnp.float32)
  opt = opt_def.create(params)
  master = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  tx = optax.adam(1e-3)
  raw_state = tx.init(master)

  @jax.jit
  def raw_step(m, s, g):
    u, s = tx.update(jax.tree.map(lambda x: x.astype(jnp.float32), g), s, m)
    return optax.apply_updates(m, u), s

  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(5):
    g = grads_at(i, params)
    opt = step(opt, g)
    master, raw_state = raw_step(master, raw_state, g)
    assert_bitwise(opt.state.param_states.master, master)
    assert_bitwise(opt.target, jax.tree.map(lambda m: m.astype(jnp.bfloat16), master))
    assert_bitwise(opt.state.param_states.inner, raw_state)
  assert {x.dtype for x in jax.tree.leaves(opt.target)} == {jnp.dtype(jnp.bfloat16)}


def test_master_weights_only_for_narrower_parameters_and_round_trip():
  params = {"lo": jnp.ones(3, jnp.bfloat16), "hi": jnp.ones(3, jnp.float32)}
  opt_def = optcore.mixed_precision(
    optcore.adam(1e-3), state_dtype=jnp.bfloat16, master_dtype=jnp.float32
  )
  opt = opt_def.create(params).apply_gradient(jax.tree.map(jnp.ones_like, params))
  assert opt.state.param_states.master["hi"] is None
  assert opt.state.param_states.master["lo"].dtype == jnp.float32
  saved = opt.state_dict()
  assert saved["state"]["param_states"]["master"]["hi"] is None  # as a MultiOptimizer's None
  restored = opt_def.create(params).restore_state(saved)
  assert_bitwise(restored.state, opt.state)
  axes = opt_def.derive_logical_axes(opt, {"lo": PartitionSpec("mlp"), "hi": PartitionSpec()})
  assert axes.state.param_states.master == {"lo": PartitionSpec("mlp"), "hi": None}


@pytest.mark.parametrize(
  "kwargs,match",
  [
    ({"state_dtype": jnp.int8}, "state_dtype must be a real floating dtype"),
    ({"state_dtype": jnp.complex64}, "state_dtype must be a real floating dtype"),
    ({"master_dtype": "int32"}, "master_dtype must be a real floating dtype"),
    ({}, "needs state_dtype="),
  ],
)
def test_mixed_precision_refuses_bad_dtypes_naming_the_argument(kwargs, match):
  with pytest.raises((TypeError, ValueError), match=match):
    optcore.mixed_precision(optcore.adam(1e-3), **kwargs)


def test_master_dtype_narrower_than_a_parameter_is_named():
  opt_def = optcore.mixed_precision(optcore.adam(1e-3), master_dtype=jnp.bfloat16)
  with pytest.raises(ValueError, match=r"narrower than the parameter at '/w' \(float32\)"):
    opt_def.create({"w": jnp.ones(2)})


def test_wrappers_compose_and_overrides_pass_through():
  params = make_params(jnp.bfloat16)
  opt_def = optcore.accumulate(
    optcore.mixed_precision(optcore.adam(1e-3), state_dtype=jnp.bfloat16, master_dtype=jnp.float32),
    every=2,
  )
  assert opt_def.overridable_names() == optcore.adam(1e-3).overridable_names()
  opt = opt_def.create(params)
  step = jax.jit(lambda o, g: o.apply_gradient(g, learning_rate=1e-2))
  opt = step(step(opt, grads_at(0, params)), grads_at(1, params))
  mean = jax.tree.map(
    lambda a, b: a.astype(jnp.float32) + (b.astype(jnp.float32) - a.astype(jnp.float32)) / 2,
    grads_at(0, params),
    grads_at(1, params),
  )
  inner = optcore.mixed_precision(
    optcore.adam(1e-3), state_dtype=jnp.bfloat16, master_dtype=jnp.float32
  ).create(params)
  want = inner.apply_gradient(
    jax.tree.map(lambda m: m.astype(jnp.bfloat16), mean), learning_rate=1e-2
  )
  assert_bitwise(opt.target, want.target)
  with pytest.raises(TypeError, match="learning_rat"):
    opt.apply_gradient(grads_at(2, params), learning_rat=1.0)
  # The other order stores the moments in state_dtype; the accumulator keeps its own dtype.
  reverse = optcore.mixed_precision(
    optcore.accumulate(optcore.adam(1e-3), every=2), state_dtype=jnp.bfloat16
  )
  state = reverse.create(params).state.param_states.inner
  assert state.accumulated["w"].dtype == jnp.float32
  assert state.inner[0].mu["w"].dtype == jnp.bfloat16


# state_memory_kind


def one_device_mesh() -> Mesh:
  return Mesh(np.array(jax.devices()[:1]), ("data",))


@pytest.mark.parametrize(
  "opt_def",
  [
    optcore.adam(1e-2),
    legacy.Adam(1e-2),
    optcore.accumulate(optcore.adam(1e-2), every=2),
    optcore.mixed_precision(optcore.adam(1e-2), state_dtype=jnp.bfloat16),
  ],
  ids=repr,
)
def test_pinned_host_state_stays_on_host_and_gives_the_device_numbers(opt_def):
  params = make_params()
  mesh = one_device_mesh()
  host = opt_def.create_sharded(params, mesh=mesh, state_memory_kind="pinned_host")
  device = opt_def.create_sharded(params, mesh=mesh)
  step = jax.jit(lambda o, g: o.apply_gradient(g))

  def kinds(opt):
    return {(np.ndim(x) > 0, x.sharding.memory_kind) for x in jax.tree.leaves(opt.state)}

  assert kinds(host) <= {(True, "pinned_host"), (False, "device")}
  assert (True, "pinned_host") in kinds(host)
  for i in range(3):
    host = step(host, grads_at(i, params))
    device = step(device, grads_at(i, params))
    assert kinds(host) <= {(True, "pinned_host"), (False, "device")}
    assert {x.sharding.memory_kind for x in jax.tree.leaves(host.target)} == {"device"}
  assert_bitwise(host.target, device.target)
  assert_bitwise(host.state, device.state)
  eager = host.apply_gradient(grads_at(9, params))  # outside jit too
  assert kinds(eager) <= {(True, "pinned_host"), (False, "device")}


def test_memory_kind_the_device_lacks_lists_the_kinds():
  with pytest.raises(ValueError, match=r"have the memory kinds \[.*'pinned_host'.*\], not 'hbm'"):
    optcore.adam(1e-2).create_sharded(
      make_params(), mesh=one_device_mesh(), state_memory_kind="hbm"
    )
  with pytest.raises(ValueError, match="unpinned_host' is not supported"):
    optcore.adam(1e-2).create_sharded(
      make_params(), mesh=one_device_mesh(), state_memory_kind="unpinned_host"
    )


def test_derive_shardings_places_the_state_not_the_target():
  params = make_params()
  opt = optcore.adam(1e-2).create(params)
  shardings = opt.optimizer_def.derive_shardings(
    opt, mesh=one_device_mesh(), state_memory_kind="pinned_host"
  )
  assert {s.memory_kind for s in jax.tree.leaves(shardings.target)} == {"device"}
  assert shardings.state.param_states[0].mu["w"].memory_kind == "pinned_host"
  assert shardings.state.step.memory_kind in (None, "device")
  state = optcore.adapter.state_shardings(
    opt.optimizer_def, opt.state, params, None, one_device_mesh(), state_memory_kind="pinned_host"
  )
  assert state.param_states[0].nu["b"].memory_kind == "pinned_host"


# configs


@pytest.mark.parametrize(
  "opt_def",
  [
    optcore.accumulate(optcore.adam(1e-3), every=4),
    optcore.accumulate(optcore.sgd(0.1), every=2, dtype=jnp.bfloat16),
    optcore.mixed_precision(optcore.adam(1e-3), state_dtype=jnp.bfloat16),
    optcore.mixed_precision(
      optcore.accumulate(legacy.Adam(1e-3), every=2),
      state_dtype=jnp.bfloat16,
      master_dtype=jnp.float32,
    ),
  ],
  ids=repr,
)
def test_configs_round_trip(opt_def):
  config = optcore.config.to_config(opt_def)
  assert optcore.config.from_config(config) == opt_def
  import json

  assert optcore.config.from_config(json.loads(json.dumps(config))) == opt_def


def test_config_form_and_errors():
  config = optcore.config.to_config(optcore.accumulate(optcore.adam(1e-3), every=4))
  assert config == {
    "name": "accumulate",
    "every": 4,
    "optimizer": {"name": "adam", "learning_rate": 0.001},
  }
  with pytest.raises(optcore.config.ConfigError, match="'accumulate' takes"):
    optcore.config.from_config({"name": "accumulate", "optimizer": {"name": "adam"}})
  with pytest.raises(optcore.config.ConfigError, match="state_dtype"):
    optcore.config.from_config(
      {
        "name": "mixed_precision",
        "state_dtype": "int8",
        "optimizer": {"name": "adam", "learning_rate": 1.0},
      }
    )


def test_mixed_precision_inside_a_multioptimizer_group():
  params = {"kernel": jnp.ones((3, 2), jnp.bfloat16), "bias": jnp.zeros(2)}
  mixed = optcore.mixed_precision(optcore.adam(1e-2), master_dtype=jnp.float32)
  opt_def = optcore.MultiOptimizer(("kernel", mixed), ("bias", optcore.sgd(0.1)))
  opt = opt_def.create(params)
  g = {"kernel": jnp.ones((3, 2), jnp.bfloat16), "bias": jnp.ones(2)}
  for _ in range(3):
    opt = jax.jit(lambda o, g: o.apply_gradient(g))(opt, g)
  alone = mixed.create({"kernel": params["kernel"]})
  for _ in range(3):
    alone = jax.jit(lambda o, g: o.apply_gradient(g))(alone, {"kernel": g["kernel"]})
  assert_bitwise(opt.target["kernel"], alone.target["kernel"])
  restored = opt_def.create(params).restore_state(opt.state_dict())
  assert_bitwise(restored.state, opt.state)


def test_a_legacy_state_with_no_master_copy_round_trips():
  opt_def = optcore.mixed_precision(
    legacy.Adam(1e-2), state_dtype=jnp.bfloat16, master_dtype=jnp.float32
  )
  params = make_params()  # float32: no master copy anywhere
  opt = opt_def.create(params).apply_gradient(grads_at(0, params))
  assert jax.tree.leaves(opt.state.param_states.master) == []
  restored = opt_def.create(params).restore_state(opt.state_dict())
  assert_bitwise(restored.state, opt.state)
  assert_bitwise(restored.target, opt.target)


def test_a_grouped_definition_keeps_its_buffers_state_in_host_memory():
  params = make_params()
  opt_def = optcore.grouped(optcore.adam(1e-2))
  host = opt_def.create_sharded(params, mesh=one_device_mesh(), state_memory_kind="pinned_host")
  device = opt_def.create_sharded(params, mesh=one_device_mesh())
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  for i in range(2):
    host, device = step(host, grads_at(i, params)), step(device, grads_at(i, params))
  kinds = {x.sharding.memory_kind for x in jax.tree.leaves(host.packed_state) if x.ndim}
  assert kinds == {"pinned_host"}
  assert_bitwise(host.target, device.target)
