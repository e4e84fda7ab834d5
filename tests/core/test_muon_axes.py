"""optcore.contrib.muon with its matrix dimensions derived from logical axes:
the same numbers as optax's muon given the dimension numbers by hand, scanned
layers as batch dimensions, vocab-sized tables and vectors on the Adam branch,
an axis no rule covers named with its path."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from optax.contrib import MuonDimensionNumbers as Dims

import optcore
from optcore._src.axes.matrix_axes import muon_dimension_numbers

LAYERS, EMBED, MLP, HEADS, KV, VOCAB = 2, 8, 16, 2, 4, 32


def transformer_params() -> dict:
  key = jax.random.key(0)
  shapes = {
    "embedding": (VOCAB, EMBED),
    "layers": {
      "wi": (LAYERS, EMBED, MLP),
      "wo": (LAYERS, MLP, EMBED),
      "query": (LAYERS, EMBED, HEADS, KV),
      "out": (LAYERS, HEADS, KV, EMBED),
      "norm": (LAYERS, EMBED),
    },
    "final_norm": (EMBED,),
  }
  leaves, treedef = jax.tree.flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
  arrays = [0.1 * jax.random.normal(jax.random.fold_in(key, i), s) for i, s in enumerate(leaves)]
  return treedef.unflatten(arrays)


AXES = {
  "embedding": P("vocab", "embed"),
  "layers": {
    "wi": P("layers", "embed", "mlp"),
    "wo": P("layers", "mlp", "embed"),
    "query": P("layers", "embed", "heads", "kv"),
    "out": P("layers", "heads", "kv", "embed"),
    "norm": P("layers", "embed"),
  },
  "final_norm": P("embed"),
}

BY_HAND = {
  "embedding": None,
  "layers": {
    "wi": Dims(reduction_axis=(1,), output_axis=(2,)),
    "wo": Dims(reduction_axis=(1,), output_axis=(2,)),
    "query": Dims(reduction_axis=(1,), output_axis=(2, 3)),
    "out": Dims(reduction_axis=(1, 2), output_axis=(3,)),
    "norm": None,
  },
  "final_norm": None,
}


def grads_at(i, params):
  key = jax.random.key(100 + i)
  leaves, treedef = jax.tree.flatten(params)
  return treedef.unflatten(
    [jax.random.normal(jax.random.fold_in(key, j), x.shape) for j, x in enumerate(leaves)]
  )


def test_the_rule_table_gives_the_dimension_numbers_written_by_hand():
  assert muon_dimension_numbers(transformer_params(), AXES) == BY_HAND


def test_the_numbers_equal_optax_muon_given_the_dimensions_by_hand():
  params = transformer_params()
  opt = optcore.contrib.muon(0.02, param_logical_axes=AXES).create(params)
  tx = optax.contrib.muon(0.02, muon_weight_dimension_numbers=BY_HAND)
  raw, state = params, tx.init(params)
  step = jax.jit(lambda o, g: o.apply_gradient(g))
  raw_step = jax.jit(
    lambda p, s, g: (lambda u, s: (optax.apply_updates(p, u), s))(*tx.update(g, s, p))
  )
  for i in range(3):
    opt = step(opt, grads_at(i, params))
    raw, state = raw_step(raw, state, grads_at(i, params))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), opt.target, raw)


def test_scanned_layers_get_muon_where_optax_default_sends_them_to_adam():
  params = transformer_params()
  ours = optcore.contrib.muon(0.02, param_logical_axes=AXES).init_state(params)
  default = optcore.contrib.muon(0.02).init_state(params)
  muon_branch = lambda state: state.param_states.inner_states["muon"].inner_state[0].mu
  is_array = lambda x: hasattr(x, "shape")
  assert is_array(muon_branch(ours)["layers"]["wi"])
  assert not is_array(muon_branch(default)["layers"]["wi"])  # optax's rank-2 guess


def test_create_sharded_passes_its_axes_to_muon():
  params = transformer_params()
  mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
  opt = optcore.contrib.muon(0.02).create_sharded(params, AXES, mesh, [("mlp", "model")])
  assert opt.optimizer_def.hyper_params.param_logical_axes == AXES
  explicit = optcore.contrib.muon(0.02, param_logical_axes=AXES).create(params)
  opt = opt.apply_gradient(grads_at(0, params))
  explicit = explicit.apply_gradient(grads_at(0, params))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), opt.target, explicit.target)
  logical = opt.optimizer_def.derive_logical_axes(opt, AXES)
  mu = logical.state.param_states.inner_states["muon"].inner_state[0].mu
  assert mu["layers"]["wi"] == P("layers", "embed", "mlp")


def test_user_rules_extend_the_table():
  params = {"w": jnp.zeros((3, 4, 5))}
  dims = muon_dimension_numbers(
    params,
    {"w": P("experts_x", "d_in", "d_out")},
    {"experts_x": "batch", "d_in": "matrix", "d_out": "matrix"},
  )
  assert dims == {"w": Dims(reduction_axis=(1,), output_axis=(2,))}


@pytest.mark.parametrize(
  "spec,match",
  [
    (P("layers", "embed", "feature"), r"'/w'.*the axis 'feature' at dimension 2"),
    (P("layers", None, "mlp"), r"'/w'.*no axis name at dimension 1"),
  ],
)
def test_an_axis_no_rule_covers_is_named_with_its_path(spec, match):
  opt_def = optcore.contrib.muon(0.02, param_logical_axes={"w": spec})
  with pytest.raises(optcore.PartitionRuleError, match=match):
    opt_def.create({"w": jnp.zeros((2, 3, 4))})


def test_axes_and_dimension_numbers_by_hand_are_not_both_taken():
  with pytest.raises(TypeError, match="not both"):
    optcore.contrib.muon(
      0.02, param_logical_axes={"w": P("embed", "mlp")}, muon_weight_dimension_numbers={"w": Dims()}
    )


def test_axes_have_no_config_form_and_say_where_they_go():
  opt_def = optcore.contrib.muon(0.02, param_logical_axes=AXES)
  with pytest.raises(
    optcore.config.ConfigError, match=r"create_sharded\(params, param_logical_axes"
  ):
    optcore.config.to_config(opt_def)
  plain = optcore.config.to_config(optcore.contrib.muon(0.02))
  assert optcore.config.from_config(plain) == optcore.contrib.muon(0.02)


def test_shardings_of_a_muon_created_sharded_fit_it_as_jit_shardings():
  params = transformer_params()
  mesh = Mesh(np.array(jax.devices()[:1]), ("model",))
  opt_def = optcore.contrib.muon(0.02)
  opt = opt_def.create_sharded(params, AXES, mesh, [("mlp", "model")])
  shardings = opt_def.derive_shardings(opt, AXES, mesh, [("mlp", "model")])
  assert jax.tree.structure(shardings) == jax.tree.structure(opt)  # the bound definition's
  step = jax.jit(lambda o, g: o.apply_gradient(g), in_shardings=(shardings, None))
  step(opt, grads_at(0, params))


def test_more_axis_names_than_dimensions_are_refused_by_path():
  """Three logical axes for a 2-D parameter were accepted (issue 37): which two were meant?"""
  with pytest.raises(optcore.PartitionRuleError, match=r"'/w'.*3 entries.*2 dimensions"):
    optcore.contrib.muon(0.02, param_logical_axes={"w": P("layers", "embed", "mlp")}).create(
      {"w": jnp.ones((4, 8))}
    )


def test_the_default_rule_table_is_read_only():
  """A program that added a name to MATRIX_AXIS_RULES changed every other optimizer's rules;
  matrix_rules= adds names to one optimizer."""
  from optcore.partitioning import MATRIX_AXIS_RULES

  with pytest.raises(TypeError):
    MATRIX_AXIS_RULES["d_ff"] = "matrix"  # type: ignore[index]
  assert "d_ff" not in MATRIX_AXIS_RULES
