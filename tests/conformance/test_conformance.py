"""One config, four faces: the core, Flax, Equinox and Treex give bitwise-identical
trajectories. Hypothesis draws the parameter trees (names, shapes, float32 or
bfloat16), the config and whether the learning rate is overridden each step."""

from __future__ import annotations

import json
from typing import Any

import equinox as eqx
import flax
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import treeo as to
from hypothesis import HealthCheck, given, settings
from optimizer_catalogue import CASES
from tree_testing import assert_trees_equal

import optcore
import optcore_equinox
import optcore_flax
import optcore_treex
from optcore.config import from_config

CONFIGS = [
  {"name": "adam", "learning_rate": 1e-2},
  {"name": "adamw", "learning_rate": 1e-2, "weight_decay": 0.1},
  {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9, "nesterov": True},
  {"name": "lion", "learning_rate": 1e-3},
  {"name": "adafactor", "learning_rate": 1e-2, "min_dim_size_to_factor": 2},
  {"name": "contrib.muon", "learning_rate": 1e-2},
  {
    "name": "chain",
    "transformations": [
      {"transform": "clip_by_global_norm", "max_norm": 1.0},
      {
        "name": "adam",
        "learning_rate": {"schedule": "cosine_decay_schedule", "init_value": 0.1, "decay_steps": 5},
      },
    ],
  },
  {
    "name": "multi",
    "groups": [
      {"select": "kernel|embed", "optimizer": {"name": "adamw", "learning_rate": 1e-2}},
      {"select": "bias|scale", "optimizer": {"name": "legacy.Momentum", "learning_rate": 0.1}},
    ],
  },
  {"name": "legacy.Adam", "learning_rate": 1e-2, "weight_decay": 1e-3},
  {"name": "legacy.RMSProp", "learning_rate": 1e-2, "centered": True},
  {"name": "legacy.LARS", "learning_rate": 0.1, "nesterov": True},
  {"name": "legacy.Adafactor", "learning_rate": 1e-2, "beta1": 0.9, "min_dim_size_to_factor": 2},
  {"name": "adafactor.Adafactor", "learning_rate": 1e-2, "global_norm_clip_threshold": 1.0},
]
STEPS = 3
NAMES = ["kernel", "bias", "scale", "embed"]


@st.composite
def parameter_trees(draw):
  names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
  dtype = draw(st.sampled_from([jnp.float32, jnp.bfloat16]))
  seed = draw(st.integers(0, 2**16))
  rng = np.random.default_rng(seed)
  shapes = {n: tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=3))) for n in names}
  leaves = {n: jnp.asarray(rng.normal(size=s), dtype) for n, s in shapes.items()}
  grads = [
    {n: jnp.asarray(rng.normal(size=s), dtype) for n, s in shapes.items()} for _ in range(STEPS)
  ]
  return leaves, grads


class EqxParams(eqx.Module):
  leaves: dict


class TreeoParams(to.Tree):
  leaves: dict = to.field(node=True)

  def __init__(self, leaves):
    self.leaves = leaves


def rates(override: bool) -> list[Any]:
  return [jnp.float32(0.05 / (1 + i)) if override else None for i in range(STEPS)]


def kwargs(lr) -> dict[str, Any]:
  return {} if lr is None else {"learning_rate": lr}


class _Definition:
  """A ready definition where the runners expect a config."""

  def __init__(self, make):
    self.make = make


def build(config) -> optcore.OptimizerDef:
  return config.make() if isinstance(config, _Definition) else from_config(config)


def run_core(config, leaves, grads, override):
  opt = build(config).create(leaves)
  step = jax.jit(lambda o, g, kw: o.apply_gradient(g, **kw))
  for g, lr in zip(grads, rates(override), strict=True):
    opt = step(opt, g, kwargs(lr))
  return opt.target


def run_flax(config, leaves, grads, override):
  optimizer = build(config).create(flax.core.freeze(leaves))
  assert isinstance(optimizer, optcore_flax.optim.Optimizer)
  step = jax.jit(lambda o, g, kw: o.apply_gradient(g, **kw))
  for g, lr in zip(grads, rates(override), strict=True):
    optimizer = step(optimizer, flax.core.freeze(g), kwargs(lr))
  restored = flax.serialization.from_bytes(optimizer, flax.serialization.to_bytes(optimizer))
  return flax.core.unfreeze(restored.target)


