"""optcore_flax: the flax.optim and T5X surfaces against real Flax objects."""

from __future__ import annotations

import ast
import inspect
import re
import sys
import warnings
from pathlib import Path

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from example_runner import run_example
from flax import serialization
from flax.training import train_state
from jax.sharding import PartitionSpec as P
from tree_testing import assert_trees_equal

import optcore
import optcore_flax
from optcore_flax import adafactor, optim, optimizers

ROOT = Path(__file__).resolve().parents[2]


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(nn.relu(nn.Dense(8)(x)))


X = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)
PARAMS = MLP().init(jax.random.key(0), X)["params"]


def loss_fn(params):
  return jnp.mean(MLP().apply({"params": params}, X) ** 2)


def test_the_legacy_program_runs_unchanged_after_one_line():
  source = (ROOT / "examples" / "legacy_flax_optim.py").read_text()
  assert "from flax import optim, serialization" in source
  stdout = run_example("legacy_flax_optim.py")
  assert "checkpoint of" in stdout and "restored bitwise: True" in stdout
  assert "training resumes identically: True" in stdout
  assert "one state per parameter: ['Dense_0', 'Dense_1'] -> ['grad_ema', 'grad_sq_ema']" in stdout
  assert "Dense_0 unchanged: True, Dense_0 state: {'bias': None, 'kernel': None}" in stdout
  losses = {
    line.split(":")[0].split(" loss")[0]: float(re.search(r"loss (\d+\.\d+)", line).group(1))
    for line in stdout.splitlines()
    if re.search(r"loss \d", line)
  }
  assert losses["multi-optimizer"] < losses["momentum step   0"] / 100, losses
  # float16 from the initial parameters: the scale backed off from 65536 on overflow.
  half = stdout.split("float16 with dynamic loss scaling:")[1]
  assert float(half.split("scale")[1].split(",")[0]) < 65536
  assert int(half.split("skipped")[1]) >= 1
  assert losses["float16 with dynamic"] < losses["momentum step   0"]


def test_install_legacy_namespace_serves_both_import_forms():
  optcore_flax.install_legacy_namespace()
  optcore_flax.install_legacy_namespace()  # idempotent
  import flax.optim as imported
  from flax import optim as from_flax

  assert imported is from_flax is optim is sys.modules["flax.optim"]


def test_the_flax_optim_surface_is_complete_and_the_core_algorithms():
  names = (
    "Optimizer OptimizerDef OptimizerState MultiOptimizer ModelParamTraversal GradientDescent "
    "Momentum Adam AdaBelief Adadelta Adagrad RMSProp LAMB LARS Adafactor WeightNorm DynamicScale"
  ).split()
  assert all(hasattr(optim, n) for n in names)
  assert optim.Adam is optcore.legacy.Adam and optim.Optimizer is optcore.Optimizer


OPTIMIZERS = {
  "momentum": lambda: optim.Momentum(0.1, beta=0.9, nesterov=True),
  "adam": lambda: optim.Adam(1e-2, weight_decay=1e-3),
  "adafactor": lambda: optim.Adafactor(
    1e-2, beta1=0.9, dtype_momentum=jnp.bfloat16, min_dim_size_to_factor=2
  ),
  "weight-norm": lambda: optim.WeightNorm(optim.LAMB(1e-2)),
  "rmsprop-centered": lambda: optim.RMSProp(1e-2, centered=True),
  "multi": lambda: optim.MultiOptimizer(
    (optim.ModelParamTraversal(lambda p, _: "kernel" in p), optim.Adam(1e-2)),
    (optim.ModelParamTraversal(lambda p, _: "bias" in p), optim.GradientDescent(1e-2)),
  ),
  "wrapped-optax": lambda: optimizers.adamw(1e-2, weight_decay=0.1),
  "t5x-adafactor": lambda: adafactor.Adafactor(1e-2, min_dim_size_to_factor=2),
}


def _trained(make, steps=3):
  optimizer = make().create(PARAMS)
  step = jax.jit(lambda o: o.apply_gradient(jax.grad(loss_fn)(o.target)))
  for _ in range(steps):
    optimizer = step(optimizer)
  return optimizer


@pytest.mark.parametrize("make", list(OPTIMIZERS.values()), ids=list(OPTIMIZERS))
def test_to_bytes_from_bytes_round_trips_bitwise_in_flax_optims_layout(make):
  optimizer = _trained(make)
  state_dict = serialization.to_state_dict(optimizer)
  assert set(state_dict) == {"target", "state"} and set(state_dict["state"]) == {
    "step",
    "param_states",
  }
  assert_trees_equal(state_dict, optimizer.state_dict())
  # Restored into a fresh definition (for "multi", new traversal functions).
  restored = serialization.from_bytes(make().create(PARAMS), serialization.to_bytes(optimizer))
  assert_trees_equal((restored.target, restored.state), (optimizer.target, optimizer.state))
  # And training continues identically.
  step = jax.jit(lambda o: o.apply_gradient(jax.grad(loss_fn)(o.target)))
  resumed, continued = step(restored), step(optimizer)
  assert_trees_equal((resumed.target, resumed.state), (continued.target, continued.state))


