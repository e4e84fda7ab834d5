"""The legacy algorithms against independent float64 NumPy implementations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import legacy_reference as ref
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import optcore
from optcore import legacy
from optcore.t5x import HEURISTIC_RULE, Adafactor, FactorDim, HParamMap

STEPS = 5
RATES = [0.1, 0.08, 0.12, 0.05, 0.1]  # a different learning rate each step: apply-time overrides


def make_params(shapes=None, seed=0):
  rng = np.random.default_rng(seed)
  shapes = shapes or {"matrix": (6, 8), "vector": (8,), "tensor": (3, 6, 5)}
  return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def make_grads(params, seed=1):
  rng = np.random.default_rng(seed)
  return [
    {k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()}
    for _ in range(STEPS)
  ]


def run_ours(opt_def, params, grads, rates=RATES, **overrides):
  opt = opt_def.create(jax.tree.map(jnp.asarray, params))
  step = jax.jit(lambda opt, g, lr, kw: opt.apply_gradient(g, learning_rate=lr, **kw))
  for g, lr in zip(grads, rates, strict=True):
    opt = step(opt, g, jnp.float32(lr), overrides)
  return opt


def run_reference(step_fn, init_fn, params, grads, rates=RATES, per_param=None, **hp):
  out, states = {}, {}
  for name, p in params.items():
    p = p.astype(np.float64)
    extra = per_param(name, p) if per_param else {}
    s = init_fn(p, **extra)
    for t, (g, lr) in enumerate(zip(grads, rates, strict=True), start=1):
      p, s = step_fn(p, s, g[name].astype(np.float64), t, lr, **hp, **extra)
    out[name], states[name] = p, s
  return out, states


def zeros_state(*fields):
  return lambda p: {f: np.zeros(p.shape) for f in fields}


def rmsprop_init(centered):
  return lambda p: {"v": np.zeros(p.shape), "mg": np.zeros(p.shape) if centered else None}


CASES = [
  ("sgd", legacy.GradientDescent, {}, ref.sgd_step, lambda p: {}),
  ("momentum", legacy.Momentum, {"beta": 0.8, "weight_decay": 0.01}, ref.momentum_step,
   zeros_state("momentum")),
  ("momentum-nesterov", legacy.Momentum, {"beta": 0.9, "nesterov": True}, ref.momentum_step,
   zeros_state("momentum")),
  ("adam", legacy.Adam, {"beta1": 0.8, "beta2": 0.95, "weight_decay": 0.1}, ref.adam_step,
   zeros_state("grad_ema", "grad_sq_ema")),
  ("adabelief", legacy.AdaBelief, {"weight_decay": 0.05}, ref.adabelief_step,
   zeros_state("grad_ema", "grad_sq_ema")),
  ("adadelta", legacy.Adadelta, {"rho": 0.8, "weight_decay": 0.01}, ref.adadelta_step,
   zeros_state("sq_avg", "acc_delta")),
  ("adagrad", legacy.Adagrad, {"eps": 1e-6}, ref.adagrad_step, zeros_state("G")),
  ("rmsprop", legacy.RMSProp, {"beta2": 0.8}, ref.rmsprop_step, rmsprop_init(False)),
  ("rmsprop-centered", legacy.RMSProp, {"centered": True}, ref.rmsprop_step, rmsprop_init(True)),
  ("lamb", legacy.LAMB, {"weight_decay": 0.01}, ref.lamb_step,
   zeros_state("grad_ema", "grad_sq_ema")),
  ("lars", legacy.LARS, {"weight_decay": 0.01, "eps": 1e-9}, ref.lars_step,
   zeros_state("momentum")),
  ("lars-nesterov", legacy.LARS, {"nesterov": True, "trust_coefficient": 0.01}, ref.lars_step,
   zeros_state("momentum")),
]  # fmt: skip


def assert_close(ours, reference, rtol=2e-5, atol=1e-6, what=""):
  for name, want in reference.items():
    got = ours[name]
    if want is None:
      assert got is None, (what, name)
      continue
    np.testing.assert_allclose(
      np.asarray(got, np.float64), want, rtol=rtol, atol=atol, err_msg=f"{what} {name}"
    )


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_flax_optim_algorithm_matches_the_numpy_definition(case):
  _, cls, hp, step_fn, init_fn = case
  params, grads = make_params(), None
  grads = make_grads(params)
  opt = run_ours(cls(learning_rate=1.0, **hp), params, grads)
  want_params, want_states = run_reference(step_fn, init_fn, params, grads, **hp)
  # AdaBelief divides by sqrt((g - m)^2): float32 cancellation in g - m, 2e-6 seen.
  atol = 5e-6 if cls is legacy.AdaBelief else 1e-6
  assert_close(opt.target, want_params, atol=atol, what="params")
  assert int(opt.state.step) == STEPS
  state_dict = opt.state_dict()["state"]["param_states"]
  for name, want in want_states.items():
    assert set(state_dict[name]) == set(want), name  # flax.optim's field names
    assert_close(state_dict[name], want, what=f"state of {name}")


def test_a_traced_override_of_another_hyper_parameter_takes_effect():
  params = make_params()
  grads = make_grads(params)
  opt = run_ours(legacy.Momentum(1.0, beta=0.9), params, grads, beta=jnp.float32(0.5))
  want, _ = run_reference(ref.momentum_step, zeros_state("momentum"), params, grads, beta=0.5)
  assert_close(opt.target, want)


def test_lamb_never_moves_zero_parameters():
  params = {"zero": np.zeros((3, 4), np.float32), "one": np.ones(4, np.float32)}
  opt = run_ours(legacy.LAMB(0.1), params, make_grads(params))
  np.testing.assert_array_equal(opt.target["zero"], 0.0)
  assert not np.array_equal(opt.target["one"], params["one"])


# Adafactor, flax.optim's and T5X's.

ADAFACTOR_CASES = {
  "factored": {"min_dim_size_to_factor": 4},
  "unfactored": {},
  "momentum": {"min_dim_size_to_factor": 4, "beta1": 0.9},
  "no-clipping-no-scale": {
    "min_dim_size_to_factor": 4,
    "clipping_threshold": None,
    "multiply_by_parameter_scale": False,
  },
  "weight-decay": {"min_dim_size_to_factor": 4, "weight_decay_rate": 0.01, "decay_rate": 0.7},
  "tight-clipping": {"min_dim_size_to_factor": 4, "clipping_threshold": 0.1},
  "step-offset": {"min_dim_size_to_factor": 4, "step_offset": 3},
}


def _heuristic(hp):
  def per_param(name, p):
    rows, cols = ref.heuristic_roles(p.shape, hp.get("min_dim_size_to_factor", 128))
    return {"rows": rows, "cols": cols}

  return per_param


def _t5x_rules_like_the_heuristic(params, hp):
  """T5X refuses the heuristic for rank > 2: an explicit rule that factors as it would."""
  rules = []
  for name, p in params.items():
    if p.ndim > 2:
      rows, cols = ref.heuristic_roles(p.shape, hp.get("min_dim_size_to_factor", 128))
      roles = [
        FactorDim.ROW if d in rows else FactorDim.COLUMN if d in cols else FactorDim.NONE
        for d in range(p.ndim)
      ]
      rules.append((f"^{name}$", tuple(roles)))
  return HParamMap([*rules, (".*", HEURISTIC_RULE)])


def _ref_hp(hp):
  return {k: v for k, v in hp.items() if k not in ("min_dim_size_to_factor", "dtype_momentum")}


@pytest.mark.parametrize("cls", [legacy.Adafactor, Adafactor], ids=["flax", "t5x"])
@pytest.mark.parametrize("name", list(ADAFACTOR_CASES))
def test_adafactor_matches_the_numpy_definition(cls, name):
  hp = ADAFACTOR_CASES[name]
  params = make_params()
  grads = make_grads(params)
  rules = _t5x_rules_like_the_heuristic(params, hp)
  rules = {} if cls is legacy.Adafactor else {"factor_map": rules}
  opt = run_ours(cls(learning_rate=1.0, **hp, **rules), params, grads)
  init = lambda p, rows=(), cols=(): ref.adafactor_init(p, rows, cols, hp.get("beta1"))
  want, states = run_reference(
    ref.adafactor_step, init, params, grads, per_param=_heuristic(hp), **_ref_hp(hp)
  )
  assert np.all(np.isfinite(np.asarray(opt.target["matrix"])))
  assert_close(opt.target, want, rtol=5e-5, what=name)
  state_dict = opt.state_dict()["state"]["param_states"]
  for pname, want_state in states.items():
    assert set(state_dict[pname]) == {"v_row", "v_col", "v", "m"}
    assert_close(state_dict[pname], want_state, rtol=5e-5, what=f"{name} state {pname}")


@pytest.mark.parametrize("cls", [legacy.Adafactor, Adafactor], ids=["flax", "t5x"])
def test_adafactor_bfloat16_momentum(cls):
  params = make_params()
  grads = make_grads(params)
  hp = {"min_dim_size_to_factor": 4, "beta1": 0.9}
  rules = _t5x_rules_like_the_heuristic(params, hp)
  rules = {} if cls is legacy.Adafactor else {"factor_map": rules}
  opt = run_ours(cls(learning_rate=1.0, dtype_momentum=jnp.bfloat16, **hp, **rules), params, grads)
  assert opt.state.param_states["matrix"].m.dtype == jnp.bfloat16
  init = lambda p, rows=(), cols=(): ref.adafactor_init(p, rows, cols, 0.9)
  want, _ = run_reference(
    ref.adafactor_step,
    init,
    params,
    grads,
    per_param=_heuristic(hp),
    beta1=0.9,
    momentum_dtype=ref.BFLOAT16,
  )
  # The reference rounds the stored momentum to bfloat16 as well; flax.optim also
  # multiplies in bfloat16 (T5X in float32), hence the looser bound.
  assert_close(opt.target, want, rtol=1e-2, atol=1e-3)


def test_a_step_offset_above_the_step_gives_no_nan():
  params = make_params()
  opt = run_ours(legacy.Adafactor(1.0, step_offset=100), params, make_grads(params))
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(opt))


# T5X's factor rules.

T5X_SHAPES = {"attention": (6, 2, 4), "scanned": (3, 6, 8), "embedding": (10, 6), "norm": (6,)}
T5X_AXES = {
  "attention": P("embed", "heads", "kv"),
  "scanned": P("layers", "embed", "mlp"),
  "embedding": P("vocab", "embed"),
  "norm": P("embed"),
}
T5X_ROLES = {  # (batch, rows, cols) from the standard table; rank <= 2 keeps the heuristic
  "attention": {"batch": (), "rows": (0,), "cols": (1, 2)},
  "scanned": {"batch": (0,), "rows": (1,), "cols": (2,)},
}


def _t5x_reference(params, grads, hp, global_clip=None):
  min_dim = hp.get("min_dim_size_to_factor", 128)
  ref_hp = _ref_hp(hp)
  ref_hp.pop("global_norm_clip_threshold", None)
  out = {}
  for name, p in params.items():
    p = p.astype(np.float64)
    roles = T5X_ROLES.get(name) or dict(
      zip(("rows", "cols"), ref.heuristic_roles(p.shape, min_dim), strict=True)
    )
    s = ref.adafactor_init(p, roles.get("rows", ()), roles.get("cols", ()), hp.get("beta1"))
    out[name] = [p, s, roles]
  for t, (g, lr) in enumerate(zip(grads, RATES, strict=True), start=1):
    g = {k: v.astype(np.float64) for k, v in g.items()}
    if global_clip is not None:
      total = np.sqrt(sum(np.sum(v * v) for v in g.values()))
      g = {k: v * min(1.0, global_clip / total) for k, v in g.items()}
    for name, (p, s, roles) in out.items():
      out[name][:2] = ref.adafactor_step(p, s, g[name], t, lr, **roles, **ref_hp)
  return {k: v[0] for k, v in out.items()}, {k: v[1] for k, v in out.items()}


T5X_CASES = {
  "rules": {},
  "rules-momentum-wd-exponent": {
    "beta1": 0.9,
    "weight_decay_rate": 0.1,
    "weight_decay_rate_lr_exponent": 1.0,
  },
  "global-clip-max-scale": {"global_norm_clip_threshold": 0.5, "max_parameter_scale": 0.5},
}


@pytest.mark.parametrize("name", list(T5X_CASES))
def test_t5x_factor_rules_on_attention_and_scanned_params(name):
  hp = T5X_CASES[name]
  params = make_params(T5X_SHAPES)
  grads = make_grads(params)
  opt_def = Adafactor(learning_rate=1.0, **hp)
  opt_def = opt_def.with_param_axes(T5X_AXES)
  opt = run_ours(opt_def, params, grads)
  state = opt.state.param_states
  assert state["attention"].v_row.shape == (6,) and state["attention"].v_col.shape == (2, 4)
  assert state["scanned"].v_row.shape == (3, 6) and state["scanned"].v_col.shape == (3, 8)
  want, want_states = _t5x_reference(params, grads, hp, hp.get("global_norm_clip_threshold"))
  assert_close(opt.target, want, rtol=5e-5, what=name)
  state_dict = opt.state_dict()["state"]["param_states"]
  for pname, want_state in want_states.items():
    assert_close(state_dict[pname], want_state, rtol=5e-5, what=f"{name} state {pname}")


def test_t5x_derive_logical_axes_keeps_the_axes_that_survive_factoring():
  params = make_params(T5X_SHAPES)
  opt_def = Adafactor(1e-2, beta1=0.9)
  opt_def = opt_def.with_param_axes(T5X_AXES)
  axes = opt_def.derive_logical_axes(opt_def.create(params), T5X_AXES).state.param_states
  assert (axes["attention"].v_row, axes["attention"].v_col) == (P("embed"), P("heads", "kv"))
  assert (axes["scanned"].v_row, axes["scanned"].v_col) == (
    P("layers", "embed"),
    P("layers", "mlp"),
  )
  assert axes["scanned"].m == P("layers", "embed", "mlp") and axes["norm"].v == P("embed")
  assert axes["embedding"].v == P("vocab", "embed")  # below min_dim_size_to_factor: unfactored


def test_invalid_factor_rules_raise_clear_errors():
  opt_def = Adafactor(1e-2)
  with pytest.raises(ValueError, match=r"'w'.*ROW, COLUMN and NONE"):
    opt_def.with_param_axes({"w": P("embed", "mlp", "relpos_buckets")})
  with pytest.raises(KeyError, match=r"\['spatial'\].*'w'.*logical_factor_rules"):
    opt_def.with_param_axes({"w": P("embed", "spatial")})
  # T5X maps its rules over the axes tree: a parameter without axes gets no rule, and its
  # lookup fails at create, naming it.
  no_axes = Adafactor(1e-2).with_param_axes({"w": None, "v": P("embed", "mlp")})
  with pytest.raises(KeyError, match="'w'"):
    no_axes.create({"w": jnp.ones((2, 3)), "v": jnp.ones((2, 3))})
  explicit = Adafactor(1e-2, factor_map=HParamMap([(r".*", optcore.t5x.HEURISTIC_RULE)]))
  for rank_3 in (explicit, Adafactor(1e-2)):  # T5X: with or without factor_map
    rank_3_message = r"rank strictly higher than 2 .*explicit.*: w, \(2, 3, 4\)"
    with pytest.raises(ValueError, match=rank_3_message):
      rank_3.create({"w": jnp.ones((2, 3, 4))})
  with pytest.raises(ValueError, match="incorrect rank for param of rank 1"):
    Adafactor(1e-2, factor_map=HParamMap([(r".*", (FactorDim.ROW, FactorDim.COLUMN))])).create(
      {"w": jnp.ones(3)}
    )
  with pytest.raises(ValueError, match="factored is False but factorization rules"):
    Adafactor(1e-2, factored=False, factor_map=HParamMap([(r".*", None)]))
  with pytest.raises(KeyError, match="no rule in this HParamMap matches"):
    Adafactor(1e-2, factor_map=HParamMap([(r"^x$", (FactorDim.ROW,))])).create({"w": jnp.ones(3)})


def test_custom_logical_rules_and_missing_column_keep_batch_unfactored():
  opt_def = Adafactor(1e-2, logical_factor_rules={"spatial": "none"})
  opt_def = opt_def.with_param_axes({"w": P("layers", "embed", "spatial")})  # BATCH, ROW, NONE
  state = opt_def.create({"w": jnp.ones((2, 3, 4))}).state.param_states["w"]
  assert state.v.shape == (2, 3, 4) and state.v_row.shape == (1,)


def test_skip_nan_updates_keeps_the_old_values_where_the_new_are_nan():
  params = {"w": jnp.ones((2, 3))}
  grads = {"w": jnp.ones((2, 3)).at[0, 0].set(jnp.nan)}
  opt = Adafactor(0.1, skip_nan_updates=True, clipping_threshold=None).create(params)
  new = opt.apply_gradient(grads)
  assert np.array_equal(np.isnan(np.asarray(new.target["w"])), np.zeros((2, 3), bool))
  assert new.target["w"][0, 0] == 1.0 and new.target["w"][1, 1] != 1.0


def test_per_path_parameter_scale():
  scale = HParamMap([(r"embedding", False), (r".*", True)])
  params = {"embedding": jnp.full((2, 3), 4.0), "other": jnp.full((2, 3), 4.0)}
  opt = Adafactor(0.1, multiply_by_parameter_scale=scale).create(params)
  grads = jax.tree.map(jnp.ones_like, params)
  new = opt.apply_gradient(grads).target
  # The step is lr * y (y = 1 after clipping) without the scale, lr * rms(p) * y with it.
  np.testing.assert_allclose(new["embedding"], 4.0 - 0.1, rtol=1e-6)
  np.testing.assert_allclose(new["other"], 4.0 - 0.1 * 4.0, rtol=1e-6)


LEGACY_DEFS = {
  "sgd": lambda: legacy.GradientDescent(0.1),
  "momentum": lambda: legacy.Momentum(0.1, nesterov=True),
  "adam": lambda: legacy.Adam(0.1, weight_decay=0.01),
  "adabelief": lambda: legacy.AdaBelief(0.1),
  "adadelta": lambda: legacy.Adadelta(1.0),
  "adagrad": lambda: legacy.Adagrad(0.1),
  "rmsprop": lambda: legacy.RMSProp(0.1, centered=True),
  "lamb": lambda: legacy.LAMB(0.1),
  "lars": lambda: legacy.LARS(0.1),
  "adafactor": lambda: legacy.Adafactor(0.1, min_dim_size_to_factor=4, beta1=0.9),
  # T5X needs an explicit rule for the rank-3 'tensor': (layers, embed, heads).
  "t5x-adafactor": lambda: Adafactor(
    0.1,
    min_dim_size_to_factor=4,
    factor_map=HParamMap(
      [("tensor", (FactorDim.BATCH, FactorDim.ROW, FactorDim.COLUMN)), (".*", HEURISTIC_RULE)]
    ),
  ),
  "weight-norm": lambda: legacy.WeightNorm(legacy.Momentum(0.1), wn_decay=0.01),
}


@pytest.mark.parametrize("make", list(LEGACY_DEFS.values()), ids=list(LEGACY_DEFS))
def test_legacy_definitions_work_through_as_optax(make):
  import optax

  params = jax.tree.map(jnp.asarray, make_params())
  grads = make_grads(params)
  opt = make().create(params)
  tx = make().as_optax()
  state, expected = tx.init(params), params
  for g in grads:
    opt = opt.apply_gradient(g)
    updates, state = tx.update(g, state, expected)
    expected = optax.apply_updates(expected, updates)
  # as_optax returns new - old: apply_updates lands there up to one rounding.
  for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(opt.target), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_weight_norm_matches_its_definition():
  """Direction and scale from the VJP of scale * d / |d|, the direction decayed."""
  w = make_params({"w": (4, 3)})["w"].astype(np.float64)
  grads = make_grads({"w": w})
  eps, decay, lr = 1e-8, 0.01, 0.1
  scale = np.sqrt(np.sum(w * w, axis=0, keepdims=True) + eps)
  direction = w / scale
  for g in grads:
    g = g["w"].astype(np.float64)
    n = np.sqrt(np.sum(direction**2, axis=0, keepdims=True) + eps)
    scale_grad = np.sum(g * direction / n, axis=0, keepdims=True)
    direction_grad = (
      scale / n * g - scale * direction * np.sum(g * direction, axis=0, keepdims=True) / n**3
    )
    direction = direction - lr * (direction_grad + decay * direction)
    scale = scale - lr * scale_grad
  expected = scale * direction / np.sqrt(np.sum(direction**2, axis=0, keepdims=True) + eps)
  opt = run_ours(
    legacy.WeightNorm(legacy.GradientDescent(1.0), wn_decay=decay),
    {"w": w.astype(np.float32)},
    grads,
    rates=[lr] * STEPS,
  )
  np.testing.assert_allclose(opt.target["w"], expected, rtol=1e-5, atol=1e-6)
  assert set(opt.state_dict()["state"]["param_states"]["w"]) == {
    "direction_state", "scale_state", "direction", "scale"
  }  # fmt: skip


def test_dynamic_scale_follows_its_definition():
  dyn = legacy.DynamicScale(growth_factor=2.0, backoff_factor=0.5, growth_interval=2, scale=4.0)
  fin = lambda w: jnp.sum(w**2)
  scales, fin_steps = [], []
  for w in [1.0, 1.0, 1.0, jnp.inf, 1.0]:
    dyn, finite, loss, grad = dyn.value_and_grad(fin)(jnp.asarray([w]))
    scales.append(float(dyn.scale))
    fin_steps.append(int(dyn.fin_steps))
    if w == 1.0:
      assert bool(finite) and float(loss) == 1.0 and float(grad[0]) == 2.0
    else:
      assert not bool(finite)
  # Grows when fin_steps == interval (checked before counting), backs off on inf.
  assert scales == [4.0, 4.0, 8.0, 4.0, 4.0]
  assert fin_steps == [1, 2, 0, 0, 1]
  _, _, (loss, aux), _ = legacy.DynamicScale().value_and_grad(
    lambda w: (jnp.sum(w), "aux"), has_aux=True
  )(jnp.ones(2))
  assert float(loss) == 2.0 and aux == "aux"


@pytest.mark.parametrize("make", list(LEGACY_DEFS.values()), ids=list(LEGACY_DEFS))
def test_legacy_state_axes_have_the_rank_of_each_leaf(make):
  params = make_params()
  axes = {"matrix": P("embed", "mlp"), "vector": P("mlp"), "tensor": P("layers", "embed", "heads")}
  opt = make().create(jax.tree.map(jnp.asarray, params))
  derived = opt.optimizer_def.derive_logical_axes(opt, axes)
  state_leaves = jax.tree.leaves(opt.state)
  spec_leaves = jax.tree.leaves(derived.state)
  assert len(state_leaves) == len(spec_leaves)
  for leaf, spec in zip(state_leaves, spec_leaves, strict=True):
    assert len(spec) == leaf.ndim, (leaf.shape, spec)
  assert derived.restore_state(derived.state_dict()) == derived


def test_eager_steps_equal_jitted_steps_for_bias_corrected_algorithms():
  """Eager steps share one bias correction per step across parameters; the numbers
  equal the jitted steps, including after the step object changes."""
  params = jax.tree.map(jnp.asarray, make_params())
  grads = make_grads(params)
  for make in (lambda: legacy.Adam(0.1, weight_decay=0.01), lambda: legacy.LAMB(0.1)):
    eager, jitted = make().create(params), make().create(params)
    step = jax.jit(lambda o, g: o.apply_gradient(g))
    for g in grads:
      eager, jitted = eager.apply_gradient(g), step(jitted, g)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
