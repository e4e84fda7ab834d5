"""Every face of optcore, as the cross-face tests drive it: one entry each.

The conformance tests (same numbers, same override answers, same state-dict
bytes), the cross-face checkpoint tests and the cross-face warning and
wrong-input tests loop over `FACES`; a new framework face joins all of them
by one entry here (see docs/development.md, "A new framework face").

Each face holds the parameters in its framework's own container and drives
its own optimizer object, through its public API only:

- ``create(opt_def, params)``: a handle (a pytree: the face's optimizer with
  the parameters it trains) from a plain dict of parameters;
- ``step(handle, grads, overrides)``: one update from a plain dict of
  gradients, the next handle; ``jit(step)`` is the face's own jit;
- ``params(handle)``: the parameters, as a plain dict;
- ``state_dict(handle)`` / ``restore(handle, state_dict)``: what the face
  writes (a nested dict of arrays) and reads back;
- ``updates(handle, grads, overrides)``: optax-style updates, where the face
  offers them (``apply_updates=False``);
- ``fingerprint(opt_def, params, fill)``: the bytes of its checkpoint with a
  filled state (`state_dict_bytes.py`);
- ``create_sharded(opt_def, params, mesh, **placement)``: a handle whose state
  is placed through the face's own shard method (``state_axis``,
  ``state_memory_kind``), the parameters replicated;
- ``ema_params(handle)``: the moving average an `optcore.ema` definition
  keeps, through the face's own accessor, as a plain dict;
- ``eval_params(handle)``: where a schedule-free definition evaluates, through the face's own
  accessor, as a plain dict;
- ``statistics(handle)``: `optcore.statistics` of the face's own optimizer;
- ``current_hyper_params(handle)``: the face's own ``current_hyper_params()``;
- ``transplant(handle, state_dict)``: ``(handle, report)`` through
  `optcore.transplant` (the face's parameters passed where it does not hold them).

The framework imports are inside the functions: the core's venv, which has
none of them, can still import this module (and the face list).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

import optcore

PyTree = Any


@dataclasses.dataclass(frozen=True)
class Face:
  """How the cross-face tests drive one face."""

  name: str
  #: The package the face is (test_every_adapter_package_is_a_face_of_the_registry reads it).
  module: str
  create: Callable[[Any, dict], PyTree]
  step: Callable[[PyTree, dict, dict], PyTree]
  params: Callable[[PyTree], dict]
  state_dict: Callable[[PyTree], Any]
  restore: Callable[[PyTree, Any], PyTree]
  fingerprint: Callable[[Any, dict, Callable], Any]
  jit: Callable[[Callable], Callable] = jax.jit
  updates: Callable[[PyTree, dict, dict], dict] | None = None
  create_sharded: Callable[..., PyTree] | None = None
  ema_params: Callable[[PyTree], dict] | None = None
  eval_params: Callable[[PyTree], dict] | None = None
  statistics: Callable[[PyTree], dict] | None = None
  current_hyper_params: Callable[[PyTree], dict] | None = None
  transplant: Callable[[PyTree, Any], tuple[PyTree, Any]] | None = None

  def __repr__(self) -> str:
    return self.name


# The core: optcore.Optimizer over a plain dict.


def _core_fingerprint(opt_def, params, fill):
  opt = opt_def.create(params)
  return opt.replace(state=fill(opt.state), target=fill(opt.target)).state_dict()


CORE = Face(
  name="core",
  module="optcore",
  create=lambda opt_def, params: opt_def.create(params),
  step=lambda opt, grads, overrides: opt.apply_gradient(grads, **overrides),
  params=lambda opt: opt.target,
  state_dict=lambda opt: opt.state_dict(),
  restore=lambda opt, sd: opt.restore_state(sd),
  fingerprint=_core_fingerprint,
  create_sharded=lambda opt_def, params, mesh, **kw: opt_def.create_sharded(
    params, mesh=mesh, **kw
  ),
  ema_params=lambda opt: opt.ema_params,
  eval_params=lambda opt: opt.eval_params,
  statistics=optcore.statistics,
  current_hyper_params=lambda opt: opt.current_hyper_params(),
  transplant=optcore.transplant,
)


# flax.optim's face: optcore_flax.optim.Optimizer over a FrozenDict, msgpack bytes.


def _freeze(tree):
  import flax

  return flax.core.freeze(tree)


def _unfreeze(tree):
  import flax

  return flax.core.unfreeze(tree)


def _flax_create(opt_def, params):
  import optcore_flax  # noqa: F401  (registers the Flax layout)

  return opt_def.create(_freeze(params))  # flax.optim's Optimizer is optcore's


def _flax_state_dict(opt):
  import flax.serialization

  return flax.serialization.to_state_dict(opt)


def _flax_restore(opt, state_dict):
  import flax.serialization

  return flax.serialization.from_state_dict(opt, state_dict)


def _flax_fingerprint(opt_def, params, fill):
  import flax.serialization

  opt = _flax_create(opt_def, params)
  opt = opt.replace(state=fill(opt.state), target=fill(opt.target))
  return flax.serialization.to_bytes(opt)


def _flax_create_sharded(opt_def, params, mesh, **placement):
  import optcore_flax

  return optcore_flax.create_sharded(opt_def, _freeze(params), mesh, **placement)


FLAX = Face(
  name="flax",
  module="optcore_flax",
  create=_flax_create,
  step=lambda opt, grads, overrides: opt.apply_gradient(_freeze(grads), **overrides),
  params=lambda opt: _unfreeze(opt.target),
  state_dict=_flax_state_dict,
  restore=_flax_restore,
  fingerprint=_flax_fingerprint,
  create_sharded=_flax_create_sharded,
  ema_params=lambda opt: _unfreeze(opt.ema_params),
  eval_params=lambda opt: _unfreeze(opt.eval_params),
  statistics=optcore.statistics,
  current_hyper_params=lambda opt: opt.current_hyper_params(),
  transplant=optcore.transplant,
)


# Equinox: optcore_equinox.Optimizer with the parameters as an eqx.Module's field.


_CLASSES: dict[tuple[str, tuple[str, ...]], type] = {}


def _eqx_model(params):
  """An eqx.Module with one field per parameter name (one class per set of names)."""
  import equinox as eqx

  key = ("equinox", tuple(sorted(params)))  # fields in a dict's order: the same leaf order
  if key not in _CLASSES:
    annotations = dict.fromkeys(key[1], jax.Array)
    _CLASSES[key] = type("Params", (eqx.Module,), {"__annotations__": annotations})
  return _CLASSES[key](**params)


def _fields(container) -> dict:
  return {name: getattr(container, name) for name in _field_names(container)}


def _field_names(container) -> tuple[str, ...]:
  return next(k[1] for k, cls in _CLASSES.items() if cls is type(container))


def _transplant_optimizer(handle, state_dict):
  """A ``(params, optimizer)`` handle's optimizer transplanted (given its parameters)."""
  params, opt = handle
  opt, report = optcore.transplant(opt, state_dict, params)
  return (params, opt), report