def test_from_bytes_of_another_structure_fails_clearly_and_changes_nothing():
  data = serialization.to_bytes(_trained(OPTIMIZERS["adam"]))
  other = optim.Momentum(0.1).create(PARAMS)
  with pytest.raises(optcore.StateDictError, match="param_states"):
    serialization.from_bytes(other, data)


def test_user_defined_flax_optim_definitions_with_struct_hyper_params():
  @flax.struct.dataclass
  class _SignHyperParams:
    learning_rate: float

  class Sign(optim.OptimizerDef):
    def __init__(self, learning_rate=0.1):
      super().__init__(_SignHyperParams(learning_rate))

    def init_param_state(self, param):
      return ()

    def apply_param_gradient(self, step, hyper_params, param, state, grad):
      return param - hyper_params.learning_rate * jnp.sign(grad), state

  optimizer = Sign(0.5).create({"w": jnp.zeros(2)})
  optimizer = optimizer.apply_gradient({"w": jnp.array([1.0, -2.0])}, learning_rate=0.25)
  np.testing.assert_array_equal(optimizer.target["w"], [-0.25, 0.25])


def test_compute_gradient_optimize_and_replicate():
  optimizer = optim.GradientDescent(0.1).create(PARAMS)
  loss, grad = optimizer.compute_gradient(loss_fn)
  assert_trees_equal((loss, grad), jax.value_and_grad(loss_fn)(PARAMS))
  loss2, aux, _ = optimizer.compute_gradients(lambda p: (loss_fn(p), {"n": 1}))
  assert aux == {"n": 1} and float(loss2) == float(loss)
  with pytest.warns(DeprecationWarning, match="optimize"):
    new, old_loss = optimizer.optimize(loss_fn, learning_rate=0.2)
  assert float(old_loss) == float(loss)
  assert_trees_equal(new.target, jax.tree.map(lambda p, g: p - 0.2 * g, PARAMS, grad))
  replicated = optimizer.replicate()
  assert replicated.state.step.shape == (len(jax.local_devices()),)
  assert_trees_equal(replicated.unreplicate(), optimizer)


def test_focus_follows_flax_optim():
  focus = optim.ModelParamTraversal(lambda path, _: "Dense_0" in path)
  optimizer = optim.Adam(0.1).create(PARAMS, focus=focus)
  assert isinstance(optimizer.optimizer_def, optim.MultiOptimizer)
  assert len(optimizer.optimizer_def.hyper_params) == 1
  new = optimizer.apply_gradient(jax.grad(loss_fn)(PARAMS))
  assert_trees_equal(new.target["Dense_1"], PARAMS["Dense_1"])
  assert not np.array_equal(new.target["Dense_0"]["kernel"], PARAMS["Dense_0"]["kernel"])


# T5X's surfaces.


def test_t5x_optimizers_surface():
  for name in (
    "adamw",
    "sgd",
    "lamb",
    "lars",
    "lion",
    "radam",
    "yogi",
    "dpsgd",
    "fromage",
    "noisy_sgd",
  ):
    assert callable(getattr(optimizers, name)), name
  assert optimizers.OptaxStatePartitionRules is optcore.OptaxStatePartitionRules
  assert {"Adafactor", "FactorDim", "HParamMap", "standard_logical_factor_rules"} <= set(
    dir(adafactor)
  )


def test_t5x_multi_optimizer_of_optax_sub_optimizers_creates_and_round_trips():
  # T5X's own MultiOptimizer fails in create() here ("expected (frozen)dict; got tuple").
  opt_def = optimizers.MultiOptimizer(
    (optim.ModelParamTraversal(lambda p, _: "kernel" in p), optimizers.adamw(1e-2)),
    (optim.ModelParamTraversal(lambda p, _: "bias" in p), optimizers.sgd(1e-2)),
  )
  optimizer = _trained(lambda: opt_def)
  restored = opt_def.create(PARAMS).restore_state(optimizer.state_dict())
  assert_trees_equal(restored, optimizer)
  axes = jax.tree.map(lambda x: P(*(None,) * x.ndim), PARAMS)
  derived = opt_def.derive_logical_axes(optimizer, axes)
  assert derived.restore_state(derived.state_dict()) == derived


def test_t5x_trainer_learning_rate_is_honoured_by_wrapped_factories():
  optimizer = optimizers.sgd(0.1).create({"w": jnp.ones(1)})
  assert (
    float(optimizer.apply_gradient({"w": jnp.ones(1)}, learning_rate=0.5).target["w"][0]) == 0.5
  )


