"""The one walk over a tree of definitions (`optcore.adapter.map_definitions`): a wrapper or a
group anywhere in the tree is seen by every walk that goes through it, and a walk that changes
nothing gives the same definition back (one program for ``jax.jit``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import optcore
from optcore import adapter

AXES = {"w": P("layers", "embed", "mlp"), "b": P("mlp")}
PARAMS = {"w": jnp.ones((2, 4, 3)), "b": jnp.ones(3)}


def test_every_definition_of_the_tree_in_order():
  groups = optcore.MultiOptimizer(
    ("w", optcore.ema(optcore.sgd(0.1), 0.9)), ("b", optcore.adam(0.1))
  )
  names = [d.display_name() for d in adapter.iter_definitions(optcore.accumulate(groups, 2))]
  assert names == ["accumulate(MultiOptimizer)", "MultiOptimizer", "ema(sgd)", "sgd", "adam"]


def test_a_walk_that_changes_nothing_gives_the_same_definition():
  opt_def = optcore.skip_bad_steps(optcore.MultiOptimizer(("w", optcore.sgd(0.1))))
  assert adapter.map_definitions(lambda d, _: d, opt_def) is opt_def
  assert opt_def.with_param_logical_axes(AXES) is opt_def  # nothing in it reads axes


@pytest.mark.parametrize(
  "wrap",
  [lambda d: d, optcore.skip_bad_steps, lambda d: optcore.ema(d, 0.9), optcore.with_statistics],
  ids=["bare", "skip_bad_steps", "ema", "with_statistics"],
)
def test_t5x_factor_rules_reach_an_adafactor_inside_a_wrapper_inside_a_group(wrap):
  """MultiOptimizer.with_param_axes (T5X's set_param_axes) once reached a group's Adafactor only
  when the group was the Adafactor itself."""
  multi = optcore.MultiOptimizer(("w", wrap(optcore.t5x.Adafactor(0.1))), ("b", optcore.sgd(0.1)))
  told = multi.with_param_axes(AXES)
  (adafactor,) = [d for d in adapter.iter_definitions(told) if isinstance(d, optcore.t5x.Adafactor)]
  factor = optcore.t5x.FactorDim
  assert adafactor.hyper_params.factor_map["w"] == (factor.BATCH, factor.ROW, factor.COLUMN)
  untold = [d for d in adapter.iter_definitions(multi) if isinstance(d, optcore.t5x.Adafactor)]
  assert untold[0].hyper_params.factor_map is None  # the definition given is unchanged
  state = told.create(PARAMS).state
  v_row = [x for x in jax_leaves_named(state, "v_row")]
  assert [np.shape(x) for x in v_row] == [(2, 4)]  # layers kept, embed the row


def jax_leaves_named(tree, name):
  keyed, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [leaf for keys, leaf in keyed if any(getattr(k, "name", None) == name for k in keys)]


def test_logical_axes_reach_muon_inside_a_wrapped_group():
  """create_sharded's axes reach a Muon wherever it sits: here inside ema, in one group of a
  MultiOptimizer, the group seeing its own leaves' axes."""
  params = {"w": jnp.ones((2, 4, 3)), "b": jnp.ones(3)}
  muon = optcore.contrib.muon(0.02)
  opt_def = optcore.ema(optcore.MultiOptimizer(("w", muon), ("b", optcore.sgd(0.1))), 0.9)
  told = opt_def.with_param_logical_axes(AXES)
  (bound,) = [d for d in adapter.iter_definitions(told) if d.display_name() == "contrib.muon"]
  assert bound.hyper_params.param_logical_axes == {"w": P("layers", "embed", "mlp"), "b": None}
  assert muon.hyper_params.param_logical_axes is None
  explicit = optcore.ema(
    optcore.MultiOptimizer(
      ("w", optcore.contrib.muon(0.02, param_logical_axes={"w": AXES["w"], "b": None})),
      ("b", optcore.sgd(0.1)),
    ),
    0.9,
  )
  grads = {"w": jnp.arange(24.0).reshape(2, 4, 3) / 24, "b": jnp.ones(3)}
  got = told.create(params).apply_gradient(grads).target
  want = explicit.create(params).apply_gradient(grads).target
  np.testing.assert_array_equal(got["w"], want["w"])


def test_a_tree_where_nothing_reads_axes_never_runs_its_selectors_on_them():
  """create_sharded tells the definition the parameters' logical axes; a MultiOptimizer whose
  selectors read the parameters' values (x.ndim) would be handed PartitionSpecs if the walk ran
  where no definition reads axes."""
  multi = optcore.MultiOptimizer(
    (lambda path, x: x.ndim > 1, optcore.adam(0.1)), (lambda path, x: x.ndim <= 1, optcore.sgd(0.1))
  )
  assert multi.with_param_logical_axes(AXES) is multi


COMBINATORS = {
  "chain": lambda d: optcore.chain([optax.clip_by_global_norm(1.0), d]),
  "schedule_free": lambda d: optcore.contrib.schedule_free(d, learning_rate=0.02),
}


@pytest.mark.parametrize("combine", COMBINATORS.values(), ids=COMBINATORS.keys())
def test_logical_axes_reach_muon_inside_an_optax_combinator(combine):
  """A definition among an optax combinator's arguments is a child like a wrapper's. Before,
  ``chain([..., contrib.muon(...)])`` was never told create_sharded's axes: its (layers, embed,
  mlp) kernel silently took optax's default, other numbers than Muon alone."""
  muon = optcore.contrib.muon(0.02)
  told = combine(muon).with_param_logical_axes(AXES)
  (bound,) = [d for d in adapter.iter_definitions(told) if d.display_name() == "contrib.muon"]
  assert bound.hyper_params.param_logical_axes == AXES
  assert muon.hyper_params.param_logical_axes is None  # the definition given is unchanged
  explicit = combine(optcore.contrib.muon(0.02, param_logical_axes=AXES))
  grads = {"w": jnp.arange(24.0).reshape(2, 4, 3) / 24, "b": jnp.ones(3)}
  mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
  sharded = combine(muon).create_sharded(PARAMS, AXES, mesh, [("mlp", "model")])
  want = explicit.create(PARAMS).apply_gradient(grads).target
  for got in (told.create(PARAMS), sharded):
    # the same program as the explicit axes' (one device): equal to the bit
    np.testing.assert_array_equal(got.apply_gradient(grads).target["w"], want["w"])
  untold = combine(muon).create(PARAMS).apply_gradient(grads).target
  assert not np.allclose(untold["w"], want["w"])  # the axes change this kernel's numbers


def test_an_optax_combinator_rebuilt_with_its_children():
  clip, sgd = optax.clip_by_global_norm(1.0), optcore.sgd(0.1)
  chain = optcore.chain([clip, sgd])
  assert chain.children() == (sgd,)
  assert adapter.map_definitions(lambda d, _: d, chain) is chain
  faster = chain.with_children((optcore.sgd(0.5),))
  assert faster.hyper_params.transformations[0] is clip
  assert faster.children() == (optcore.sgd(0.5),) and chain.children() == (sgd,)
  with pytest.raises(TypeError, match=r"holds 1 definition\(s\) among its arguments; got 2"):
    chain.with_children((sgd, sgd))
