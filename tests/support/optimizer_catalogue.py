"""Every wrapped optax optimizer with a config that runs, and what its update needs.

Shared by the core tests and (later) the conformance tests: one entry per name
in ``optcore.OPTAX_ALIASES`` and ``optcore.contrib.CONTRIB_OPTIMIZERS``. A test
asserts that the catalogue covers both lists, so a new optax optimizer fails
loudly until it is given a config here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optcore


@dataclasses.dataclass(frozen=True)
class Case:
  name: str  # 'adam' or 'contrib.muon'
  kwargs: dict[str, Any]
  # Which extra update arguments the optimizer needs: 'value', 'lbfgs', 'obj_fn'.
  extra: str | None = None
  # dpsgd takes per-example gradients (a leading batch axis).
  per_example: bool = False
  # The hyper-parameter that scales the step, None where there is none.
  lr_name: str | None = "learning_rate"
  # Whether a zero rate leaves the params bitwise unchanged. Not so where the
  # params are recomputed from other state (schedule-free's interpolation,
  # madgrad's dual averaging) or where optax divides by the rate (prodigy).
  frozen_at_zero_lr: bool = True
  # Where the optimizer needs sub-transformations: built fresh per call.
  make_args: Callable[[bool], dict[str, Any]] | None = None

  @property
  def id(self) -> str:
    return self.name

  def optax_factory(self) -> Callable[..., Any]:
    """optax's factory; for optcore's own optimizers (no optax original), the optax
    transformation factory optcore wraps (``optcore.contrib.soap`` wraps ``_src.soap.soap``)."""
    name = self.name.removeprefix("contrib.")
    if name in optcore.contrib.OWN_OPTIMIZERS:
      return getattr(optcore.contrib, name).__wrapped__
    module = optax.contrib if self.name.startswith("contrib.") else optax
    return getattr(module, name)

  def optcore_factory(self) -> Callable[..., Any]:
    if self.name.startswith("contrib."):
      return getattr(optcore.contrib, self.name.removeprefix("contrib."))
    return getattr(optcore, self.name)

  def optax_kwargs(self) -> dict[str, Any]:
    return {**self.kwargs, **(self.make_args(False) if self.make_args else {})}

  def optcore_kwargs(self) -> dict[str, Any]:
    return {**self.kwargs, **(self.make_args(True) if self.make_args else {})}


def _base(use_optcore: bool, lr: float = 0.1):
  return optcore.sgd(lr, momentum=0.9) if use_optcore else optax.sgd(lr, momentum=0.9)


LR = {"learning_rate": 0.05}

CASES = [
  Case("adabelief", LR),
  Case("adadelta", {"learning_rate": 0.5}),
  Case("adafactor", LR),
  Case("adagrad", LR),
  Case("adam", LR),
  Case("adamax", LR),
  Case("adamaxw", LR),
  Case("adamw", LR),
  Case("adan", LR),
  Case("amsgrad", LR),
  Case("fromage", LR),
  Case("lamb", LR),
  Case("lars", LR),
  Case("lbfgs", {"learning_rate": 0.1}, extra="lbfgs"),
  Case("lion", LR),
  Case("nadam", LR),
  Case("nadamw", LR),
  Case("noisy_sgd", {**LR, "key": 0}),
  Case("novograd", LR),
  # Defined in optax's alias module, offered as optax.<name>, missing from optax.__all__.
  Case("optimistic_adam", LR),
  Case("optimistic_adam_v2", LR),
  Case("optimistic_gradient_descent", LR),
  Case("polyak_sgd", {"max_learning_rate": 0.5}, extra="value", lr_name="max_learning_rate"),
  Case("radam", LR),
  Case("rmsprop", LR),
  # rprop's learning_rate only initialises its per-parameter step sizes.
  Case("rprop", LR, lr_name=None),
  Case("sgd", {**LR, "momentum": 0.9, "nesterov": True}),
  Case("sign_sgd", LR),
  Case("signum", LR),
  Case("sm3", LR),
  Case("yogi", LR),
  Case("contrib.acprop", LR),
  Case("contrib.ademamix", LR),
  Case("contrib.adopt", LR),
  Case("contrib.cocob", {"learning_rate": 1.0}),
  Case("contrib.dadapt_adamw", {"learning_rate": 1.0}, frozen_at_zero_lr=False),
  Case("contrib.dog", {"learning_rate": 1.0}),
  Case("contrib.dowg", {"learning_rate": 1.0}),
  Case(
    "contrib.dpsgd",
    {**LR, "l2_norm_clip": 1.0, "noise_multiplier": 0.1, "seed": 0},
    per_example=True,
  ),
  Case("contrib.galore", {**LR, "rank": 2, "update_proj_gap": 2}),
  Case("contrib.madgrad", LR, frozen_at_zero_lr=False),
  Case("contrib.mechanize", {}, lr_name=None, make_args=lambda c: {"base_optimizer": _base(c)}),
  Case("contrib.momo", {"learning_rate": 0.5}, extra="value"),
  Case("contrib.momo_adam", {"learning_rate": 0.1}, extra="value"),
  Case("contrib.muon", LR),
  Case("contrib.prodigy", {"learning_rate": 1.0}, frozen_at_zero_lr=False),
  Case(
    "contrib.sam",
    {"sync_period": 2},
    lr_name=None,
    make_args=lambda c: {"optimizer": _base(c), "adv_optimizer": _base(c, 0.01)},
  ),
  Case(
    "contrib.schedule_free",
    LR,
    frozen_at_zero_lr=False,
    make_args=lambda c: {"base_optimizer": _base(c, 1.0)},
  ),
  Case("contrib.schedule_free_adamw", LR, frozen_at_zero_lr=False),
  Case("contrib.schedule_free_sgd", LR, frozen_at_zero_lr=False),
  Case("contrib.simplified_ademamix", LR),
  # Dimensions above 8 keep the identity: the (16, 32) kernel's first factors (and those of
  # a layer of the (2, 8, 16) stack) would have null spaces whose eigenbases rounding decides
  # (docs/concepts/soap.md). The stack's 2 and 8 are preconditioned.
  Case("contrib.soap", {**LR, "precondition_frequency": 2, "max_precond_dim": 8}),
  # Blocks of 32 without merging (the 8-device tests' (16, 32) kernel is one block per
  # dimension), preconditioned from the second step on. Blocks of 8 with merging (about a
  # hundred statistics) made a ZeRO-1 program on which XLA's CPU compiler crashed (SIGSEGV)
  # in two of three full runs of the 3.13 cross-face session, never alone.
  Case(
    "contrib.shampoo",
    {
      **LR,
      "block_size": 32,
      "best_effort_shape_interpretation": False,
      "start_preconditioning_step": 1,
      "matrix_epsilon": 1e-2,
    },
  ),
  # The 1-D leaves (the bias) follow lr_1d, not learning_rate: a rate of 0 freezes the kernel.
  Case("contrib.mars", {**LR, "weight_decay": 0.1}, frozen_at_zero_lr=False),
  # The non-matrix leaves follow adam_learning_rate: a rate of 0 freezes the matrices only.
  Case("contrib.normuon", {**LR, "weight_decay": 0.1}, frozen_at_zero_lr=False),
  # One rate for the matrices and the rest, as one group of the reference.
  Case("contrib.dion", {**LR, "weight_decay": 0.1}),
  # A rate of 0 rescales each leaf back to its own norm: the same up to rounding, not bitwise.
  Case("contrib.adamh", LR, frozen_at_zero_lr=False),
  Case("contrib.muonh", LR, frozen_at_zero_lr=False),
  Case("contrib.kron", LR),
  Case("contrib.sophia", LR, extra="obj_fn"),
  Case(
    "contrib.split_real_and_imaginary", {}, lr_name=None, make_args=lambda c: {"inner": _base(c)}
  ),
]


def make_params(seed: int = 0, dtype=jnp.float32) -> dict[str, Any]:
  """A small tree with a matrix, a vector and a nested level."""
  rng = np.random.default_rng(seed)
  return {
    "dense": {
      "kernel": jnp.asarray(rng.normal(size=(4, 3)), dtype),
      "bias": jnp.asarray(rng.normal(size=(3,)), dtype),
    },
    "scale": jnp.asarray(rng.normal(size=(2, 5)), dtype),
  }


def loss_fn(params: Any) -> jax.Array:
  """A smooth loss with a different minimum per leaf."""
  leaves = jax.tree.leaves(params)
  return sum(jnp.sum((x - 0.3 * i) ** 2) + 0.1 * jnp.sum(x**4) for i, x in enumerate(leaves))


def per_example_grads(params: Any, batch: int = 3) -> Any:
  """dpsgd's input: one gradient per example, stacked on a leading axis."""
  scales = jnp.arange(1, batch + 1, dtype=jnp.float32) / batch
  grads = jax.grad(loss_fn)(params)
  return jax.tree.map(lambda g: scales.reshape((-1,) + (1,) * g.ndim) * g[None], grads)


def grads_and_extra(case: Case, params: Any) -> tuple[Any, dict[str, Any]]:
  """The gradients and the extra update arguments ``case`` needs at ``params``."""
  grads = per_example_grads(params) if case.per_example else jax.grad(loss_fn)(params)
  if case.extra == "value":
    return grads, {"value": loss_fn(params)}
  if case.extra == "lbfgs":
    return grads, {"value": loss_fn(params), "grad": grads, "value_fn": loss_fn}
  if case.extra == "obj_fn":
    return grads, {"obj_fn": loss_fn}
  return grads, {}
