"""What a state field holds is declared once, on its type (issue 61): an optimizer written
outside optcore (`tests/support/user_optimizer.py`, its state annotated with the four public
names and nothing registered) gets logical axes, low-bit state that quantizes its moments and
never its copy of the parameters, transplant by role, state dicts; a field with no
declaration is refused at create, naming it and the annotation to add. Readers read the
declaration, never a field's name: the optax states whose names misled the old lists are held
to their meaning here."""

from __future__ import annotations

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from user_optimizer import SlowAdam, SlowAdamState, slow_adam

import optcore

PARAMS = {"dense": {"kernel": jnp.ones((64, 128)) * 0.1, "bias": jnp.zeros(128)}}
AXES = {"dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")}}


def grads(i: int):
  rng = np.random.default_rng(i)
  return jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), PARAMS)


def test_the_annotations_are_the_declaration():
  declared = optcore.declared_fields(SlowAdamState)
  assert dict(declared) == {
    "count": optcore.declared_fields(SlowAdamState)["count"],
    "velocity": optcore.declared_fields(optax.ScaleByAdamState)["mu"],
    "scale": optcore.declared_fields(optax.ScaleByAdamState)["nu"],
    "slow": optcore.declared_fields(optax.contrib.ScheduleFreeState)["z"],
  }
  assert [repr(declared[f]) for f in SlowAdamState._fields] == [
    "optcore.Replicated",
    "optcore.FirstMoment",
    "optcore.SecondMoment",
    "optcore.ParamShaped",
  ]


def test_logical_axes_come_from_the_declaration_with_no_rule_registered():
  opt_def = SlowAdam(1e-2)
  axes = opt_def.derive_logical_axes(opt_def.create(PARAMS), AXES).state.param_states
  assert axes.count == P()
  for field in ("velocity", "scale", "slow"):
    assert getattr(axes, field) == {"dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")}}


def test_low_bit_state_quantizes_the_moments_each_with_its_map_and_never_the_copy():
  opt = optcore.low_bit_state(SlowAdam(1e-2)).create(PARAMS)
  inner = opt.state.param_states.inner
  velocity, scale = inner.velocity["dense"]["kernel"], inner.scale["dense"]["kernel"]
  assert isinstance(velocity, optcore.QuantizedArray) and velocity.signed
  assert isinstance(scale, optcore.QuantizedArray) and not scale.signed
  assert not isinstance(inner.slow["dense"]["kernel"], optcore.QuantizedArray)
  # The copy stays exact: at a sync step (every 3rd) the parameters move back to it, so a
  # quantized copy would move them by the rounding (schedule-free's z was 50% off that way).
  for i in range(3):
    opt = opt.apply_gradient(grads(i))
  slow = opt.state.param_states.inner.slow
  np.testing.assert_array_equal(opt.target["dense"]["kernel"], slow["dense"]["kernel"])


def test_transplant_fills_declared_moments_from_adams_by_role():
  adam = optcore.adam(1e-2).create(PARAMS)
  for i in range(2):
    adam = adam.apply_gradient(grads(i))
  moved, report = optcore.transplant(SlowAdam(1e-2).create(PARAMS), adam.state_dict())
  state, source = moved.state.param_states, adam.state.param_states[0]
  np.testing.assert_array_equal(state.velocity["dense"]["kernel"], source.mu["dense"]["kernel"])
  np.testing.assert_array_equal(state.scale["dense"]["bias"], source.nu["dense"]["bias"])
  kept = {e.path: e.note for e in report.kept}
  assert kept["param_states/velocity/dense/kernel"] == "its declared first moment"
  # The slow copy starts anew, so the count it counts for restarts (never kept over a fresh leaf)
  assert {e.path for e in report.initialised} == {
    "param_states/count",
    "param_states/slow/dense/bias",
    "param_states/slow/dense/kernel",
  }
  assert int(state.count) == 0
  # After the transplant the run is adam's moments continued: the next update equals the one
  # slow_adam makes from adam's moments by hand.
  tx = slow_adam(1e-2)
  by_hand = SlowAdamState(
    jnp.asarray(0, jnp.int32), source.mu, source.nu, jax.tree.map(jnp.array, PARAMS)
  )
  expected, _ = tx.update(grads(2), by_hand, PARAMS)
  stepped = moved.apply_gradient(grads(2))
  np.testing.assert_array_equal(
    stepped.target["dense"]["kernel"], optax.apply_updates(PARAMS, expected)["dense"]["kernel"]
  )