def run_equinox(config, leaves, grads, override):
  model = EqxParams(leaves)
  opt = optcore_equinox.Optimizer(build(config), model)

  @eqx.filter_jit
  def step(model, opt, g, kw):
    return opt.update(EqxParams(g), model, **kw)

  for g, lr in zip(grads, rates(override), strict=True):
    model, opt = step(model, opt, g, kwargs(lr))
  return model.leaves


def run_treex(config, leaves, grads, override):
  params = TreeoParams(leaves)
  optimizer = optcore_treex.Optimizer(build(config)).init(params)

  @jax.jit
  def step(params, optimizer, g, kw):
    params = optimizer.update(TreeoParams(g), params, **kw)
    return params, optimizer

  for g, lr in zip(grads, rates(override), strict=True):
    params, optimizer = step(params, optimizer, g, kwargs(lr))
  return params.leaves


@pytest.mark.filterwarnings(
  "ignore:MultiOptimizer.*matches no parameter"
)  # a drawn tree may lack a group
@settings(
  max_examples=30,
  deadline=None,
  derandomize=True,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(tree=parameter_trees(), config=st.sampled_from(CONFIGS), override=st.booleans())
def test_every_face_gives_the_same_numbers(tree, config, override):
  leaves, grads = tree
  # A learning-rate schedule builds its own state: a numeric override would change the
  # state's layout and is refused (tested in the core), so schedules run without one.
  override = override and "schedule" not in json.dumps(config)
  reference = run_core(config, leaves, grads, override)
  for face in (run_flax, run_equinox, run_treex):
    assert_trees_equal(face(config, leaves, grads, override), reference)


def test_the_catalogue_of_configs_builds():
  for config in CONFIGS:
    assert isinstance(from_config(config), optcore.OptimizerDef), config


def _by_traversal():
  kernels = optcore.ModelParamTraversal(lambda path, _: path.endswith(("kernel", "embed")))
  others = optcore.ModelParamTraversal(lambda path, _: not path.endswith(("kernel", "embed")))
  return optcore.MultiOptimizer((kernels, optcore.adamw(1e-2)), (others, optcore.legacy.Adam(1e-2)))


def _by_mask():
  def kernel_mask(params):  # a function from params to a mask: any container
    return jax.tree_util.tree_map_with_path(
      lambda path, _: jax.tree_util.keystr(path).endswith(("'kernel']", "'embed']")), params
    )

  others = lambda params: jax.tree.map(lambda k: not k, kernel_mask(params))
  return optcore.MultiOptimizer([(kernel_mask, optcore.lion(1e-3)), (others, optcore.sgd(0.1))])


CATALOGUE = [c for c in CASES if c.extra is None and not c.per_example]


@pytest.mark.parametrize(
  "make",
  [
    *(lambda c=c: c.optcore_factory()(**c.optcore_kwargs()) for c in CATALOGUE),
    _by_traversal,
    _by_mask,
  ],
  ids=[*(c.name for c in CATALOGUE), "multi-by-traversal", "multi-by-mask"],
)
def test_every_wrapped_optimizer_gives_the_same_numbers_everywhere(make):
  """Every optax and contrib alias (those without extra update arguments), and
  MultiOptimizers by traversal and by mask, with a learning-rate override per step."""
  rng = np.random.default_rng(0)
  shapes = {"kernel": (4, 3), "bias": (3,), "embed": (5, 4)}
  leaves = {n: jnp.asarray(rng.normal(size=s), jnp.float32) for n, s in shapes.items()}
  grads = [
    {n: jnp.asarray(rng.normal(size=s), jnp.float32) for n, s in shapes.items()}
    for _ in range(STEPS)
  ]
  name = getattr(make(), "_name", "")
  override = not any(c.name == name and c.lr_name != "learning_rate" for c in CASES)
  config_like = _Definition(make)
  reference = run_core(config_like, leaves, grads, override)
  for face in (run_flax, run_equinox, run_treex):
    assert_trees_equal(face(config_like, leaves, grads, override), reference)