def test_t5x_optax_wrapper_ignores_the_override_with_a_warning():
  optimizer = optimizers.OptaxWrapper(optax.sgd(0.1)).create({"w": jnp.ones(1)})
  with pytest.warns(
    UserWarning, match=r"no hyper-parameter \[.learning_rate.\]: ignored, as T5X ignored it"
  ):
    new = optimizer.apply_gradient({"w": jnp.ones(1)}, learning_rate=0.5)
  np.testing.assert_allclose(new.target["w"], [0.9])
  with pytest.raises(TypeError):  # the core's OptaxWrapper refuses instead
    optcore.OptaxWrapper(optax.sgd(0.1)).create({"w": jnp.ones(1)}).apply_gradient(
      {"w": jnp.ones(1)}, learning_rate=0.5
    )


# Linen partitioning in, shardings out.


class Boxed(nn.Module):
  @nn.compact
  def __call__(self, x):
    kernel = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp"))
    bias = nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",))
    return nn.Dense(8, kernel_init=kernel, bias_init=bias)(x)


def test_linen_boxed_params_give_the_optimizer_axes_and_shardings():
  boxed = Boxed().init(jax.random.key(0), jnp.ones((1, 4)))
  axes = optcore_flax.param_logical_axes(boxed)
  assert axes == nn.get_partition_spec(boxed)
  opt_def = adafactor.Adafactor(1e-2, beta1=0.9)
  opt_def.set_param_axes(axes["params"])
  optimizer = opt_def.create(nn.unbox(boxed)["params"])
  derived = optcore_flax.derive_logical_axes(optimizer, axes["params"])
  assert derived.state.param_states["Dense_0"]["kernel"].m == P("embed", "mlp")
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("model",))
  rules = [("mlp", "model"), ("embed", None)]
  shardings = optcore_flax.optimizer_shardings(optimizer, axes["params"], mesh, rules)
  assert shardings.state.param_states["Dense_0"]["bias"].v.spec == P("model")
  sharded = optcore_flax.create_sharded(optcore.adam(1e-3), boxed, mesh, rules)
  assert sharded.state.param_states[0].mu["params"]["Dense_0"]["kernel"].sharding.spec == P(
    None, "model"
  )


# Modern Flax.


@pytest.mark.parametrize(
  "make",
  [OPTIMIZERS["adam"], OPTIMIZERS["multi"], OPTIMIZERS["t5x-adafactor"]],
  ids=["adam", "multi", "adafactor"],
)
def test_as_optax_in_a_linen_train_state(make):
  tx = make().as_optax()
  state = train_state.TrainState.create(apply_fn=None, params=PARAMS, tx=tx)
  optimizer = make().create(PARAMS)
  for _ in range(3):
    state = state.apply_gradients(grads=jax.grad(loss_fn)(state.params))
    optimizer = optimizer.apply_gradient(jax.grad(loss_fn)(optimizer.target))
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(optimizer.target), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_factored_adafactor_in_an_nnx_optimizer():
  from flax import nnx

  model = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # nnx's own deprecations of the moment
    opt = nnx.Optimizer(
      model, optcore.adafactor(1e-2, min_dim_size_to_factor=4).as_optax(), wrt=nnx.Param
    )
  grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((2, 8))) ** 2))(model)
  opt.update(model, grads)
  core = optcore.adafactor(1e-2, min_dim_size_to_factor=4).create(
    jax.tree.map(
      jnp.asarray, nnx.to_pure_dict(nnx.state(nnx.Linear(8, 16, rngs=nnx.Rngs(0)), nnx.Param))
    )
  )
  core = core.apply_gradient(nnx.to_pure_dict(grads))
  assert_trees_equal(nnx.to_pure_dict(nnx.state(model, nnx.Param)), core.target)


def test_prng_key_state_survives_msgpack():
  """msgpack has no typed keys: noisy_sgd's key is written as its key data and rewrapped."""
  optimizer = _trained(lambda: optimizers.noisy_sgd(1e-2, key=0))
  restored = serialization.from_bytes(
    optimizers.noisy_sgd(1e-2, key=0).create(PARAMS), serialization.to_bytes(optimizer)
  )
  key = restored.state.param_states[0].rng_key
  assert jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(
    jax.random.key_data(key), jax.random.key_data(optimizer.state.param_states[0].rng_key)
  )


def test_t5x_optimizers_writes_out_every_optax_alias_and_dpsgd():
  # Written one per line (static tools see them); this keeps the list complete.
  tree = ast.parse(Path(optimizers.__file__).read_text())
  assigned = {
    target.id
    for node in tree.body
    if isinstance(node, ast.Assign)
    for target in node.targets
    if isinstance(target, ast.Name)
  }
  expected = {*optcore.OPTAX_ALIASES, "dpsgd"}
  assert expected <= assigned
  assert expected <= set(optimizers.__all__)
  for name in expected:
    original = getattr(optax.contrib if name == "dpsgd" else optax, name)
    assert inspect.signature(getattr(optimizers, name)) == inspect.signature(original), name
  assert isinstance(optimizers.lion(learning_rate=0.1), optimizers.OptaxWrapper)
