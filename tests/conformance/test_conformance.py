"""One config, every face (`faces.FACES`: the core, Flax, Equinox, Treex) gives
bitwise-identical trajectories. Hypothesis draws the parameter trees (names, shapes, float32 or
bfloat16), the config and whether the learning rate is overridden each step."""

from __future__ import annotations

import json
from typing import Any

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from faces import FACES
from hypothesis import HealthCheck, given, settings
from optimizer_catalogue import CASES
from tree_testing import assert_trees_equal

import optcore
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


def run(face, config, leaves, grads, override):
  """``STEPS`` jitted steps in ``face``, then its state dict written and read back."""
  handle = face.create(build(config), leaves)
  step = face.jit(face.step)
  for g, lr in zip(grads, rates(override), strict=True):
    handle = step(handle, g, kwargs(lr))
  handle = face.restore(handle, face.state_dict(handle))
  return face.params(handle)


def assert_every_face_agrees(config, leaves, grads, override):
  reference = run(FACES[0], config, leaves, grads, override)
  for face in FACES[1:]:
    try:
      assert_trees_equal(run(face, config, leaves, grads, override), reference)
    except AssertionError as e:
      raise AssertionError(f"the {face.name} face differs from the core: {e}") from e


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
  assert_every_face_agrees(config, leaves, grads, override)


def test_the_catalogue_of_configs_builds():
  for config in CONFIGS:
    assert isinstance(from_config(config), optcore.OptimizerDef), config


def _by_traversal():
  kernels = optcore.ModelParamTraversal(lambda path, _: path.endswith(("kernel", "embed")))
  others = optcore.ModelParamTraversal(lambda path, _: not path.endswith(("kernel", "embed")))
  return optcore.MultiOptimizer((kernels, optcore.adamw(1e-2)), (others, optcore.legacy.Adam(1e-2)))


def _by_mask():
  def kernel_mask(params):  # a function from params to a mask: any container
    # The last key's name: a dict key, or a field of an Equinox module or treeo Tree.
    last = lambda path: getattr(path[-1], "key", None) or getattr(path[-1], "name", None)
    return jax.tree_util.tree_map_with_path(lambda p, _: last(p) in ("kernel", "embed"), params)

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
  assert_every_face_agrees(_Definition(make), leaves, grads, override)
