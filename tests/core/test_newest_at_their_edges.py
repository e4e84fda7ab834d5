"""The newest optimizers at their edges, and every argument checked by one declaration
(issue 62): arguments refused when the definition is made, naming the argument and what it
takes; state dtypes fixed at ``create``; complex and zero-size parameters; a NaN that shows;
the cautious mask and decoupled decay inside the wrapped optimizer; read-outs that gather every
wrapper's keys; the override route through chains; a Dion transplant's count; and the
skip window with no spread.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from tree_testing import assert_trees_equal, assert_trees_within_ulps

import optcore
from optcore import config

PARAMS = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(4, 3), "b": jnp.linspace(0.5, 1.0, 3)}
GRADS = jax.tree.map(lambda x: 0.1 * jnp.cos(3 * x), PARAMS)


def step(opt_def, params=PARAMS, grads=GRADS, n=1, **overrides):
  opt = opt_def.create(params)
  for _ in range(n):
    opt = opt.apply_gradient(grads, **overrides)
  return opt


# 1. One declaration per factory: refused when the definition is made, naming the argument.


@pytest.mark.parametrize(
  ("build", "message"),
  [
    (lambda: optcore.adamw("1e-3"), r"adamw: learning_rate .*the string '1e-3'.*=0\.001"),
    (lambda: optcore.adam(1e-3, b1=float("nan")), r"adam: b1 must be a number; got nan"),
    (lambda: optcore.sgd(float("inf")), r"sgd: learning_rate .*got inf"),
    (lambda: optcore.contrib.mars(1e-3, b1="0.9"), r"mars: b1 must be a number in \[0, 1\)"),
    (lambda: optcore.contrib.mars(1e-3, b2=1.0), r"b2 must be a number in \[0, 1\); got 1\.0"),
    (lambda: optcore.contrib.mars(1e-3, betas_1d=(0.9,)), r"betas_1d must be a tuple of 2"),
    (lambda: optcore.contrib.mars(1e-3, betas_1d=(0.9, 1.5)), r"betas_1d\[1\] must be"),
    (lambda: optcore.contrib.mars(1e-3, mars_type="mars-shampoo"), r"mars_type .*not here"),
    (lambda: optcore.contrib.dion(1e-3, power_iters=1.5), r"power_iters must be an integer"),
    (lambda: optcore.contrib.dion(1e-3, rank_multiple_of=2.5), r"rank_multiple_of=2\)"),
    (lambda: optcore.contrib.dion(1e-3, rcqr_oversample=0), r"rcqr_oversample must be .*>= 1"),
    (lambda: optcore.contrib.dion(1e-3, rank_fraction=0.0), r"rank_fraction .*in \(0, 1\]"),
    (lambda: optcore.contrib.normuon(1e-3, beta2=-0.1), r"normuon: beta2 must be"),
    (lambda: optcore.contrib.normuon(1e-3, adam_eps="1e-8"), r"adam_eps .*the string"),
    (
      lambda: optcore.zclip(optcore.sgd(0.1), max_grad_norm=float("nan")),
      r"zclip: max_grad_norm must be a number > 0 or None; got nan",
    ),
    (lambda: optcore.zclip(optcore.sgd(0.1), warmup_steps=2.5), r"warmup_steps must be an int"),
    (lambda: optcore.ema(optcore.sgd(0.1), 1.0), r"ema: decay must be a number in \[0, 1\)"),
    (lambda: optcore.accumulate(optcore.sgd(0.1), every=0), r"every must be an integer >= 1"),
    (lambda: optcore.skip_bad_steps(optcore.sgd(0.1), sigmas=True), r"sigmas must be a number"),
    (
      lambda: optcore.schedules.warmup_stable_decay(float("inf"), total_steps=10),
      r"warmup_stable_decay: peak_value must be a number; got inf",
    ),
    (
      lambda: optcore.schedules.warmup_stable_decay(1.0, total_steps=10, decay_shape="cos"),
      r"decay_shape must be one of 'linear', 'cosine', '1-sqrt'",
    ),
  ],
)
def test_an_argument_it_does_not_take_is_refused_when_the_definition_is_made(build, message):
  with pytest.raises(optcore.ArgumentError, match=message) as caught:
    build()
  # a TypeError and a ValueError both: the checks it replaces raised one or the other
  assert isinstance(caught.value, TypeError) and isinstance(caught.value, ValueError)


def test_numpy_scalars_are_numbers_and_a_pair_is_stored_as_a_tuple():
  average = optcore.ema(optcore.sgd(0.1), np.float32(0.5))
  assert type(average.decay) is float and average.decay == 0.5
  assert optcore.accumulate(optcore.sgd(0.1), np.int64(2)).every == 2
  from_list = optcore.contrib.mars(1e-2, betas_1d=[0.8, 0.9])
  assert from_list.hyper_params.betas_1d == (0.8, 0.9)
  assert from_list == optcore.contrib.mars(1e-2, betas_1d=(0.8, 0.9))
  back = config.from_config(config.to_config(optcore.contrib.mars(1e-2, betas_1d=(0.8, 0.9))))
  assert type(back.hyper_params.betas_1d) is tuple
  # optax's own factories keep a NumPy scalar as it is: the program is optax's own
  assert type(optcore.adam(1e-3, b1=np.float32(0.9)).hyper_params.b1) is np.float32


def test_a_traced_value_passes_where_only_a_range_would_read_it():
  def build(b1):
    return optcore.contrib.mars(1e-2, b1=b1).create(PARAMS).apply_gradient(GRADS).target["w"]

  traced = jax.jit(build)(jnp.float32(0.9))
  # a constant b1 is folded into the program, a traced one is not: measured 1 ulp apart
  assert_trees_within_ulps(traced, build(0.9), ulps=2)
  with pytest.raises(optcore.ArgumentError, match=r"power_iters .*traced"):
    jax.jit(lambda n: optcore.contrib.dion(1e-2, power_iters=n))(2)


@pytest.mark.parametrize(
  ("cfg", "field"),
  [
    ({"name": "contrib.mars", "learning_rate": 1e-3, "b1": 1.5}, "b1"),
    ({"name": "contrib.dion", "learning_rate": 1e-3, "power_iters": 1.5}, "power_iters"),
    ({"name": "contrib.mars", "learning_rate": 1e-3, "betas_1d": [0.8]}, "betas_1d"),
    (
      {
        "name": "multi",
        "groups": [
          {
            "select": "w$",
            "optimizer": {
              "name": "ema",
              "decay": 1.5,
              "optimizer": {"name": "adam", "learning_rate": 1e-3},
            },
          }
        ],
      },
      "groups[0].optimizer.decay",
    ),
  ],
)
def test_a_config_names_the_field_of_a_declared_argument(cfg, field):
  with pytest.raises(config.ConfigError) as caught:
    config.from_config(cfg)
  assert str(caught.value).startswith(f"at {field!r}:"), str(caught.value)


# 2. State dtypes fixed at create; complex, zero-size and NaN.


@pytest.mark.parametrize("name", ["normuon", "mars", "dion"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_the_state_keeps_the_dtypes_create_gave_it(name, dtype):
  params = jax.tree.map(lambda x: x.astype(dtype), PARAMS)
  opt_def = getattr(optcore.contrib, name)(1e-2)
  opt = opt_def.create(params)
  kinds = lambda state: jax.tree.map(lambda x: (x.shape, x.dtype), state)
  # float32 gradients for low-precision parameters: MARS kept their dtype as its last_grad
  stepped = opt.apply_gradient(jax.tree.map(lambda g: g.astype(jnp.float32), GRADS))
  assert kinds(stepped.state) == kinds(opt.state)
  # so lax.scan takes the step (it refuses a carry whose dtype changes)
  scanned, _ = jax.lax.scan(lambda o, _: (o.apply_gradient(GRADS), None), opt, None, length=2)
  assert kinds(scanned.state) == kinds(opt.state)


@pytest.mark.parametrize("name", ["normuon", "mars", "dion"])
def test_complex_parameters_are_refused_naming_the_path(name):
  params = {"w": jnp.ones((4, 3), jnp.complex64)}
  with pytest.raises(TypeError, match=rf"{name}: the parameter at '/w' is complex64.*split_real"):
    getattr(optcore.contrib, name)(1e-2).create(params)


@pytest.mark.parametrize("name", ["normuon", "dion", "mars"])
@pytest.mark.parametrize("shape", [(0, 3), (3, 0)])
def test_a_zero_size_matrix_stays_as_it_is(name, shape):
  params = {"w": jnp.ones(shape), "b": PARAMS["b"]}
  grads = {"w": jnp.ones(shape), "b": GRADS["b"]}
  opt = step(getattr(optcore.contrib, name)(1e-2), params, grads, n=2)
  assert opt.target["w"].shape == shape
  assert bool(jnp.all(jnp.isfinite(opt.target["b"])))
  assert not bool(jnp.all(opt.target["b"] == params["b"]))  # the others still move


def test_a_nan_in_a_dion_gradient_shows_in_the_parameters():
  """As in every optax optimizer: the QR's clean-up hid it, and the matrix stopped moving."""
  opt_def = optcore.contrib.dion(1e-2)
  opt = opt_def.create(PARAMS).apply_gradient(
    {"w": GRADS["w"].at[0, 0].set(jnp.nan), "b": GRADS["b"]}
  )
  assert bool(jnp.isnan(opt.target["w"]).any())
  assert bool(jnp.all(jnp.isfinite(opt.target["b"])))
  # finite gradients: the same numbers as before the check (where picks the same value)
  clean = step(opt_def, n=3)
  assert bool(jnp.all(jnp.isfinite(clean.target["w"])))


