"""What every definition wrapper shares: a flag it does not change is the wrapped definition's
(per-example gradients, legacy state dicts, constructor-only hyper-parameters, ...), by
construction, so a new flag on `OptimizerDef` reaches every wrapper without a line in it."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optcore
from optcore import legacy
from optcore._src.definitions.wrapper import StateWrapper

WRAPPERS = {
  "accumulate": lambda d: optcore.accumulate(d, every=2),
  "ema": lambda d: optcore.ema(d, 0.9),
  "mixed_precision": lambda d: optcore.mixed_precision(d, state_dtype=jnp.bfloat16),
  "skip_bad_steps": lambda d: optcore.skip_bad_steps(d, window=4, warmup=2),
  "with_statistics": lambda d: optcore.with_statistics(d, {"w": "w"}),
  "low_bit_state": lambda d: optcore.low_bit_state(d, bits=8, block_size=2, min_size=0),
  "stochastic_rounding": lambda d: optcore.stochastic_rounding(d, seed=1),
}
INNER = {
  "adam": lambda: optcore.adam(1e-2),
  "legacy-adafactor": lambda: legacy.Adafactor(1e-2),
  "legacy-momentum": lambda: legacy.Momentum(0.1),
  "dpsgd": lambda: optcore.contrib.dpsgd(0.1, l2_norm_clip=1.0, noise_multiplier=0.0, seed=0),
  "multi": lambda: optcore.MultiOptimizer(("w", optcore.adam(1e-2)), ("b", optcore.sgd(0.1))),
}


@pytest.mark.parametrize("inner", sorted(INNER))
@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_a_wrapper_keeps_every_flag_it_does_not_change(wrapper, inner):
  wrapped_def = INNER[inner]()
  if wrapper == "accumulate" and wrapped_def.per_example_gradients:
    with pytest.raises(TypeError, match="per-example"):
      WRAPPERS[wrapper](wrapped_def)
    return
  opt_def = WRAPPERS[wrapper](wrapped_def)
  changed = type(opt_def).changes
  for flag in optcore.OptimizerDef.FLAGS:
    want = changed.get(flag, getattr(wrapped_def, flag))
    assert getattr(opt_def, flag) == want, flag


@pytest.mark.parametrize(
  "wrapper",
  [
    "ema",
    "mixed_precision",
    "skip_bad_steps",
    "with_statistics",
    "low_bit_state",
    "stochastic_rounding",
  ],
)
def test_per_example_gradients_pass_through_a_wrapper_as_bare_dpsgd_takes_them(wrapper):
  """ema(dpsgd) and mixed_precision(dpsgd) refused the gradients bare dpsgd takes (issue 37)."""
  params = {"w": jnp.ones((3,)), "b": jnp.zeros((2,))}
  per_example = {"w": jnp.arange(12.0).reshape(4, 3) / 10, "b": jnp.ones((4, 2))}
  bare = INNER["dpsgd"]().create(params).apply_gradient(per_example)
  # dpsgd without momentum keeps no state: low-bit state has nothing to quantize, and says so
  said = wrapper == "low_bit_state"
  with pytest.warns(UserWarning, match="quantizes nothing") if said else contextlib.nullcontext():
    opt = WRAPPERS[wrapper](INNER["dpsgd"]()).create(params)
  opt = opt.apply_gradient(per_example)
  for name in params:
    np.testing.assert_allclose(opt.target[name], bare.target[name], rtol=1e-6)
  with pytest.raises(optcore.TreeMismatchError, match="'/w'"):
    opt.apply_gradient({"w": jnp.ones((4, 2)), "b": jnp.ones((4, 2))})


def test_a_longer_windows_mini_step_is_refused_on_restore_and_transplant():
  """A state written by accumulate(every=4) at mini_step 3 restored into every=2: four gradients
  were silently dropped (issue 37). Refused, naming the path, the bound and the fix; the
  optimizer it was read into is unchanged; a window as long or longer takes it."""
  params = {"w": jnp.ones(2)}
  written = optcore.accumulate(optcore.adam(1e-2), every=4).create(params)
  for _ in range(3):
    written = written.apply_gradient({"w": jnp.ones(2)})
  saved = written.state_dict()
  shorter = optcore.accumulate(optcore.adam(1e-2), every=2).create(params)
  before = shorter.state_dict()
  message = r"'state/param_states/mini_step': expected a count below every=2.*found 3.*every=4"
  with pytest.raises(optcore.StateDictError, match=message):
    shorter.restore_state(saved)
  with pytest.raises(optcore.StateDictError, match=message):
    optcore.transplant(shorter, saved)
  nested = optcore.ema(optcore.accumulate(optcore.adam(1e-2), every=2), 0.9).create(params)
  nested_saved = optcore.ema(optcore.accumulate(optcore.adam(1e-2), every=4), 0.9).create(params)
  for _ in range(3):
    nested_saved = nested_saved.apply_gradient({"w": jnp.ones(2)})
  with pytest.raises(optcore.StateDictError, match="mini_step"):
    nested.restore_state(nested_saved.state_dict())
  assert_equal = np.testing.assert_array_equal
  for got, want in zip(jax.tree.leaves(shorter.state_dict()), jax.tree.leaves(before), strict=True):
    assert_equal(got, want)
  longer = optcore.accumulate(optcore.adam(1e-2), every=8).create(params).restore_state(saved)
  assert int(longer.state.param_states.mini_step) == 3


@pytest.mark.parametrize(
  "make",
  [
    lambda: optcore.mixed_precision(optcore.adam(1e-2), master_dtype=jnp.float64),
    lambda: optcore.mixed_precision(optcore.adam(1e-2), state_dtype=jnp.float64),
    lambda: optcore.ema(optcore.adam(1e-2), dtype=jnp.float64),
    lambda: optcore.accumulate(optcore.adam(1e-2), every=2, dtype=jnp.float64),
  ],
  ids=["master", "state", "ema", "accumulate"],
)
def test_a_64_bit_dtype_with_x64_off_is_refused_at_construction(make):
  """JAX makes every float64 array float32 while x64 is off: a float64 master copy would be a
  float32 one, silently (issue 37)."""
  assert not jax.config.jax_enable_x64
  with pytest.raises(TypeError, match=r"float64 needs 64-bit JAX.*jax_enable_x64"):
    make()


def test_every_wrapper_is_in_the_composition_table():
  """A new wrapper joins the composition matrix (every face, every pair, the mesh) by one line
  in tests/support/composition.py; this test fails until it has that line and, for a wrapper
  with state, a NamedTuple state_type with inner first (development page, "A new definition
  wrapper")."""
  from composition import WRAPPERS as TABLE

  from optcore._src.definitions import wrapper

  state_wrappers = {
    n: c for n, c in wrapper.WRAPPERS.items() if issubclass(c, wrapper.StateWrapper)
  }
  assert set(state_wrappers) == set(TABLE)
  assert set(wrapper.WRAPPERS) == {*TABLE, "grouped"}  # grouped: tests/core/test_grouped.py
  for name, make in TABLE.items():
    state = make(optcore.adam(1e-2)).init_state({"w": jnp.ones(2)}).param_states
    assert type(state) is state_wrappers[name].state_type, name
    assert isinstance(state, wrapper.wrapper_states()), name
    assert state._fields[0] == "inner", name


@pytest.mark.parametrize(
  "name",
  [
    "accumulate",
    "mixed_precision",
    "ema",
    "skip_bad_steps",
    "with_statistics",
    "low_bit_state",
    "stochastic_rounding",
    "grouped",
  ],
)
def test_every_wrapper_writes_and_reads_its_config_from_its_own_table(name):
  """to_config/from_config read a wrapper's config_arguments: no per-wrapper branch to forget.
  Each argument set away from its default is written, and read back into an equal definition."""
  from optcore._src.definitions import wrapper

  cls = wrapper.WRAPPERS[name]
  chosen = {
    "accumulate": {"every": 3, "dtype": "bfloat16"},
    "mixed_precision": {"state_dtype": "bfloat16", "master_dtype": "float32"},
    "ema": {"decay": 0.5, "debias": True, "dtype": "float32"},
    "grouped": {"max_leaf_size": 7, "max_buffer_size": 11},
    "skip_bad_steps": {"window": 20, "sigmas": 4.0, "warmup": 5, "watch": "loss"},
    "with_statistics": {"groups": {"attention": "/attn/", "mlp": "/mlp/"}},
    "low_bit_state": {
      "bits": 4,
      "block_size": 64,
      "states": "nu",
      "min_size": 1024,
      "rounding": "bitsandbytes_cpu",
    },
    "stochastic_rounding": {"seed": 3},
  }[name]
  assert set(chosen) == set(cls.config_arguments)
  config = {"name": name, **chosen, "optimizer": {"name": "adam", "learning_rate": 0.01}}
  opt_def = optcore.config.from_config(config)
  assert type(opt_def) is cls
  assert optcore.config.to_config(opt_def) == config
  with pytest.raises(optcore.config.ConfigError, match=rf"{name!r} takes"):
    optcore.config.from_config({**config, "unknown": 1})


def test_a_flag_the_wrapper_does_not_name_is_inherited_by_grouped_too():
  """grouped copied four flags by hand (per_example_gradients and elementwise were missed); it is
  a protocol wrapper now, and changes groups_parameters only."""
  inner = legacy.Momentum(0.1)
  opt_def = optcore.grouped(inner)
  for flag in optcore.OptimizerDef.FLAGS:
    want = True if flag == "groups_parameters" else getattr(inner, flag)
    assert getattr(opt_def, flag) == want, flag


def test_a_groups_accumulation_is_checked_on_restore_naming_the_groups_path():
  """accumulate around one MultiOptimizer group: a longer window's mini_step was read into a
  shorter one silently (the group's checks were not asked). Refused, naming the group's path;
  under another wrapper the path goes through its inner."""
  params = {"w": jnp.ones(2), "b": jnp.ones(2)}

  def multi(every):
    return optcore.MultiOptimizer(
      ("w", optcore.accumulate(optcore.adam(1e-2), every=every)), ("b", optcore.sgd(0.1))
    )

  written = multi(4).create(params)
  for _ in range(3):
    written = written.apply_gradient(params)
  with pytest.raises(optcore.StateDictError, match=r"'state/param_states/0/mini_step'.*every=2"):
    multi(2).create(params).restore_state(written.state_dict())
  assert int(multi(4).create(params).restore_state(written.state_dict()).state.step) == 3

  nested = optcore.ema(optcore.accumulate(optcore.adam(1e-2), every=4), 0.9).create(params)
  for _ in range(3):
    nested = nested.apply_gradient(params)
  shorter = optcore.ema(optcore.accumulate(optcore.adam(1e-2), every=2), 0.9).create(params)
  with pytest.raises(optcore.StateDictError, match=r"'state/param_states/inner/mini_step'"):
    shorter.restore_state(nested.state_dict())


def test_each_wrappers_own_fields_take_the_axes_its_state_type_declares():
  """No wrapper writes its state's axes rule by hand: its state type declares each own field
  (``ema: ParamShaped``, ``count: Replicated``). Checked against the shapes, not against the
  declarations: a field leaf of a parameter's shape gets that parameter's axes, every other
  leaf (a counter, a window of norms, a key, the statistics' rows) none."""
  from composition import WRAPPERS as TABLE
  from jax.sharding import PartitionSpec as P

  params = {"w": jnp.ones((8, 4), jnp.bfloat16), "b": jnp.ones(4, jnp.bfloat16)}
  axes = {"w": P("embed", "mlp"), "b": P("mlp")}
  is_spec = lambda x: isinstance(x, P)
  for name, make in TABLE.items():
    opt_def = make(optcore.adam(1e-2))
    if opt_def.stacked_replicas:  # diloco: two replicas; its own fields are one replica's
      stacked = jax.tree.map(lambda p: jnp.stack([p, p]), params)
      stacked_axes = jax.tree.map(lambda s: P("replica", *s), axes, is_leaf=is_spec)
      opt = opt_def.create(stacked)
      derived = opt_def.derive_logical_axes(opt, stacked_axes).state.param_states
    else:
      opt = opt_def.create(params)
      derived = opt_def.derive_logical_axes(opt, axes).state.param_states
    state = opt.state.param_states
    for field in state._fields[1:]:
      leaves = jax.tree_util.tree_leaves_with_path(getattr(state, field))
      specs = jax.tree.leaves(getattr(derived, field), is_leaf=is_spec)
      assert len(leaves) == len(specs), (name, field)
      for (keys, leaf), spec in zip(leaves, specs, strict=True):
        key = getattr(keys[-1], "key", None) if keys else None
        if key in params and np.shape(leaf) == params[key].shape:
          assert spec == axes[key], (name, field, keys)
        else:
          assert spec == P(*(None,) * np.ndim(leaf)), (name, field, keys)


class HalfState(NamedTuple):
  """A state type whose ``count`` does not say how its axes follow the parameters'."""

  inner: optcore.Nested
  total: optcore.ParamShaped
  count: object


def test_a_state_type_must_declare_the_axes_of_each_field():
  """A wrapper's state type says, field by field, how its axes follow the parameters'; one
  field without that declaration refuses the wrapper class where it is defined."""
  with pytest.raises(optcore.UndeclaredStateError, match=r"(?s)HalfState.count declares nothing: "
                     r"annotate each field.*count: optcore.ParamShaped"):  # fmt: skip

    class Half(StateWrapper):  # no name: not registered
      state_type = HalfState


@pytest.mark.parametrize(
  "make",
  [
    lambda d: optcore.accumulate(d, 3, dtype=jnp.bfloat16),
    lambda d: optcore.cautious(d, "sum_plus_one"),
    lambda d: optcore.ema(d, 0.9, debias=True, dtype=jnp.float32),
    lambda d: optcore.low_bit_state(d, bits=4, block_size=64, states="nu", min_size=8),
    lambda d: optcore.mixed_precision(d, state_dtype=jnp.bfloat16, master_dtype=jnp.float32),
    lambda d: optcore.skip_bad_steps(d, window=5, warmup=2, watch="loss"),
    lambda d: optcore.stochastic_rounding(d, seed=3),
    lambda d: optcore.grouped(d, max_leaf_size=7),
    lambda d: optcore.with_statistics(d, {"x": "w"}),
    lambda d: optcore.zclip(d, alpha=0.9),
  ],
  ids=[
    "accumulate",
    "cautious",
    "ema",
    "low_bit_state",
    "mixed_precision",
    "skip_bad_steps",
    "stochastic_rounding",
    "grouped",
    "with_statistics",
    "zclip",
  ],
)
def test_a_wrappers_repr_is_the_call_that_makes_it(make):
  """One repr for every wrapper, from its config table: its settings as its constructor takes
  them (accumulate once wrote ``dtype=bfloat16``, a name no program has)."""
  opt_def = make(optcore.sgd(0.1))
  assert eval(repr(opt_def), {**vars(optcore), "jnp": jnp}) == opt_def