def _restore_optimizer(handle, state_dict):
  """A ``(params, optimizer)`` handle with the optimizer's ``restore_state`` applied."""
  params, opt = handle
  return params, opt.restore_state(state_dict)


def _eqx_create(opt_def, params):
  import optcore_equinox

  model = _eqx_model(params)
  return model, optcore_equinox.Optimizer(opt_def, model)


def _eqx_step(handle, grads, overrides):
  model, opt = handle
  return opt.update(type(model)(**grads), model, **overrides)


def _eqx_fingerprint(opt_def, params, fill):
  import optcore_equinox

  opt = optcore_equinox.Optimizer(opt_def, params)
  return opt.restore_state({"state": optcore.to_state_dict(fill(opt.state))}).state_dict()


def _eqx_create_sharded(opt_def, params, mesh, **placement):
  model, opt = _eqx_create(opt_def, params)
  return model, opt.shard(model, mesh=mesh, **placement)


def _eqx_jit(fn):
  import equinox as eqx

  return eqx.filter_jit(fn)


EQUINOX = Face(
  name="equinox",
  module="optcore_equinox",
  create=_eqx_create,
  step=_eqx_step,
  params=lambda handle: _fields(handle[0]),
  state_dict=lambda handle: handle[1].state_dict(),
  restore=_restore_optimizer,
  fingerprint=_eqx_fingerprint,
  jit=_eqx_jit,
  create_sharded=_eqx_create_sharded,
  ema_params=lambda handle: _fields(handle[1].ema_params(handle[0])),
  eval_params=lambda handle: _fields(handle[1].eval_params(handle[0])),
  statistics=lambda handle: optcore.statistics(handle[1]),
  current_hyper_params=lambda handle: handle[1].current_hyper_params(),
  transplant=_transplant_optimizer,
)


# Treex: optcore_treex.Optimizer (a treeo Tree) with the parameters in a treeo Tree.