# 3. cautious: the decoupled decay inside the wrapped optimizer is never masked.


@pytest.mark.parametrize(
  "build",
  [
    lambda: optcore.adamw(0.1, weight_decay=0.5),
    lambda: optcore.chain([optax.clip_by_global_norm(1.0), optcore.adamw(0.1, weight_decay=0.5)]),
    lambda: optcore.contrib.normuon(0.1, weight_decay=0.5, adam_weight_decay=0.5),
    lambda: optcore.contrib.muon(0.1, weight_decay=0.5, adam_weight_decay=0.5),
    lambda: optcore.contrib.schedule_free(optcore.adamw(0.1, weight_decay=0.5), 0.1),
  ],
  ids=["adamw", "chain", "normuon", "muon", "schedule_free"],
)
def test_cautious_never_masks_the_decoupled_decay(build):
  """Zero gradients: the mask drops every component of the step, and the decay is what is
  left; the authors' AdamW and Lion decay every component."""
  zeros = jax.tree.map(jnp.zeros_like, PARAMS)
  plain = step(build(), grads=zeros).target
  masked = step(optcore.cautious(build()), grads=zeros).target
  # masked(step without decay) + (step - step without decay): measured at most 1 ulp from
  # the step (schedule-free's); the decay masked away would be 5% of each parameter
  assert_trees_within_ulps(masked, plain, ulps=2)
  assert not bool(jnp.all(masked["w"] == PARAMS["w"]))  # the decay moved it