def test_the_state_dict_round_trips_byte_for_byte():
  opt = SlowAdam(1e-2).create(PARAMS).apply_gradient(grads(0))
  restored = SlowAdam(1e-2).create(PARAMS).restore_state(opt.state_dict())
  jax.tree.map(np.testing.assert_array_equal, restored.state, opt.state)


def test_zero1_and_host_memory_follow_the_declaration():
  """As adam's own state is placed (tests/distributed/test_user_optimizer_mesh.py: 8 devices)."""
  mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
  rules = [("mlp", None), ("embed", None)]
  place = dict(state_axis="data", state_memory_kind="pinned_host")
  opt = SlowAdam(1e-2).create_sharded(PARAMS, AXES, mesh, rules, **place)
  adam = optcore.adam(1e-2).create_sharded(PARAMS, AXES, mesh, rules, **place)
  state, mu = opt.state.param_states, adam.state.param_states[0].mu
  for field in ("velocity", "scale", "slow"):
    kernel = getattr(state, field)["dense"]["kernel"].sharding
    assert kernel == mu["dense"]["kernel"].sharding and "data" in kernel.spec, field
  assert state.slow["dense"]["kernel"].sharding.memory_kind == "pinned_host"
  assert state.count.sharding.memory_kind == "device"  # a counter stays where the step runs
  jax.jit(lambda o, g: o.apply_gradient(g))(opt, grads(0))


class _Half(NamedTuple):
  count: optcore.Replicated
  trace: dict


class _Plain(NamedTuple):
  count: jax.Array
  trace: dict


def _keeps(state_type):
  def factory() -> optax.GradientTransformation:
    init = lambda p: state_type(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, p))
    return optax.GradientTransformation(init, lambda g, s, p=None: (g, s))

  return optcore.wrap_optax_optimizer(factory, name=state_type.__name__.lower())


@pytest.mark.parametrize(
  "state_type, expected",
  [
    (_Half, r"(?s)_half: _Half.trace declares nothing: annotate .*trace: optcore.ParamShaped"),
    (
      _Plain,
      r"(?s)_plain: the state type .*_Plain at '/' does not declare its fields\. _Plain.count "
      r"declares nothing \(nor trace\).*optcore.declare_state\(_Plain, count=",
    ),
  ],
  ids=["one-field-missing", "nothing-declared"],
)
def test_a_field_without_a_declaration_is_refused_at_create_naming_it(state_type, expected):
  with pytest.raises(optcore.UndeclaredStateError, match=expected):
    _keeps(state_type)().create(PARAMS)


def test_the_table_form_declares_a_type_one_cannot_edit():
  class Theirs(NamedTuple):
    count: jax.Array
    trace: dict

  with pytest.raises(optcore.UndeclaredStateError, match=r"missing: \['trace'\]"):
    optcore.declare_state(Theirs, count=optcore.Replicated)
  optcore.declare_state(Theirs, count=optcore.Replicated, trace=optcore.FirstMoment)
  opt = optcore.low_bit_state(_keeps(Theirs)()).create(PARAMS)
  assert isinstance(opt.state.param_states.inner.trace["dense"]["kernel"], optcore.QuantizedArray)


def test_low_bit_state_refuses_a_state_that_declares_nothing_unless_states_chooses():
  """A register_state_rule gives axes, not roles: which leaves are moments is not guessed."""

  class Ruled(NamedTuple):
    count: jax.Array
    trace: dict

  optcore.register_state_rule(
    Ruled,
    lambda state, axes, params: Ruled(None, optcore.partitioning.like_params(state.trace, axes)),
  )
  with pytest.raises(optcore.UndeclaredStateError, match=r"cannot tell what the state leaf "
                     r"'0/trace/dense/bias' holds.*states="):  # fmt: skip
    optcore.low_bit_state(optcore.chain([_keeps(Ruled)()])).create(PARAMS)
  opt = optcore.low_bit_state(optcore.chain([_keeps(Ruled)()]), states="trace").create(PARAMS)
  assert isinstance(
    opt.state.param_states.inner[0].trace["dense"]["kernel"], optcore.QuantizedArray
  )