def _treeo_params(params):
  """A treeo Tree with one node field per parameter name (one class per set of names)."""
  import treeo as to

  key = ("treeo", tuple(sorted(params)))  # fields in a dict's order: the same leaf order
  if key not in _CLASSES:

    def __init__(self, **values):
      for name, value in values.items():
        setattr(self, name, value)

    namespace = {name: to.field(node=True) for name in key[1]}
    namespace |= {"__annotations__": dict.fromkeys(key[1], jax.Array), "__init__": __init__}
    _CLASSES[key] = type("Params", (to.Tree,), namespace)
  return _CLASSES[key](**params)


def _treex_create(opt_def, params):
  import optcore_treex

  container = _treeo_params(params)
  return container, optcore_treex.Optimizer(opt_def).init(container)


def _treex_step(handle, grads, overrides):
  import treeo as to

  params, opt = handle
  opt = to.copy(opt)  # a treeo optimizer updates in place: keep the handle given unchanged
  new_params = opt.update(type(params)(**grads), params, **overrides)
  return new_params, opt


def _treex_updates(handle, grads, overrides):
  import treeo as to

  params, opt = handle
  updates = to.copy(opt).update(type(params)(**grads), params, apply_updates=False, **overrides)
  return _fields(updates)


def _treex_fingerprint(opt_def, params, fill):
  import optcore_treex

  opt = optcore_treex.Optimizer(opt_def).init(params)
  filled = jax.tree.unflatten(jax.tree.structure(opt), jax.tree.leaves(fill(opt)))
  return filled.state_dict()


def _treex_create_sharded(opt_def, params, mesh, **placement):
  container, opt = _treex_create(opt_def, params)
  return container, opt.shard(container, mesh=mesh, **placement)


TREEX = Face(
  name="treex",
  module="optcore_treex",
  create=_treex_create,
  step=_treex_step,
  params=lambda handle: _fields(handle[0]),
  state_dict=lambda handle: handle[1].state_dict(),
  restore=_restore_optimizer,
  fingerprint=_treex_fingerprint,
  updates=_treex_updates,
  create_sharded=_treex_create_sharded,
  ema_params=lambda handle: _fields(handle[1].ema_params),
  eval_params=lambda handle: _fields(handle[1].eval_params(handle[0])),
  statistics=lambda handle: optcore.statistics(handle[1]),
  current_hyper_params=lambda handle: handle[1].current_hyper_params(),
  transplant=_transplant_optimizer,
)


# Flax NNX: optcore_flax.nnx.Optimizer, the parameters nnx.Params of an nnx.Module; the handle
# is nnx.split's (graphdef, state) pair, as NNX's fast path holds it (a pytree jax.jit takes).


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class NnxHandle:
  graphdef: Any = dataclasses.field(metadata={"static": True})
  state: Any


def _nnx_model(params):
  """An nnx.Module with one nnx.Param per parameter name, a nested module per nested dict (a
  None stays a plain attribute: a gradient the module does not have)."""
  import jax.numpy as jnp
  from flax import nnx

  if "nnx" not in _CLASSES:

    def __init__(self, **values):
      for name, value in values.items():
        if isinstance(value, dict):
          value = _nnx_model(value)
        elif value is not None:
          value = nnx.Param(jnp.asarray(value))
        setattr(self, name, value)

    _CLASSES["nnx"] = type("Params", (nnx.Module,), {"__init__": __init__})
  return _CLASSES["nnx"](**params)


def _nnx_optimizer(opt_def, model):
  from flax import nnx

  from optcore_flax import nnx as ocnnx

  return ocnnx.Optimizer(model, opt_def, wrt=nnx.Param)


def _nnx_split(model, optimizer):
  from flax import nnx

  return NnxHandle(*nnx.split((model, optimizer)))


def _nnx_merge(handle):
  from flax import nnx

  return nnx.merge(handle.graphdef, handle.state)


def _nnx_create(opt_def, params):
  model = _nnx_model(params)
  return _nnx_split(model, _nnx_optimizer(opt_def, model))


def _nnx_step(handle, grads, overrides):
  model, optimizer = _nnx_merge(handle)
  optimizer.update(model, _nnx_model(grads), **overrides)
  return _nnx_split(model, optimizer)


def _nnx_params(handle):
  from flax import nnx

  model, _ = _nnx_merge(handle)
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _nnx_restore(handle, state_dict):
  model, optimizer = _nnx_merge(handle)
  optimizer.restore_state(state_dict)
  return _nnx_split(model, optimizer)


def _nnx_fingerprint(opt_def, params, fill):
  optimizer = _nnx_optimizer(opt_def, _nnx_model(params))
  optimizer.restore_state({"state": optcore.to_state_dict(fill(optimizer.state))})
  return optimizer.state_dict()


