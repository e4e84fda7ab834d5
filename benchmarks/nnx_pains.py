"""The NNX optimizer pains Flax users reported, checked on Flax's own ``nnx.Optimizer`` and on
optcore's NNX face (issue 64; docs/concepts/nnx.md).

Each check builds what a user wrote in Flax's issue (stacked layers flax#5112, a jitted step on
an Auto mesh flax#5172/#5231, a restore through ``nnx.eval_shape`` flax#5110 or
``nnx.get_abstract_model``, a counter under a global mesh, Muon over logical names with
``sharding_rules``, per-layer meshes flax#5105, an optimizer made inside ``nnx.jit``) and
reports whether it holds, on Auto and Explicit meshes where it matters. Flax's side uses optax's
transformations, the face optcore's. Writes results/nnx_pains.md and .json.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/nnx_pains.py
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  flag = "--xla_force_host_platform_device_count=8"
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()

import json
import platform
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
import optax.contrib
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from timing import version_suffix

import optcore
from optcore_flax import nnx as ocnnx

RESULTS = Path(__file__).parent / "results"
KINDS = (AxisType.Auto, AxisType.Explicit)


class Face:
  """An optimizer class and the transformations a user passes it."""

  def __init__(self, name: str, optimizer: Any, adam: Callable, muon: Callable):
    self.name, self.Optimizer, self.adam, self.muon = name, optimizer, adam, muon


FACES = {
  "flax": Face(
    "Flax's nnx.Optimizer",
    nnx.Optimizer,
    lambda: optax.adam(1e-3),
    lambda: optax.contrib.muon(0.02),
  ),
  "optcore": Face(
    "optcore_flax.nnx.Optimizer",
    ocnnx.Optimizer,
    lambda: optcore.adam(1e-3),
    lambda: optcore.contrib.muon(0.02),
  ),
}


def moments(optimizer, shape):
  """The optimizer state's arrays of one shape (Adam's mu and nu of one parameter)."""
  return [a for a in jax.tree.leaves(nnx.state(optimizer, nnx.OptState)) if a.shape == shape]


@nnx.jit
def step(model, optimizer, x):
  """One jitted training step on ``mean(model(x) ** 2)``."""
  optimizer.update(model, nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model))


def stacked_model(mesh, transform_metadata):
  """Two Linear(16, 16) layers stacked with nnx.vmap and applied with nnx.scan (flax#5112's
  form): the kernel is (2, 16, 16), named ('A', 'B') mapped to ('a', 'b'), with the stack axis
  where ``transform_metadata`` adds it."""
  rules = (("A", "a"), ("B", "b"))

  class Stack(nnx.Module):
    def __init__(self, rngs):
      init = nnx.with_partitioning(
        nnx.initializers.lecun_normal(), ("A", "B"), mesh=mesh, sharding_rules=rules
      )

      @nnx.split_rngs(splits=2)
      @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata=transform_metadata)
      def create(rngs):
        return nnx.Linear(16, 16, use_bias=False, kernel_init=init, rngs=rngs)

      self.layers = create(rngs)

    def __call__(self, x):
      @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry, transform_metadata=transform_metadata)
      def body(layer, x):
        return jnp.tanh(layer(x))

      return body(self.layers, x)

  return Stack(nnx.Rngs(0))


def annotated_linear(mesh, bias=True):
  """Linear(16, 32) on ``mesh``: kernel ('embed', 'mlp') and (``bias``) bias ('mlp',), mapped to
  ('a', 'b') by its sharding_rules; without ``bias`` the bias names no axes."""
  rules = (("embed", "a"), ("mlp", "b"))
  kernel = nnx.with_partitioning(
    nnx.initializers.lecun_normal(), ("embed", "mlp"), mesh=mesh, sharding_rules=rules
  )
  metadata = {}
  if bias:
    metadata["bias_init"] = nnx.with_partitioning(
      nnx.initializers.zeros_init(), ("mlp",), mesh=mesh, sharding_rules=rules
    )
  return nnx.Linear(16, 32, kernel_init=kernel, rngs=nnx.Rngs(0), **metadata)


def check_stacked(face: Face, kind: AxisType) -> None:
  """flax#5112 with transform_metadata: every moment has the kernel's three axes."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(kind,) * 2)
  model = stacked_model(mesh, {nnx.PARTITION_NAME: None})
  want = NamedSharding(mesh, P(None, "a", "b"))
  optimizer = face.Optimizer(model, face.adam(), wrt=nnx.Param)
  step(model, optimizer, jnp.ones((4, 16)))
  for moment in moments(optimizer, (2, 16, 16)):
    assert moment.sharding.is_equivalent_to(want, 3), moment.sharding
  assert model.layers.kernel[...].sharding.is_equivalent_to(want, 3)


