"""optcore inside Flax's own ``nnx.Optimizer`` (through ``opt_def.as_optax()``): the keyword
arguments of ``update`` are hyper-parameters for that step, honoured or refused as
``apply_gradient``'s overrides are, and a program that forgot ``import optcore_flax`` is told so
instead of crashing inside optax (issue 41, point 3)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import optcore
import optcore_flax  # noqa: F401  (optcore reads nnx Variables once it is imported)


def model():
  return nnx.Linear(3, 2, rngs=nnx.Rngs(0))


def grads_of(m):
  return nnx.grad(lambda m: jnp.sum(m(jnp.ones((4, 3))) ** 2))(m)


def kernel(m):
  return np.asarray(m.kernel[...])


@pytest.mark.parametrize(
  "opt_def",
  [
    optcore.sgd(0.1, momentum=0.9),
    optcore.adamw(1e-2),
    optcore.MultiOptimizer((r"kernel$", optcore.adam(1e-2)), (r"bias$", optcore.sgd(0.1))),
    optcore.accumulate(optcore.adam(1e-2), every=1),
    optcore.legacy.Adam(1e-2),
  ],
  ids=["sgd", "adamw", "multi", "accumulate", "legacy-adam"],
)
def test_a_learning_rate_given_to_update_is_honoured(opt_def):
  m = model()
  opt = nnx.Optimizer(m, opt_def.as_optax(), wrt=nnx.Param)
  before = kernel(m)
  opt.update(m, grads_of(m), learning_rate=0.0)
  np.testing.assert_array_equal(kernel(m), before)  # lr 0: nothing moves
  # The same override through the core's Optimizer gives the same parameters.
  m, ref_model = model(), model()
  opt = nnx.Optimizer(m, opt_def.as_optax(), wrt=nnx.Param)
  ref = opt_def.create(nnx.state(ref_model, nnx.Param))
  for lr in (0.3, 0.05):
    grads = grads_of(m)
    opt.update(m, grads, learning_rate=lr)
    ref = ref.apply_gradient(grads, learning_rate=lr)
  np.testing.assert_allclose(kernel(m), np.asarray(ref.target["kernel"]), rtol=1e-6, atol=1e-7)


def test_under_nnx_jit_a_new_learning_rate_does_not_recompile():
  m = model()
  opt = nnx.Optimizer(m, optcore.sgd(0.1).as_optax(), wrt=nnx.Param)
  traces = []

  @nnx.jit
  def step(m, opt, lr):
    traces.append(1)
    opt.update(m, grads_of(m), learning_rate=lr)

  before = kernel(m)
  step(m, opt, jnp.float32(0.0))
  np.testing.assert_array_equal(kernel(m), before)
  step(m, opt, jnp.float32(0.5))
  assert not np.array_equal(kernel(m), before)
  assert len(traces) == 1


def test_a_misspelt_hyper_parameter_warns_naming_it_and_changes_nothing():
  """Flax's nnx.Optimizer hands update's keywords to the optax transformation, whose contract
  is to ignore what it does not use: a near miss of a hyper-parameter warns, naming it, and
  the step is the one without it (optcore's own face refuses it: test_nnx_face.py)."""
  m, twin = model(), model()
  opt = nnx.Optimizer(m, optcore.adam(1e-2).as_optax(), wrt=nnx.Param)
  plain = nnx.Optimizer(twin, optcore.adam(1e-2).as_optax(), wrt=nnx.Param)
  with pytest.warns(UserWarning, match=r"'lerning_rate' is no hyper-parameter.*'learning_rate'"):
    opt.update(m, grads_of(m), lerning_rate=0.0)
  plain.update(twin, grads_of(twin))
  np.testing.assert_array_equal(kernel(m), kernel(twin))
  multi = optcore.MultiOptimizer((r"kernel$", optcore.adam(1e-2)), (r"bias$", optcore.sgd(0.1)))
  opt = nnx.Optimizer(m, multi.as_optax(), wrt=nnx.Param)
  with pytest.warns(UserWarning, match=r"'lr' is no hyper-parameter.*'learning_rate'"):
    opt.update(m, grads_of(m), lr=0.0)


def test_a_group_takes_only_the_overrides_it_has():
  m = model()
  multi = optcore.MultiOptimizer(
    (r"kernel$", optcore.adam(1e-2)), (r"bias$", optcore.sgd(0.1, momentum=0.9))
  )
  opt = nnx.Optimizer(m, multi.as_optax(), wrt=nnx.Param)
  bias = np.asarray(m.bias[...])
  opt.update(m, grads_of(m), momentum=0.5, learning_rate=0.0)  # adam has no momentum
  np.testing.assert_array_equal(np.asarray(m.bias[...]), bias)


def test_without_import_optcore_flax_a_selector_program_is_told_what_to_import():
  program = textwrap.dedent(
    """
    import jax.numpy as jnp
    from flax import nnx
    import optcore

    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    multi = optcore.MultiOptimizer((r"kernel$", optcore.adam(1e-2)), (r"bias$", optcore.sgd(0.1)))
    try:
      nnx.Optimizer(model, multi.as_optax(), wrt=nnx.Param)  # construction already refuses
    except TypeError as error:
      print("REFUSED:", error)
    """
  )
  result = subprocess.run(
    [sys.executable, "-W", "ignore", "-c", program], capture_output=True, text=True, check=True
  )
  assert "REFUSED:" in result.stdout, result.stdout + result.stderr
  assert "import optcore_flax" in result.stdout
  assert "Param at '/bias'" in result.stdout or "Param at '/kernel'" in result.stdout


def test_the_read_out_functions_read_an_nnx_optimizers_state_with_its_definition():
  schedule = optax.exponential_decay(1.0, 1, 0.5)
  opt_def = optcore.ema(optcore.sgd(schedule), decay=0.5)
  m = model()
  before = kernel(m)
  optimizer = nnx.Optimizer(m, opt_def.as_optax(), wrt=nnx.Param)
  optimizer.update(m, grads_of(m))
  average = optcore.ema_params(optimizer.opt_state, optimizer_def=opt_def)
  np.testing.assert_allclose(average["kernel"], 0.5 * before + 0.5 * kernel(m), rtol=1e-6)
  expected = np.asarray(average["kernel"])
  nnx.update(m, average)  # an nnx State: the model now holds the average
  np.testing.assert_array_equal(kernel(m), expected)
  read = optcore.current_hyper_params(optimizer.opt_state, optimizer_def=opt_def)
  assert float(read["learning_rate"]) == float(schedule(1))


def test_the_read_outs_read_flaxs_own_optimizer_state_without_optcore_flax():
  """Issue 62: Flax's nnx.Optimizer keeps each array of opt_state in an OptState Variable; a
  program that never imported optcore_flax met "Triggering __jax_array__() during
  abstractification" from optcore.statistics. A fresh process, so optcore_flax is not loaded."""
  program = textwrap.dedent(
    """
    import sys
    import jax.numpy as jnp
    from flax import nnx
    import optcore

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    opt_def = optcore.ema(optcore.with_statistics(optcore.sgd(0.5)), decay=0.5)
    optimizer = nnx.Optimizer(model, opt_def.as_optax(), wrt=nnx.Param)
    before = model.kernel[...]
    grads = nnx.grad(lambda m: jnp.sum(m(jnp.ones((1, 3)))))(model)
    optimizer.update(model, grads)
    assert "optcore_flax" not in sys.modules
    stats = optcore.statistics(optimizer.opt_state, optimizer_def=opt_def)
    average = optcore.ema_params(optimizer.opt_state, optimizer_def=opt_def)
    rates = optcore.current_hyper_params(optimizer.opt_state, optimizer_def=opt_def)
    # sgd(0.5) on a gradient of ones: each kernel entry moves 0.5, the norm of 6 of them
    print(float(stats["kernel/grad_norm"]), float(stats["kernel/update_norm"]))
    print(float(jnp.max(jnp.abs(average["kernel"] - (before + model.kernel[...]) / 2))))
    print(float(rates["learning_rate"]))
    """
  )
  result = subprocess.run(
    [sys.executable, "-W", "ignore", "-c", program], capture_output=True, text=True, check=False
  )
  assert result.returncode == 0, result.stderr[-3000:]
  norms, distance, rate = result.stdout.split("\n")[:3]
  grad_norm, update_norm = map(float, norms.split())
  assert grad_norm == pytest.approx(6**0.5, rel=1e-6)
  assert update_norm == pytest.approx(0.5 * 6**0.5, rel=1e-6)
  assert float(distance) == 0.0 and float(rate) == 0.5


@pytest.mark.parametrize(
  "opt_def",
  [
    optcore.adamw(0.1),
    optcore.accumulate(optcore.adam(0.1), every=2),
    optcore.legacy.Adam(0.1),
    optcore.MultiOptimizer((r"kernel", optcore.adam(0.1))),
  ],
  ids=["adamw", "accumulate", "legacy.Adam", "multi"],
)
def test_the_moments_keep_the_parameters_sharding_metadata_as_optaxs_own_do(opt_def):
  """Flax's own test_sharding_propagation: once optcore_flax was imported, as_optax() unboxed the
  Variables before init and the moments lost the kernel's sharding (issue 42). Each moment that
  has the kernel's shape now carries its metadata, as raw optax's adamw's do."""
  with jax.set_mesh(jax.make_mesh((1, 1), ("a", "b"))):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), sharding=("a", "b"))
    m = nnx.Linear(3, 2, rngs=nnx.Rngs(0), kernel_init=init, use_bias=False)

    def sharded_specs(tx):
      state = nnx.state(nnx.Optimizer(m, tx, wrt=nnx.Param))
      specs = nnx.get_partition_spec(state)["opt_state"]
      return [s for s in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)) if s != P()]

    assert sharded_specs(optax.adamw(0.1)) == [P("a", "b"), P("a", "b")]  # Flax's own test
    ours = sharded_specs(opt_def.as_optax())
    assert len(ours) >= 2 and all(spec == P("a", "b") for spec in ours)  # mu, nu (, the mean)
    optimizer = nnx.Optimizer(m, opt_def.as_optax(), wrt=nnx.Param)
    before = kernel(m)
    for _ in range(2):
      nnx.jit(lambda o, m, g: o.update(m, g))(optimizer, m, grads_of(m))
    assert not np.array_equal(kernel(m), before)  # the boxed state still steps, under nnx.jit