# 4. Read-outs gather every wrapper's keys.


@pytest.mark.parametrize(
  "build",
  [
    lambda d: optcore.with_statistics(optcore.zclip(d, warmup_steps=2)),
    lambda d: optcore.zclip(optcore.with_statistics(d), warmup_steps=2),
  ],
  ids=["statistics(zclip)", "zclip(statistics)"],
)
def test_statistics_reads_both_wrappers_in_either_order(build):
  stats = optcore.statistics(step(build(optcore.adam(1e-2))))
  assert {"global/grad_norm", "w/update_norm", "zclip/grad_norm", "zclip/clip_norm"} <= set(stats)


# 5. One override route through every container, chains included.


def _moved(opt_def, **overrides):
  new = step(opt_def, **overrides).target
  return {k: float(jnp.max(jnp.abs(new[k] - PARAMS[k]))) for k in PARAMS}


def test_a_rate_override_reaches_a_chain_inside_a_group():
  chained = optcore.chain([optax.clip_by_global_norm(1.0), optcore.adamw(1e-2)])
  one = optcore.MultiOptimizer(("w$", chained), ("b$", optcore.sgd(0.1)))
  assert _moved(one, learning_rate=0.0) == {"w": 0.0, "b": 0.0}
  two = optcore.MultiOptimizer(("w$", chained), ("b$", optcore.chain([optcore.sgd(0.1)])))
  assert _moved(two, learning_rate=0.0) == {"w": 0.0, "b": 0.0}
  # one group by its index, as current_hyper_params names it
  only_b = _moved(two, **{"1/learning_rate": 0.0})
  assert only_b["b"] == 0.0 and only_b["w"] > 0


def test_a_chain_takes_the_path_current_hyper_params_reports():
  chained = optcore.chain([optax.clip_by_global_norm(1.0), optcore.adamw(1e-2)])
  names = optcore.current_hyper_params(chained.create(PARAMS))
  assert "transformations/1/learning_rate" in names
  assert _moved(chained, **{"transformations/1/learning_rate": 0.0}) == {"w": 0.0, "b": 0.0}
  with pytest.raises(TypeError, match="names no member"):
    step(chained, **{"transformations/5/learning_rate": 0.0})


