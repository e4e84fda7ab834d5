"""Meshes whose axes are Explicit, ``jax.make_mesh``'s default: an array's type carries its
sharding, ``with_sharding_constraint`` refuses those axes, and an operation whose result's
sharding JAX cannot infer (a reshape of a split dimension, a norm across one) is an error.

Every face's step runs the optimizer's maths with the axes Auto and types its results as its
inputs (`optcore._src.axes.sharding.with_auto_axes`), and keeps the parameters on their own sharding
with ``reshard``: the same numbers as the same run on an Auto mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from optimizer_catalogue import CASES, grads_and_extra
from sharding_setup import MODEL_RULES, comparable, make_params

import optcore

EXPLICIT = jax.sharding.AxisType.Explicit
# One of each kind of maths: per element, a norm or a factored mean across the split dimension,
# a flattening of the whole tree (L-BFGS), a matrix product and SVD (Muon, GaLore, Dion), optax's
# extra arguments (polyak's value, Sophia's obj_fn), a reciprocal of a small second moment
# (ACProp).
KINDS = [
  "adam",
  "lion",
  "lamb",
  "adafactor",
  "lbfgs",
  "polyak_sgd",
  "contrib.acprop",
  "contrib.muon",
  "contrib.galore",
  "contrib.dion",
  "contrib.sophia",
]
# Explicit against Auto axes, 3 jitted ZeRO-1 steps on 8 CPU devices: the two programs place
# the same operations, but XLA fuses them differently (with FMA: under SSE4_2 and AVX all but
# polyak_sgd are bitwise equal). Measured on a 2-core x86 CPU at the default ISA, jax 0.12.0.1
# and 0.10.2 alike, as a fraction of atol = rtol = 1e-6: 0.25 at most for the per-element ones,
# 0.91 for L-BFGS; ACProp 1.16 (its reciprocal of a small second moment) and GaLore 3.2 (an SVD
# of the gradient), which take 1e-5 as on a mesh against one device
# (sharding_setup.REORDERED_TOLERANCE).
TOLERANCE = {"contrib.acprop": 1e-5, "contrib.galore": 1e-5}


@pytest.fixture(scope="module")
def meshes(cpu_devices):
  auto = Mesh(np.array(cpu_devices), ("data",))
  explicit = jax.make_mesh((8,), ("data",), axis_types=(EXPLICIT,), devices=cpu_devices)
  return auto, explicit


def _zero1_run(case, mesh, steps: int = 3):
  params = make_params()
  opt_def = case.optcore_factory()(**case.optcore_kwargs())
  opt = opt_def.create_sharded(params, mesh=mesh, state_axis="data")
  shardings = jax.tree.map(lambda x: x.sharding, opt)

  def step(opt):
    grads, extra = grads_and_extra(case, opt.target)
    return opt.apply_gradient(grads, extra_args=extra or None)

  step = jax.jit(step, in_shardings=(shardings,), out_shardings=shardings)
  for _ in range(steps):
    opt = step(opt)
  return opt


@pytest.mark.parametrize("case", [c for c in CASES if c.name in KINDS], ids=lambda c: c.name)
def test_zero1_on_explicit_axes_gives_the_auto_axes_numbers(case, meshes):
  auto, explicit = (_zero1_run(case, mesh) for mesh in meshes)
  for leaf in jax.tree.leaves(explicit.target):
    assert leaf.sharding.is_fully_replicated  # the parameters did not follow the split state
  split = [x for x in jax.tree.leaves(explicit.state) if np.shape(x) == (16, 32)]
  assert all(x.sharding.spec == P(None, "data") for x in split)  # 32 of 8 ways
  tol = TOLERANCE.get(case.name, 1e-6)
  for a, b in zip(jax.tree.leaves(explicit), jax.tree.leaves(auto), strict=True):
    np.testing.assert_allclose(comparable(a), comparable(b), rtol=tol, atol=tol)


def _grads(params):
  return jax.tree.map(lambda x: jnp.cos(x) * 0.5, params)


def test_every_face_steps_on_explicit_axes_as_the_core_on_auto_axes(cpu_devices):
  """Split parameters (logical axes on 'model') and ZeRO-1 state ('data'), each face jitted."""
  import equinox as eqx

  import optcore_equinox
  import optcore_flax
  import optcore_treex

  axes = {"dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")}, "attn": P(None, None, "mlp")}
  devices = np.array(cpu_devices).reshape(4, 2)
  auto = Mesh(devices, ("data", "model"))
  explicit = jax.make_mesh(
    (4, 2), ("data", "model"), axis_types=(EXPLICIT, EXPLICIT), devices=cpu_devices
  )
  where = optcore.Placement(explicit, MODEL_RULES, state_axis="data")
  params = make_params()
  opt_def = optcore.adamw(1e-2, weight_decay=0.1)

  def core_run(mesh):
    opt = opt_def.create_sharded(params, axes, mesh, MODEL_RULES, state_axis="data")
    step = jax.jit(lambda o: o.apply_gradient(_grads(o.target)))
    for _ in range(3):
      opt = step(opt)
    return opt

  reference = core_run(auto)
  runs = {"core": core_run(explicit)}

  import flax.linen as nn

  boxed = jax.tree.map(lambda x, a: nn.LogicallyPartitioned(x, tuple(a)), params, axes)
  flax_opt = optcore_flax.create_sharded(opt_def, boxed, where)
  flax_step = jax.jit(lambda o: o.apply_gradient(_grads(o.target)))
  for _ in range(3):
    flax_opt = flax_step(flax_opt)
  runs["flax"] = flax_opt

  model = jax.device_put(params, jax.tree.map(lambda s: s.sharding, runs["core"].target))
  eqx_opt = optcore_equinox.Optimizer(opt_def, model).shard(model, axes, where)

  @eqx.filter_jit
  def eqx_step(model, opt):
    return opt.update(_grads(model), model)

  eqx_model = model
  for _ in range(3):
    eqx_model, eqx_opt = eqx_step(eqx_model, eqx_opt)
  runs["equinox"] = optcore.Optimizer(opt_def, eqx_opt.state, eqx_model)

  tx_opt = optcore_treex.Optimizer(opt_def).init(model).shard(model, axes, where)

  @jax.jit
  def tx_step(params, opt):
    return opt.update(_grads(params), params), opt

  tx_params = model
  for _ in range(3):
    tx_params, tx_opt = tx_step(tx_params, tx_opt)
  runs["treex"] = optcore.Optimizer(
    opt_def, optcore.OptimizerState(reference.state.step, tx_opt.opt_state), tx_params
  )

  want = {
    leaf: s.sharding.spec
    for leaf, s in zip(("bias", "kernel", "attn"), jax.tree.leaves(reference.target), strict=True)
  }
  for name, opt in runs.items():
    got = [x.sharding.spec for x in jax.tree.leaves(opt.target)]
    assert got == list(want.values()), name  # the parameters kept their own sharding
    mu = opt.state.param_states[0].mu["dense"]["kernel"]
    assert mu.sharding.spec == reference.state.param_states[0].mu["dense"]["kernel"].sharding.spec
    # Per element maths, the same operations. Measured with the host-memory and as_optax tests
    # (jax 0.12.0.1, 2-core x86 CPU): 0.078 of atol = rtol = 1e-6 at the default ISA, bitwise
    # under SSE4_2 and AVX.
    for a, b in zip(jax.tree.leaves(opt), jax.tree.leaves(reference), strict=True):
      np.testing.assert_allclose(comparable(a), comparable(b), rtol=1e-6, atol=1e-6, err_msg=name)


def test_state_in_host_memory_on_explicit_axes(cpu_devices):
  explicit = jax.make_mesh((8,), ("data",), axis_types=(EXPLICIT,), devices=cpu_devices)
  auto = Mesh(np.array(cpu_devices), ("data",))
  params = make_params()
  runs = []
  for mesh in (auto, explicit):
    opt = optcore.adam(1e-2).create_sharded(
      params, mesh=mesh, state_axis="data", state_memory_kind="pinned_host"
    )
    step = jax.jit(lambda o: o.apply_gradient(_grads(o.target)))
    for _ in range(3):
      opt = step(opt)
    runs.append(opt)
  nu = runs[1].state.param_states[0].nu["dense"]["kernel"]
  assert nu.sharding.memory_kind == "pinned_host" and nu.sharding.spec == P(None, "data")
  for a, b in zip(jax.tree.leaves(runs[1]), jax.tree.leaves(runs[0]), strict=True):
    np.testing.assert_allclose(comparable(a), comparable(b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
  "make",
  [
    lambda: optcore.legacy.LAMB(1e-2),  # optcore's step: a norm across the split dimension
    # (not adafactor: optax's own init of a factored state fails eagerly on Explicit axes
    # under jax 0.10.2, "Length of device assignment 1 is not equal to the size of the mesh")
    lambda: optcore.skip_bad_steps(optcore.lamb(1e-2)),
  ],
  ids=["legacy.LAMB", "skip_bad_steps(lamb)"],
)
def test_as_optax_on_explicit_axes_gives_the_auto_axes_numbers(make, cpu_devices):
  """``as_optax()`` in a plain optax loop over split parameters, as a TrainState runs it."""
  import optax

  loss = lambda p: jnp.sum(jnp.sin(p["dense"]["kernel"])) + jnp.sum(p["attn"] ** 2)
  specs = {"dense": {"kernel": P(None, "model"), "bias": P("model")}, "attn": P(None, "model")}

  def run(kind):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind), devices=cpu_devices)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    params = jax.device_put(make_params(), shardings)
    tx = make().as_optax()
    state = tx.init(params)

    @jax.jit
    def step(params, state):
      value, grads = jax.value_and_grad(loss)(params)
      updates, state = tx.update(grads, state, params, value=value, grad=grads, value_fn=loss)
      return optax.apply_updates(params, updates), state

    for _ in range(3):
      params, state = step(params, state)
    for x, want in zip(jax.tree.leaves(params), jax.tree.leaves(shardings), strict=True):
      assert x.sharding.is_equivalent_to(want, x.ndim)  # the parameters kept their sharding
    return params, state

  runs = [run(jax.sharding.AxisType.Auto), run(EXPLICIT)]
  # Measured (jax 0.12.0.1, 2-core x86 CPU): 0.078 of atol = rtol = 1e-6 at the default ISA,
  # bitwise under SSE4_2 and AVX.
  for a, b in zip(jax.tree.leaves(runs[1]), jax.tree.leaves(runs[0]), strict=True):
    np.testing.assert_allclose(comparable(a), comparable(b), rtol=1e-6, atol=1e-6)


def test_a_loss_function_closing_over_a_split_batch_runs_on_its_mesh(cpu_devices):
  """``as_optax()`` of optax's own L-BFGS: its tree flattening runs with the axes Auto, and the
  line search's ``value_fn`` with them Explicit again, so the batch it closes over (split over
  'data') meets typed parameters."""
  import optax

  def run(kind):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(kind, kind), devices=cpu_devices)
    params = {"w": jax.device_put(jnp.full((16, 8), 0.1), NamedSharding(mesh, P(None, "model")))}
    x = jax.device_put(jnp.arange(64.0).reshape(4, 16) / 64, NamedSharding(mesh, P("data")))
    tx = optcore.lbfgs().as_optax()

    @jax.jit
    def step(params, state, x):
      loss = lambda p: jnp.sum(jnp.tanh(x @ p["w"]) ** 2)
      value, grads = jax.value_and_grad(loss)(params)
      updates, state = tx.update(grads, state, params, value=value, grad=grads, value_fn=loss)
      return optax.apply_updates(params, updates), state

    params, state = params, tx.init(params)
    for _ in range(3):
      params, state = step(params, state, x)
    assert params["w"].sharding.spec == P(None, "model")
    return params, state

  auto, explicit = run(jax.sharding.AxisType.Auto), run(EXPLICIT)
  # Measured (2-core x86 CPU) as a fraction of atol = rtol = 1e-6: jax 0.12.0.1 0.0009 at the
  # default ISA, 0.039 under SSE4_2, 0.0056 under AVX; jax 0.10.2 bitwise.
  for a, b in zip(jax.tree.leaves(explicit), jax.tree.leaves(auto), strict=True):
    np.testing.assert_allclose(comparable(a), comparable(b), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
  "wrap",
  [
    lambda d: optcore.mixed_precision(d, state_dtype=jnp.bfloat16, master_dtype=jnp.float32),
    lambda d: optcore.low_bit_state(d, bits=8, block_size=3, min_size=0),
    lambda d: optcore.stochastic_rounding(d, seed=1),
  ],
  ids=["mixed_precision", "low_bit_state", "stochastic_rounding"],
)
def test_a_state_stored_smaller_is_made_from_parameters_split_on_explicit_axes(wrap, cpu_devices):
  """Their state is made in one program that casts, pads and quantizes leaf by leaf: on
  parameters split over Explicit axes, without jax.set_mesh, that program failed (a padding of
  a split dimension; on jax 0.10 any such program outside a mesh context). It runs with the axes
  Auto, and the state and a step are the ones of the same parameters on one device."""
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(EXPLICIT,) * 2, devices=cpu_devices)
  whole = {"kernel": jnp.linspace(-1.0, 1.0, 512).reshape(16, 32), "bias": jnp.linspace(0, 1, 32)}
  split = {
    "kernel": jax.device_put(whole["kernel"], NamedSharding(mesh, P("a", "b"))),
    "bias": jax.device_put(whole["bias"], NamedSharding(mesh, P("b"))),
  }
  opt_def = wrap(optcore.adam(1e-2))
  grads = jax.tree.map(lambda x: jnp.cos(x) * 0.5, whole)
  on_mesh = opt_def.create(split).apply_gradient(grads)
  alone = opt_def.create(whole).apply_gradient(grads)
  # Per-element casts, quantization and Adam: the same numbers split or whole (measured: equal
  # to the bit on jax 0.12 and 0.10.2, default and SSE4_2 code).
  for got, want in zip(jax.tree.leaves(on_mesh), jax.tree.leaves(alone), strict=True):
    np.testing.assert_array_equal(comparable(got), comparable(want))