def check_stacked_without_the_axis(face: Face, kind: AxisType) -> None:
  """The same stack, its names leaving the stack axis out: two steps keep the kernel and
  its moments on the kernel's own layout."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(kind,) * 2)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the face says what to fix
    model = stacked_model(mesh, {})
    optimizer = face.Optimizer(model, face.adam(), wrt=nnx.Param)
  layout = model.layers.kernel[...].sharding
  for _ in range(2):
    step(model, optimizer, jnp.ones((4, 16)))
  moved = model.layers.kernel[...].sharding
  assert moved.is_equivalent_to(layout, 3), f"the kernel moved to {moved.spec}"
  for moment in moments(optimizer, (2, 16, 16)):
    assert moment.sharding.is_equivalent_to(layout, 3), f"a moment is {moment.sharding.spec}"


def check_optimizer_sharding(face: Face, kind: AxisType) -> None:
  """flax#5231's test, jitted: the replicated kernel stays replicated, its moments split."""
  mesh = jax.make_mesh((2, 2), ("row", "col"), axis_types=(kind,) * 2)
  with jax.set_mesh(mesh):
    split = {"optimizer_sharding": ("row", "col")}
    model = nnx.Linear(4, 2, rngs=nnx.Rngs(0), kernel_metadata=split)
    optimizer = face.Optimizer(model, face.adam(), wrt=nnx.Param)
    kernel = model.kernel[...].sharding
    for _ in range(2):
      step(model, optimizer, jnp.ones((2, 4)))
    moved = model.kernel[...].sharding
    assert moved.is_equivalent_to(kernel, 2), f"the kernel moved to {moved.spec}"
    for moment in moments(optimizer, (4, 2)):
      assert moment.sharding.is_equivalent_to(NamedSharding(mesh, P("row", "col")), 2)


def _restore(face: Face, abstract_state: Callable[[Any], Any]) -> None:
  import orbax.checkpoint as ocp

  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
  model = annotated_linear(mesh)
  optimizer = face.Optimizer(model, face.adam(), wrt=nnx.Param)
  step(model, optimizer, jnp.ones((2, 16)))
  folder = tempfile.mkdtemp() + "/optimizer"
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(folder, nnx.state(optimizer))
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(folder, abstract_state(mesh))
  nnx.update(optimizer, restored)
  step(model, optimizer, jnp.ones((2, 16)))
  assert int(optimizer.step[...]) == 2


def check_restore_eval_shape(face: Face) -> None:
  """flax#5110: a restore into the abstract optimizer nnx.eval_shape gives, then a step."""

  def abstract(mesh):
    with jax.set_mesh(mesh):
      made = nnx.eval_shape(
        lambda: face.Optimizer(annotated_linear(mesh), face.adam(), wrt=nnx.Param)
      )
    return nnx.state(made)

  _restore(face, abstract)


def check_restore_abstract_model(face: Face) -> None:
  """The same through nnx.get_abstract_model."""

  def abstract(mesh):
    make = lambda: face.Optimizer(annotated_linear(mesh), face.adam(), wrt=nnx.Param)
    return nnx.get_abstract_model(make, mesh)[1]

  _restore(face, abstract)


def check_counter_under_a_global_mesh(face: Face) -> None:
  """Layers on their own mesh, the optimizer made under a global one: the first step runs
  and every leaf is on the layers' mesh."""
  layer_mesh = jax.make_mesh((2, 4), ("a", "b"))
  with jax.set_mesh(jax.make_mesh((4, 2), ("data", "context"))):
    model = annotated_linear(layer_mesh)
    optimizer = face.Optimizer(model, face.adam(), wrt=nnx.Param)
  step(model, optimizer, jnp.ones((2, 16)))
  for leaf in jax.tree.leaves(nnx.state(optimizer)):
    assert leaf.sharding.mesh == layer_mesh, leaf.sharding


def check_muon_logical_names(face: Face) -> None:
  """Muon over ('embed', 'mlp') mapped by sharding_rules: a step, moments split as the kernel."""
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
  rules = (("embed", "data"), ("mlp", "model"))
  init = nnx.with_partitioning(
    nnx.initializers.lecun_normal(), ("embed", "mlp"), mesh=mesh, sharding_rules=rules
  )
  model = nnx.Linear(16, 32, kernel_init=init, use_bias=False, rngs=nnx.Rngs(0))
  optimizer = face.Optimizer(model, face.muon(), wrt=nnx.Param)
  step(model, optimizer, jnp.ones((2, 16)))
  for moment in moments(optimizer, (16, 32)):
    assert moment.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "model")), 2)