def _nnx_create_sharded(opt_def, params, mesh, **placement):
  model = _nnx_model(params)
  return _nnx_split(model, _nnx_optimizer(opt_def, model).shard(model, mesh, **placement))


def _nnx_ema_params(handle):
  model, optimizer = _nnx_merge(handle)
  from flax import nnx

  return nnx.to_pure_dict(optimizer.ema_params(model))


def _nnx_eval_params(handle):
  from flax import nnx

  model, optimizer = _nnx_merge(handle)
  return nnx.to_pure_dict(optimizer.eval_params(model))


def _nnx_transplant(handle, state_dict):
  model, optimizer = _nnx_merge(handle)
  report = optimizer.transplant(state_dict, model)
  return _nnx_split(model, optimizer), report


NNX = Face(
  name="nnx",
  module="optcore_flax.nnx",
  create=_nnx_create,
  step=_nnx_step,
  params=_nnx_params,
  state_dict=lambda handle: _nnx_merge(handle)[1].state_dict(),
  restore=_nnx_restore,
  fingerprint=_nnx_fingerprint,
  create_sharded=_nnx_create_sharded,
  ema_params=_nnx_ema_params,
  eval_params=_nnx_eval_params,
  statistics=lambda handle: optcore.statistics(_nnx_merge(handle)[1]),
  current_hyper_params=lambda handle: _nnx_merge(handle)[1].current_hyper_params(),
  transplant=_nnx_transplant,
)


# optcore.adapter's functions over a plain dict: what a new framework face calls (and how
# the development page's "new face" recipe was tried: this entry alone added it everywhere).


def _adapter_create(opt_def, params):
  opt_def = optcore.adapter.as_definition(opt_def, "the adapter API")
  return opt_def, params, opt_def.init_state(params)


def _adapter_step(handle, grads, overrides):
  opt_def, params, state = handle
  return (opt_def, *optcore.adapter.step(opt_def, params, state, grads, **overrides))


def _adapter_updates(handle, grads, overrides):
  opt_def, params, state = handle
  updates, _ = optcore.adapter.step(opt_def, params, state, grads, apply_updates=False, **overrides)
  return updates


def _adapter_restore(handle, state_dict):
  opt_def, params, state = handle
  return opt_def, params, optcore.adapter.restore_state(opt_def, state, state_dict)


def _adapter_fingerprint(opt_def, params, fill):
  opt_def = optcore.adapter.as_definition(opt_def, "the adapter API")
  return optcore.adapter.state_dict(opt_def, fill(opt_def.init_state(params)))


def _adapter_create_sharded(opt_def, params, mesh, **placement):
  opt_def, params, state = _adapter_create(opt_def, params)
  shardings = optcore.adapter.state_shardings(opt_def, state, params, None, mesh, **placement)
  return opt_def, params, jax.device_put(state, shardings)


def _adapter_transplant(handle, state_dict):
  opt_def, params, state = handle
  state, report = optcore.adapter.transplant_state(opt_def, params, state, state_dict)
  return (opt_def, params, state), report


def _adapter_jit(fn):
  # The definition is no pytree (in a plain tuple it would be a leaf): jit closes over it.
  def call(handle, *args):
    opt_def, params, state = handle
    jitted = jax.jit(lambda p, s, *a: fn((opt_def, p, s), *a)[1:])
    return (opt_def, *jitted(params, state, *args))

  return call


ADAPTER = Face(
  name="adapter",
  module="optcore",
  create=_adapter_create,
  step=_adapter_step,
  params=lambda handle: handle[1],
  state_dict=lambda handle: optcore.adapter.state_dict(handle[0], handle[2]),
  restore=_adapter_restore,
  fingerprint=_adapter_fingerprint,
  jit=_adapter_jit,
  updates=_adapter_updates,
  create_sharded=_adapter_create_sharded,
  ema_params=lambda handle: handle[0].ema_params(handle[2]),
  eval_params=lambda handle: optcore.eval_params(handle[2], handle[1], optimizer_def=handle[0]),
  statistics=lambda handle: optcore.statistics(handle[2], optimizer_def=handle[0]),
  current_hyper_params=lambda handle: handle[0].current_hyper_params(handle[2]),
  transplant=_adapter_transplant,
)


#: Every face; the cross-face tests loop over this list.
FACES: list[Face] = [CORE, FLAX, EQUINOX, TREEX, NNX, ADAPTER]
FACES_BY_NAME: dict[str, Face] = {face.name: face for face in FACES}
