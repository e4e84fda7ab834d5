"""optcore.qk_clip in every face of `faces.FACES`: the statistic passed by each face's own
spelling of an extra update argument (``extra_args={'qk_logits': ...}``; the NNX face's and
optax's ``update(..., qk_logits=...)``), the core face's parameters and state bitwise; and
MuonClip through the NNX face on Flax's own ``MultiHeadAttention`` annotated with logical axes,
its heads at most ``tau`` after every step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from faces import FACES
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

import optcore

EMBED, HEADS, DIM = 6, 4, 3
AXES = {
  "query": P("embed", "heads", "kv"),
  "key": P("embed", "heads", "kv"),
  "value": P("embed", "heads", "kv"),
}
OPT_DEF = optcore.qk_clip(
  optcore.adam(0.05), 4.0, query="query", key="key", param_logical_axes=AXES
)


def params():
  k = jax.random.split(jax.random.key(0), 3)
  return {n: jax.random.normal(k[i], (EMBED, HEADS, DIM)) for i, n in enumerate(AXES)}


def grads(i):
  return {
    n: jnp.sin(jnp.arange(EMBED * HEADS * DIM, dtype=jnp.float32) + i + j).reshape(
      EMBED, HEADS, DIM
    )
    for j, n in enumerate(AXES)
  }


def logits(i):
  return {"": jnp.array([20.0, 3.0, 4.0 + i, -1.0])}  # the module is the whole model here


def run(face, steps=4):
  handle = face.create(OPT_DEF, params())
  step = face.jit(face.step)
  for i in range(steps):
    extra = {"qk_logits": logits(i)}
    handle = step(handle, grads(i), extra if face.name == "nnx" else {"extra_args": extra})
  return handle


@pytest.fixture(scope="module")
def core():
  return run(FACES[0])


@pytest.mark.parametrize("face", FACES, ids=str)
def test_every_face_clips_as_the_core_does(face, core):
  handle = run(face)
  assert_trees_equal(face.params(handle), core.target)
  assert_trees_equal(face.state_dict(handle)["state"], core.state_dict()["state"])
  unclipped = optcore.adam(0.05).create(params())
  for i in range(4):
    unclipped = jax.jit(lambda o, g: o.apply_gradient(g))(unclipped, grads(i))
  assert not jnp.array_equal(core.target["query"], unclipped.target["query"])
  assert jnp.array_equal(core.target["value"], unclipped.target["value"])


def _attention(nnx, init):
  return nnx.MultiHeadAttention(
    num_heads=HEADS,
    in_features=EMBED,
    qkv_features=HEADS * DIM,
    decode=False,
    kernel_init=nnx.with_partitioning(init, ("embed", "heads", "kv")),
    bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("heads", "kv")),
    out_kernel_init=nnx.with_partitioning(init, ("heads", "kv", "embed")),
    out_bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("embed",)),
    rngs=nnx.Rngs(0),
  )


def test_muon_clip_through_the_nnx_face_on_flax_attention():
  """Flax's ``nnx.MultiHeadAttention`` with its kernels annotated ``('embed', 'heads', 'kv')``
  (the face reads the names, as Muon's matrix rules do), ``qk_clip(contrib.muon)`` and the
  step's maximum logits passed to ``update``: the query's kernel and bias are muon's step times
  ``sqrt(eta)`` per head, the key's the same, the value's and the output's muon's step, within
  2 ulps (the product of a jitted step's)."""
  from flax import nnx

  from optcore_flax import nnx as onnx

  init = nnx.initializers.normal(1.0)
  with nnx.use_eager_sharding(False):  # axis names as metadata, no mesh at construction
    clipped_model = _attention(nnx, init)
  plain_model = nnx.clone(clipped_model)
  x = 3.0 * jax.random.normal(jax.random.key(1), (2, 5, EMBED))
  q = clipped_model.query(x) / jnp.sqrt(DIM).astype(x.dtype)  # as dot_product_attention scales
  s = jnp.max(jnp.einsum("bqhd,bkhd->hbqk", q, clipped_model.key(x)), axis=(1, 2, 3))
  tau = float(jnp.sort(s)[2])
  eta = jnp.minimum(1.0, tau / s)
  assert float(jnp.min(eta)) < 1.0 and float(jnp.max(eta)) == 1.0
  grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(clipped_model)
  clipped = onnx.Optimizer(
    clipped_model, optcore.qk_clip(optcore.contrib.muon(0.02), tau), wrt=nnx.Param
  )
  plain = onnx.Optimizer(plain_model, optcore.contrib.muon(0.02), wrt=nnx.Param)
  nnx.jit(lambda m, o, g, s: o.update(m, g, qk_logits={"": s}))(clipped_model, clipped, grads, s)
  nnx.jit(lambda m, o, g: o.update(m, g))(plain_model, plain, grads)
  root = jnp.sqrt(eta)
  for part, factor in (("query", root), ("key", root), ("value", None), ("out", None)):
    for name, axis in (("kernel", 1), ("bias", 0)):
      got = getattr(getattr(clipped_model, part), name)[...]
      want = getattr(getattr(plain_model, part), name)[...]
      if factor is not None:
        want = want * factor.reshape([-1 if i == axis else 1 for i in range(want.ndim)])
      scale = float(jnp.max(jnp.abs(want)))
      assert float(jnp.max(jnp.abs(got - want))) <= 2 * float(jnp.finfo(jnp.float32).eps) * scale