def test_a_count_comes_with_the_moments_it_counts_for_when_all_of_them_are_kept():
  """A state of moments alone (no copy beside them): adam's count comes with adam's moments."""

  class Moments(NamedTuple):
    step: optcore.Replicated
    first: optcore.FirstMoment
    second: optcore.SecondMoment

  def moments() -> optax.GradientTransformation:
    def init(params):
      zeros = jax.tree.map(jnp.zeros_like, params)
      return Moments(jnp.zeros([], jnp.int32), zeros, zeros)

    return optax.GradientTransformation(init, lambda g, s, p=None: (g, s._replace(step=s.step + 1)))

  adam = optcore.adam(1e-2).create(PARAMS).apply_gradient(grads(0)).apply_gradient(grads(1))
  moved, report = optcore.transplant(
    optcore.wrap_optax_optimizer(moments)().create(PARAMS), adam.state_dict()
  )
  assert int(moved.state.param_states.step) == 2 and not report.initialised
  assert {e.path: e.note for e in report.kept}["param_states/step"] == (
    "the count of the moments kept"
  )
  np.testing.assert_array_equal(
    moved.state.param_states.second["dense"]["kernel"],
    adam.state.param_states[0].nu["dense"]["kernel"],
  )


@pytest.mark.parametrize(
  "make, signed, unsigned, kept",
  [
    # Adan's v averages gradient differences (signed); its g is the last gradient.
    (lambda: optcore.adan(1e-3), ["m", "v"], ["n"], ["g"]),
    # SM3's mu sums squares; its nu is the momentum (the old name list had them swapped).
    (lambda: optcore.sm3(1e-3), ["nu"], ["mu"], []),
    # MADGRAD keeps the starting parameters in x0: a copy, never quantized.
    (lambda: optcore.contrib.madgrad(1e-3), ["s"], ["grad_sum_sq"], ["x0"]),
    (lambda: optcore.contrib.mars(1e-3), ["exp_avg"], ["exp_avg_sq"], ["last_grad"]),
  ],
  ids=["adan", "sm3", "madgrad", "mars"],
)
def test_each_field_takes_the_map_its_declaration_names(make, signed, unsigned, kept):
  opt = optcore.low_bit_state(make(), min_size=0).create({"w": jnp.ones((64, 64))})
  found = {}
  for state in jax.tree.leaves(
    opt.state.param_states.inner,
    is_leaf=lambda x: hasattr(x, "_fields") and not hasattr(x, "codes"),
  ):
    if hasattr(state, "_fields"):
      found.update({f: getattr(state, f) for f in state._fields})
  leaf = lambda f: jax.tree.leaves(
    found[f], is_leaf=lambda x: isinstance(x, optcore.QuantizedArray)
  )[0]
  for field in signed:
    assert isinstance(leaf(field), optcore.QuantizedArray) and leaf(field).signed, field
  for field in unsigned:
    assert isinstance(leaf(field), optcore.QuantizedArray) and not leaf(field).signed, field
  for field in kept:
    assert not isinstance(leaf(field), optcore.QuantizedArray), field


def test_every_optax_state_type_declares_every_field():
  """The table form covers optax's states whole, in the optax this suite runs: a field optax
  adds shows here, not as a guess in a user's run."""
  from optcore._src.axes import optax_rules

  checked = 0
  for state_type in optcore.partitioning.OptaxStatePartitionRules._RULES:
    if not state_type.__module__.startswith("optax"):
      continue
    declared = optcore.declared_fields(state_type)
    assert declared is not None and set(declared) == set(state_type._fields), state_type
    checked += 1
  assert checked > 50 and optax_rules.FM.moment == "first"


def test_the_old_name_list_is_a_deprecated_alias_read_by_nothing():
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    names = optcore.SECOND_MOMENTS
  assert "nu" in names and caught[0].category is DeprecationWarning
  assert "optcore.SecondMoment" in str(caught[0].message)