def check_per_layer_meshes(face: Face, kind: AxisType) -> None:
  """flax#5105: each layer on a mesh of its own; each moment on its layer's."""
  first = jax.make_mesh((2, 4), ("a", "b"), axis_types=(kind,) * 2)
  second = jax.make_mesh((2, 2, 2), ("x", "y", "z"), axis_types=(kind,) * 3)
  init = nnx.initializers.lecun_normal()

  class Two(nnx.Module):
    def __init__(self, rngs):
      one = nnx.with_partitioning(
        init, ("A", "B"), mesh=first, sharding_rules=(("A", "a"), ("B", "b"))
      )
      two = nnx.with_partitioning(
        init, ("X", "Y"), mesh=second, sharding_rules=(("X", "x"), ("Y", "y"))
      )
      self.one = nnx.Linear(16, 16, use_bias=False, kernel_init=one, rngs=rngs)
      self.two = nnx.Linear(16, 16, use_bias=False, kernel_init=two, rngs=rngs)

  optimizer = face.Optimizer(Two(nnx.Rngs(0)), face.adam(), wrt=nnx.Param)
  mu = nnx.state(optimizer)["opt_state"][0]["mu"]
  assert mu["one"]["kernel"].sharding.mesh == first
  assert mu["two"]["kernel"].sharding.mesh == second


def check_made_inside_jit(face: Face, kind: AxisType) -> None:
  """flax#5112's own form: model and optimizer made in one nnx.jit, then a step."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(kind,) * 2)

  @nnx.jit
  def make():
    model = stacked_model(mesh, {nnx.PARTITION_NAME: None})
    return model, face.Optimizer(model, face.adam(), wrt=nnx.Param)

  model, optimizer = make()
  step(model, optimizer, jnp.ones((4, 16)))
  for leaf in jax.tree.leaves(nnx.state(optimizer)):
    assert leaf.sharding.mesh.size == 8, leaf.sharding


def checks() -> dict[str, Callable[[Face], None]]:
  """Every check by name, each one a function of the face."""
  out: dict[str, Callable[[Face], None]] = {}
  for kind in KINDS:
    k = kind.name
    out[f"stacked layers, transform_metadata given ({k})"] = lambda f, k=kind: check_stacked(f, k)
    out[f"stacked layers, the stack axis left out of the names ({k})"] = lambda f, k=kind: (
      check_stacked_without_the_axis(f, k)
    )
    out[f"optimizer_sharding, two jitted steps ({k})"] = lambda f, k=kind: check_optimizer_sharding(
      f, k
    )
  out["restore into nnx.eval_shape"] = check_restore_eval_shape
  out["restore into nnx.get_abstract_model"] = check_restore_abstract_model
  out["counter under a global mesh the parameters do not use"] = check_counter_under_a_global_mesh
  out["Muon over logical names with sharding_rules"] = check_muon_logical_names
  for kind in KINDS:
    out[f"layers on meshes of their own ({kind.name})"] = lambda f, k=kind: check_per_layer_meshes(
      f, k
    )
    out[f"optimizer made inside nnx.jit ({kind.name})"] = lambda f, k=kind: check_made_inside_jit(
      f, k
    )
  return out


def run(face: Face, names: list[str] | None = None) -> dict[str, str]:
  """``{check: 'holds' or what went wrong}`` for ``face``."""
  out = {}
  for name, check in checks().items():
    if names is not None and name not in names:
      continue
    try:
      check(face)
      out[name] = "holds"
    except Exception as e:  # a failure is the finding
      said = str(e).splitlines()[0][:120] if str(e) else ""
      out[name] = f"{type(e).__name__}: {said}" if said else f"fails ({type(e).__name__})"
  return out


def main() -> None:
  results = {key: run(face) for key, face in FACES.items()}
  stack = f"jax {jax.__version__}, Flax {flax.__version__}, Python {platform.python_version()}"
  lines = [
    "# The NNX pains on Flax's optimizer and on the face",
    "",
    f"{stack}; 8 CPU devices. `python benchmarks/nnx_pains.py` (docs/concepts/nnx.md).",
    "",
    "| check | Flax's nnx.Optimizer | optcore's face |",
    "|---|---|---|",
  ]
  for name in checks():
    flax_cell, face_cell = (results[k][name].replace("|", "/") for k in ("flax", "optcore"))
    lines.append(f"| {name} | {flax_cell} | {face_cell} |")
  held = {k: sum(v == "holds" for v in r.values()) for k, r in results.items()}
  lines += ["", f"Holds: Flax's {held['flax']} of {len(checks())}, the face's {held['optcore']}."]
  RESULTS.mkdir(exist_ok=True)
  suffix = version_suffix()
  (RESULTS / f"nnx_pains_jax{suffix}.md").write_text("\n".join(lines) + "\n")
  (RESULTS / f"nnx_pains_jax{suffix}.json").write_text(json.dumps(results, indent=1) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