# 6. A Dion transplant with a new parameter restarts the count with its new moments.


def test_a_dion_transplant_with_a_new_parameter_starts_the_count_anew():
  opt_def = optcore.contrib.dion(1e-2)
  old = step(opt_def, n=3)
  grown = {**PARAMS, "c": jnp.ones(5)}
  new, report = optcore.transplant(opt_def.create(grown), old.state_dict())
  assert int(new.state.param_states.count) == 0  # its key is no count
  assert "param_states/count" in str(report)
  assert_trees_equal(new.state.param_states.key, old.state.param_states.key)


# 7. skip_bad_steps: a window with no spread does not stall.


def test_a_window_of_equal_norms_does_not_skip_every_later_step():
  opt_def = optcore.skip_bad_steps(optcore.sgd(0.1), window=4, warmup=2)
  opt = opt_def.create(PARAMS)
  for i in range(8):  # four equal norms, then norms 1% larger
    opt = opt.apply_gradient(GRADS if i < 4 else jax.tree.map(lambda g: 1.01 * g, GRADS))
  assert int(optcore.skipped_steps(opt)) == 0
  spiked = opt.apply_gradient(jax.tree.map(lambda g: 10.0 * g, GRADS))
  assert int(optcore.skipped_steps(spiked)) == 1  # a spike still is one


# 8. A wrapper inside a chain: refused when the chain is made, with the fix; in a config, at
# the member's path.


def test_a_wrapper_in_a_chain_is_refused_with_the_fix():
  averaged = optcore.ema(optcore.adam(1e-3), 0.9)
  with pytest.raises(TypeError, match=r"transformations\[1\] is ema\(adam\).*optcore\.ema\("):
    optcore.chain([optax.clip_by_global_norm(1.0), averaged])
  # the fix it gives: its optax face chains
  chained = optcore.chain([optax.clip_by_global_norm(1.0), averaged.as_optax()])
  assert bool(jnp.all(jnp.isfinite(step(chained).target["w"])))
  cfg = {
    "name": "chain",
    "transformations": [{"name": "ema", "decay": 0.9, "optimizer": {"name": "adam"}}],
  }
  cfg["transformations"][0]["optimizer"]["learning_rate"] = 1e-3
  with pytest.raises(config.ConfigError, match=r"^at 'transformations\[0\]': transformations"):
    config.from_config(cfg)


def test_a_number_over_a_scheduled_rate_says_to_override_with_a_schedule():
  scheduled = optcore.adamw(
    optcore.schedules.warmup_stable_decay(1e-2, total_steps=8, warmup_steps=2)
  )
  with pytest.raises(ValueError, match=r"built with a schedule for learning_rate.*lambda count"):
    step(scheduled, learning_rate=0.0)
  assert _moved(scheduled, learning_rate=lambda count: 0.0) == {"w": 0.0, "b": 0.0}


@pytest.mark.filterwarnings("ignore:Specifying a key will be required")  # optax's own warning
def test_every_weight_decay_is_declared_where_its_optimizer_is_defined():
  """cautious reads which hyper-parameters are weight decays from their declaration (the
  factory's arguments, a legacy class's ``weight_decays``), never from a name: this checks the
  declarations are complete for every optimizer optcore defines (the names are read here, in
  the test, to find what must be declared)."""
  looks_like_decay = {"weight_decay", "weight_decay_rate", "weight_decay_1d", "adam_weight_decay"}
  definitions = [getattr(optcore, n)(1e-3) for n in optcore.OPTAX_ALIASES if n != "lbfgs"]
  required = {"shampoo": {"block_size": 8}}  # the others need a rate only
  definitions += [
    getattr(optcore.contrib, n)(learning_rate=1e-3, **required.get(n, {}))
    for n in optcore.contrib.CONTRIB_OPTIMIZERS
    if n not in ("dpsgd", "mechanize", "sam", "schedule_free", "split_real_and_imaginary")
  ]
  definitions += [optcore.legacy.Adam(1e-3), optcore.legacy.LAMB(1e-3), optcore.t5x.Adafactor()]
  for opt_def in definitions:
    expected = looks_like_decay & set(opt_def.hyper_params)
    assert set(opt_def.weight_decay_names()) == expected, opt_def.display_name()
  # a user's own wrap of optax's factory reads the same declaration
  assert optcore.wrap_optax_optimizer(optax.adamw)(0.1).weight_decay_names() == ("weight_decay",)
