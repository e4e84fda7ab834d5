"""optcore's logical-to-mesh mapping against Flax's own, on random specs and rules."""

from __future__ import annotations

import flax.linen as nn
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import optax
from hypothesis import given, settings
from jax.sharding import PartitionSpec as P

import optcore

LOGICAL = ["batch", "embed", "mlp", "heads", "kv", "vocab", "layers"]
MESH = ["data", "model", ("data", "model"), None]


@st.composite
def specs_and_rules(draw) -> tuple[P, list]:
  """A logical spec (rank 1 to 4, some dimensions None) and 0 to 7 rules onto the mesh."""
  names = draw(st.lists(st.sampled_from(LOGICAL), min_size=1, max_size=4, unique=True))
  spec = P(*(draw(st.sampled_from([n, n, n, n, None])) for n in names))
  rules = draw(st.lists(st.tuples(st.sampled_from(LOGICAL), st.sampled_from(MESH)), max_size=7))
  return spec, rules


def _outcome(fn, *args):
  try:
    return fn(*args)
  except ValueError as e:  # both refuse the same inputs (a mesh axis used twice, ...)
    return ValueError, type(e)


# A fixed budget, the same examples every run (CI and a laptop agree); hypothesis shrinks a
# failure to the smallest spec and rules that show it.
@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(case=specs_and_rules())
def test_logical_to_mesh_axes_equals_flax(case):
  spec, rules = case
  ours = _outcome(optcore.logical_to_mesh_axes, spec, rules)
  assert ours == _outcome(nn.logical_to_mesh_axes, tuple(spec), rules)


def test_linen_partition_specs_drive_the_optimizer_axes():
  """Logical axes from a Linen model's boxed params, as T5X users have them."""

  class Mlp(nn.Module):
    @nn.compact
    def __call__(self, x):
      init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
      return nn.Dense(16, kernel_init=init, use_bias=False)(x)

  boxed = Mlp().init(jax.random.key(0), jnp.zeros((1, 8)))["params"]
  axes = nn.get_partition_spec(boxed)
  params = nn.unbox(boxed)
  state = optax.adafactor(0.1, min_dim_size_to_factor=4).init(params)
  derived = optcore.derive_optax_logical_axes(state, axes, params)
  kernel = derived[0]
  # (8, 16): the largest dimension (mlp) is reduced in v_row, the other in v_col.
  assert kernel.v_row["Dense_0"]["kernel"] == P("embed")
  assert kernel.v_col["Dense_0"]["kernel"] == P("mlp")
  mesh_axes = optcore.logical_to_mesh(derived, [("mlp", "model"), ("embed", "data")])
  assert mesh_axes[0].v_col["Dense_0"]["kernel"] == nn.logical_to_mesh_axes(
    ("mlp",), [("mlp", "model")]
  )
