"""optcore.Placement: one object for where the state lives (mesh, rules, ZeRO-1's state_axis,
host memory), taken by every face's sharding function as its mesh, giving the same shardings as
the four keywords it replaces, on a (2, 4) mesh of 8 CPU devices."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import optcore
import optcore_equinox
import optcore_treex

RULES = [("embed", None), ("mlp", "model")]
PARAMS = {"w": jnp.ones((8, 4)), "b": jnp.zeros((4,))}
AXES = {"w": P("embed", "mlp"), "b": P("mlp")}


@pytest.fixture(scope="module")
def mesh(cpu_devices):
  return Mesh(np.array(cpu_devices).reshape(2, 4), ("data", "model"))


def specs_and_kinds(tree):
  """Each leaf's (spec, memory kind), in order (a GroupedParams compares by identity)."""
  return [(s.spec, s.memory_kind) for s in jax.tree.leaves(tree)]


def test_a_placement_is_the_four_keywords_in_every_face(mesh):
  where = optcore.Placement(mesh, RULES, state_axis="data", state_memory_kind="pinned_host")
  keywords = {"state_axis": "data", "state_memory_kind": "pinned_host"}
  opt_def = optcore.adam(1e-2)
  opt = opt_def.create(PARAMS)
  by_object = opt_def.derive_shardings(opt, AXES, where)
  by_keywords = opt_def.derive_shardings(opt, AXES, mesh, RULES, **keywords)
  assert specs_and_kinds(by_object) == specs_and_kinds(by_keywords)
  mu = by_object.state.param_states[0].mu["w"]
  assert mu.spec == P("data", "model") and mu.memory_kind == "pinned_host"  # split and on host
  assert by_object.target["w"].spec == P(None, "model")  # the parameters keep their own
  sharded = opt_def.create_sharded(PARAMS, AXES, where)
  assert sharded.state.param_states[0].mu["w"].sharding.spec == P("data", "model")
  grouped = optcore.grouped(opt_def)
  g_opt = grouped.create(PARAMS)
  assert specs_and_kinds(grouped.derive_shardings(g_opt, AXES, where)) == specs_and_kinds(
    grouped.derive_shardings(g_opt, AXES, mesh, RULES, **keywords)
  )

  model = eqx.nn.Linear(4, 8, key=jax.random.key(0))
  specs = eqx.tree_at(lambda m: (m.weight, m.bias), model, (P("mlp", "embed"), P("mlp")))
  eqx_opt = optcore_equinox.Optimizer(opt_def, model)
  assert specs_and_kinds(eqx_opt.shardings(model, specs, where).state) == specs_and_kinds(
    eqx_opt.shardings(model, specs, mesh, RULES, **keywords).state
  )

  tx_opt = optcore_treex.Optimizer(opt_def).init(PARAMS)
  assert specs_and_kinds(tx_opt.shardings(PARAMS, AXES, where)) == specs_and_kinds(
    tx_opt.shardings(PARAMS, AXES, mesh, RULES, **keywords)
  )


def test_wrong_placements_are_refused_at_once_with_the_fix(mesh):
  with pytest.raises(optcore.PartitionRuleError, match=r"state_axis='dat'.*\['data', 'model'\]"):
    optcore.Placement(mesh, state_axis="dat")
  with pytest.raises(TypeError, match="a mesh is required"):
    optcore.Placement(None)
  opt = optcore.adam(1e-2).create(PARAMS)
  with pytest.raises(TypeError, match=r"unknown placement keyword 'state_axes'.*'state_axis'"):
    opt.optimizer_def.derive_shardings(opt, AXES, mesh, RULES, state_axes="data")
  where = optcore.Placement(mesh, RULES)
  with pytest.raises(TypeError, match=r"mesh is a Placement.*\['state_axis'\]"):
    opt.optimizer_def.derive_shardings(opt, AXES, where, state_axis="data")
  with pytest.raises(ValueError, match="memory"):
    optcore.Placement(mesh, state_memory_kind="unpinned_host")


def test_a_placement_is_hashable_and_compares_by_value(mesh):
  """A jitted step may take it as a static argument."""
  a = optcore.Placement(mesh, RULES, state_axis="data")
  b = optcore.Placement(mesh, [list(r) for r in RULES], state_axis="data")
  assert a == b and hash(a) == hash(b)
  assert a != optcore.Placement(mesh, RULES)


def test_rules_in_another_shape_are_read_or_refused_by_entry(mesh):
  """A dict of rules was taken character by character (('e', 'm', 'b', ...)); it is read as its
  items, lists as tuples, and anything else is refused naming the entry."""
  assert optcore.Placement(mesh, {"embed": None, "mlp": "model"}).logical_axis_rules == (
    ("embed", None),
    ("mlp", "model"),
  )
  assert optcore.Placement(mesh, [["mlp", ["data", "model"]]]).logical_axis_rules == (
    ("mlp", ("data", "model")),
  )
  with pytest.raises(TypeError, match=r"logical_axis_rules must be .* pairs"):
    optcore.Placement(mesh, "embed")
  with pytest.raises(TypeError, match=r"logical_axis_rules\[1\] is \('mlp',\)"):
    optcore.Placement(mesh, [("embed", None), ("mlp",)])


def test_a_memory_kind_pattern_that_matches_no_state_leaf_says_so(mesh):
  """A pattern that finds nothing places nothing: the warning names it and the state's paths,
  and the state stays on the device; a pattern that finds a leaf is quiet."""
  params = {"w": jnp.ones((16, 8))}
  with pytest.warns(UserWarning, match=r"'/nux/' \(-> 'pinned_host'\) matches no state leaf.*"
                    r"'param_states/0/nu/w'"):  # fmt: skip
    opt = optcore.adam(1e-2).create_sharded(
      params, None, mesh, state_memory_kind={"/nux/": "pinned_host"}
    )
  assert opt.state.param_states[0].nu["w"].sharding.memory_kind == "device"
  opt = optcore.adam(1e-2).create_sharded(
    params, None, mesh, state_memory_kind={"/nu/": "pinned_host"}
  )
  assert opt.state.param_states[0].nu["w"].sharding.memory_kind == "pinned_host"


@pytest.mark.parametrize(
  "wrap",
  [lambda d: d, optcore.low_bit_state, lambda d: optcore.ema(d, 0.9)],
  ids=["bare", "low_bit", "ema"],
)
def test_one_pattern_names_one_leaf_to_states_and_to_state_memory_kind(mesh, wrap):
  """'^0/nu/' is adam's second moment to low_bit_state's states= and to state_memory_kind alike,
  under any wrapper: the memory kind read 'param_states/inner/0/nu/w' and matched nothing."""
  params = {"w": jnp.ones((64, 128))}
  opt = wrap(optcore.adam(1e-2)).create_sharded(
    params, None, mesh, state_memory_kind={"^0/nu/": "pinned_host"}
  )
  kinds = {
    jax.tree_util.keystr(keys): leaf.sharding.memory_kind
    for keys, leaf in jax.tree_util.tree_flatten_with_path(opt.state.param_states)[0]
    if jnp.ndim(leaf)
  }
  host = sorted(k for k, kind in kinds.items() if kind == "pinned_host")
  assert host and all(".nu[" in k for k in host), kinds
  picked = optcore.low_bit_state(optcore.ema(optcore.adam(1e-2), 0.9), states="^0/nu/")
  quantized = jax.tree.leaves(
    picked.create(params).state, is_leaf=lambda x: isinstance(x, optcore.QuantizedArray)
  )
  assert sum(isinstance(x, optcore.QuantizedArray) for x in quantized) == 1
