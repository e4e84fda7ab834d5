"""`qk_clip`: QK-clip (MuonClip's, Kimi K2's), after any definition's step: each attention
head's query and key weights rescaled by the largest attention logit the model saw for that
head; one wrapper of the wrapper protocol (`optcore._src.definitions.wrapper`), with no state
of its own. The statistic reaches the step as the extra update argument ``qk_logits``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import ReadsParamAxes, StateWrapper
from optcore._src.ground import arguments as a
from optcore._src.ground.checks import check_float_params
from optcore._src.ground.declarations import Nested
from optcore._src.ground.hyper_params import OPTAX_EXTRA_ARGS, static_key
from optcore._src.ground.state import OptimizerState

PyTree = Any

#: The extra update argument that carries the statistic.
QK_LOGITS = "qk_logits"


class QKClipState(NamedTuple):
  """The state of `qk_clip`.

  Attributes:
    inner: the wrapped definition's ``param_states`` (the clip keeps nothing of its own: the
      statistic is the step's argument).
  """

  inner: Nested


class _Role(NamedTuple):
  """What one clipped leaf is: its module (a key of ``qk_logits``) and whether it is a query."""

  module: str
  query: bool


class QKClip(ReadsParamAxes, StateWrapper):
  """``optimizer_def``'s step, then QK-clip: see `qk_clip`."""

  name = "qk_clip"
  state_type = QKClipState
  ungrouped_because = "rescales whole attention heads after the step, by the model's statistic"
  twice_hint = "clip once (a second clip of the same logits changes nothing)"
  config_arguments: ClassVar = MappingProxyType(
    {
      "tau": 100.0,
      "alpha": 0.5,
      "query": "query/(kernel|bias)",
      "key": "key/(kernel|bias)",
      "logit_axes": ("heads",),
      "kv_heads": "kv_heads",
      "head_dim": "kv",
      "rope_dims": 0,
      "key_dims": None,
    }
  )
  repr_shows = ("tau",)

  @a.declare(
    tau=a.POSITIVE,
    alpha=a.Number(0, 1),
    query=a.Regex(),
    key=a.Regex(),
    logit_axes=a.AxisNames(),
    kv_heads=a.AxisNames(one=True),
    head_dim=a.AxisNames(one=True),
    rope_dims=a.Number(0, integer=True),
    key_dims=a.Number(1, integer=True, none=True),
  )
  def __init__(self, optimizer_def: OptimizerDef, param_logical_axes: Any = None, **settings: Any):
    s = self.settings(settings)
    self.tau, self.alpha = float(s["tau"]), float(s["alpha"])
    self.query, self.key = s["query"], s["key"]
    self.logit_axes = tuple(s["logit_axes"])
    self.kv_heads, self.head_dim = s["kv_heads"], s["head_dim"]
    self.rope_dims = int(s["rope_dims"])
    self.key_dims = None if s["key_dims"] is None else int(s["key_dims"])
    self.param_logical_axes = param_logical_axes
    super().__init__(optimizer_def)
    if not optimizer_def.steps_every_call:
      raise TypeError(
        f"qk_clip({optimizer_def.display_name()}) would rescale the heads after every call, "
        "also those that only accumulate a gradient. Clip inside: accumulate(qk_clip(...), "
        "every=k), and pass qk_logits the maximum over the window's micro-batches (each call's "
        "running maximum; the applying call's is the one used)."
      )

  def config(self) -> dict[str, Any]:
    written = super().config()
    if "logit_axes" in written:
      written["logit_axes"] = list(written["logit_axes"])  # JSON's lists
    return written

  def _static_key(self) -> tuple:
    settings = tuple(getattr(self, k) for k in self.config_arguments)
    return (type(self), self.optimizer_def, settings, static_key(self.param_logical_axes))

  def extra_arg_names(self) -> frozenset[str]:
    """``qk_logits``, beside what the wrapped definition reads (optax's own extra arguments
    where it takes any)."""
    inner = self.optimizer_def.extra_arg_names()
    return (OPTAX_EXTRA_ARGS if inner is None else inner) | {QK_LOGITS}

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    inner = self.optimizer_def.init_state(params)
    return OptimizerState(inner.step, QKClipState(inner.param_states))

  # Which leaves are clipped, and by what

  def roles(self, params: PyTree, modules: list[str]) -> list[_Role | None]:
    """Per leaf of ``params`` (flatten order) its `_Role`, None for a leaf not clipped: a leaf
    under a module of ``modules`` (the keys of ``qk_logits``; the longest that prefixes its path)
    whose rest of path matches ``query`` or ``key``.

    Raises:
      ValueError: a leaf matching ``query`` or ``key`` under no module given (its heads would
        go unclipped), or a module none of whose leaves matches ``query``.
    """
    out: list[_Role | None] = []
    found: set[str] = set()
    by_length = sorted(modules, key=len, reverse=True)
    for path, _, _ in self.named_leaves(params):
      module = next((m for m in by_length if m == "" or path.startswith(m + "/")), None)
      rest = path if module in (None, "") else path[len(module) + 1 :]
      is_query = re.fullmatch(self.query, rest) is not None
      is_key = re.fullmatch(self.key, rest) is not None
      if module is None:
        if re.fullmatch(f"(.*/)?({self.query}|{self.key})", path):
          raise ValueError(
            f"qk_clip: the parameter at {path!r} is a query or key weight of no module in "
            f"qk_logits (given: {sorted(modules)}), so its heads would go unclipped. Pass each "
            f"attention module's per-head maximum logits: qk_logits={{'<module path>': "
            f"max_logits}}, the module's path being the parameter's without "
            f"{self.query!r} / {self.key!r}."
          )
        out.append(None)
        continue
      if is_query and is_key:
        raise ValueError(
          f"qk_clip: the parameter at {path!r} matches both query={self.query!r} and "
          f"key={self.key!r}; make the patterns tell a query from a key."
        )
      out.append(_Role(module, is_query) if is_query or is_key else None)
      found |= {module} if is_query else set()
    missing = sorted(set(modules) - found)
    if missing:
      raise ValueError(
        f"qk_clip: qk_logits names {missing}, under which no parameter's path matches "
        f"query={self.query!r}: each key of qk_logits is an attention module's path (the "
        "parameters' paths without their query/key part)."
      )
    return out

  def factors(self, params: PyTree, qk_logits: Mapping[str, Any]) -> list[jax.Array | None]:
    """Per leaf of ``params`` (flatten order) the factor its new value is multiplied by, shaped
    to broadcast against it; None for a leaf not clipped. ``eta = min(1, tau / S)`` per head
    (``S`` its maximum logit); a query gets ``eta ** alpha`` (``eta`` on its last ``rope_dims``
    of ``head_dim``), a key ``eta ** (1 - alpha)`` (on its first ``key_dims`` of ``head_dim``;
    the rest, values, 1), where a key has ``kv_heads`` the smallest ``eta`` of its query group.

    Raises:
      ValueError: the leaves or ``qk_logits`` do not fit (`roles`), or a leaf lacks an axis.
      TypeError: no logical axes were given.
    """
    if not isinstance(qk_logits, Mapping):
      raise TypeError(
        f"qk_clip: qk_logits must map each attention module's path to its per-head maximum "
        f"logits ({{'layers/0/attn': max_logits}}); got {type(qk_logits).__name__}."
      )
    modules = list(qk_logits)
    roles = self.roles(params, modules)
    etas = {m: self._eta(m, qk_logits[m]) for m in modules}
    out: list[jax.Array | None] = []
    for (path, leaf, names), role in zip(self.named_leaves(params), roles, strict=True):
      if role is None:
        out.append(None)
        continue
      if names is None:
        raise TypeError(
          f"qk_clip: the heads are read from logical axes, and none were given for {path!r}: "
          "pass param_logical_axes= (one PartitionSpec per parameter, the heads named "
          f"{self.logit_axes[-1]!r}) or create the optimizer with optcore.create_sharded(...)."
        )
      out.append(self._leaf_factor(path, tuple(leaf.shape), names, role, etas[role.module]))
    return out

  def _eta(self, module: str, logits: Any) -> jax.Array:
    """``min(1, tau / S)`` per head: 1 where ``S <= tau`` (a head at or below the threshold, or
    one whose logits are all negative, is left as it is)."""
    s = jnp.asarray(logits, jnp.float32)
    if s.ndim != len(self.logit_axes):
      raise ValueError(
        f"qk_clip: qk_logits[{module!r}] has shape {s.shape}, {s.ndim} dimension(s); "
        f"logit_axes={self.logit_axes} names {len(self.logit_axes)}: one maximum per head "
        "(and per stacked layer, where logit_axes names that axis too)."
      )
    return jnp.where(s > self.tau, self.tau / jnp.where(s > self.tau, s, 1.0), 1.0)

  def _leaf_factor(
    self, path: str, shape: tuple, names: tuple, role: _Role, eta: jax.Array
  ) -> jax.Array:
    heads = self.logit_axes[-1]
    wanted = list(self.logit_axes)
    if not role.query and heads not in names and self.kv_heads in names:
      wanted[-1] = self.kv_heads  # a grouped key: one head of it for several query heads
    missing = [n for n in wanted if n not in names]
    if missing:
      raise ValueError(
        f"qk_clip: the {'query' if role.query else 'key'} parameter at {path!r} has the logical "
        f"axes {names}, without {missing}: name its heads {heads!r} (a grouped key's "
        f"{self.kv_heads!r}) and every axis of logit_axes={self.logit_axes}."
      )
    positions = [names.index(n) for n in wanted]
    for n, p, size in zip(wanted[:-1], positions[:-1], eta.shape[:-1], strict=True):
      if shape[p] != size:
        raise ValueError(
          f"qk_clip: the parameter at {path!r} has {shape[p]} along {n!r}; its module's "
          f"qk_logits {size}."
        )
    head_size = shape[positions[-1]]
    if wanted[-1] == heads and head_size != eta.shape[-1]:
      raise ValueError(
        f"qk_clip: the parameter at {path!r} has {head_size} heads along {heads!r}; its "
        f"module's qk_logits has {eta.shape[-1]}."
      )
    if wanted[-1] != heads:
      if eta.shape[-1] % head_size:
        raise ValueError(
          f"qk_clip: the key at {path!r} has {head_size} heads along {self.kv_heads!r}, which do "
          f"not divide the {eta.shape[-1]} query heads of its module's qk_logits."
        )
      # query head h reads key head h // group: a key head takes its group's smallest eta
      eta = jnp.min(eta.reshape(*eta.shape[:-1], head_size, -1), axis=-1)
    factor = eta ** (self.alpha if role.query else 1.0 - self.alpha)
    split = self.rope_dims if role.query else self.key_dims
    # eta's axes in the leaf's order, every other axis of the leaf 1
    order = sorted(range(len(positions)), key=lambda i: positions[i])
    full = [1] * len(shape)
    for i in order:
      full[positions[i]] = shape[positions[i]]
    if split:
      if self.head_dim not in names:
        raise ValueError(
          f"qk_clip: {'rope_dims' if role.query else 'key_dims'} splits the per-head axis "
          f"{self.head_dim!r}, which the parameter at {path!r} (axes {names}) does not have."
        )
      d = names.index(self.head_dim)
      index = jnp.arange(shape[d]).reshape([-1 if i == d else 1 for i in range(len(shape))])
      factor = jnp.transpose(factor, order).reshape(full)
      eta_full = jnp.transpose(eta, order).reshape(full)
      if role.query:  # the rotary part meets a shared key the clip leaves: all of eta here
        return jnp.where(index >= shape[d] - split, eta_full, factor)
      return jnp.where(index < split, factor, 1.0)  # the rest of the head is the value's
    return jnp.transpose(factor, order).reshape(full)

  # The step

  def _clipped(self, params: PyTree, new_params: PyTree, qk_logits: Any) -> PyTree:
    treedef = jax.tree.structure(params)
    factors = self.factors(params, qk_logits)
    leaves = treedef.flatten_up_to(new_params)
    out = [
      p if f is None else (p * f.astype(jnp.promote_types(p.dtype, jnp.float32))).astype(p.dtype)
      for p, f in zip(leaves, factors, strict=True)
    ]
    return treedef.unflatten(out)

  def _logits(self, extra_args: dict[str, Any]) -> Any:
    logits = extra_args.pop(QK_LOGITS, None)
    if logits is None:
      raise TypeError(
        f"{self.display_name()} clips by the model's per-head maximum attention logits: pass "
        "them each step, qk_logits={'<attention module path>': max_logits} (core: "
        "opt.apply_gradient(grads, extra_args={'qk_logits': ...}); Equinox and Treex: "
        "extra_args={'qk_logits': ...}; NNX and as_optax(): update(..., qk_logits=...))."
      )
    return logits

  def apply_gradient(self, hyper_params, params, state, grads, **extra_args):
    """The wrapped step, then each query and key weight rescaled per head (`factors`)."""
    extra_args = dict(extra_args)
    logits = self._logits(extra_args)
    new_params, inner = self.optimizer_def.apply_gradient(
      hyper_params, params, self._inner_state(state), grads, **extra_args
    )
    new_params = self._clipped(params, new_params, logits)
    return new_params, OptimizerState(inner.step, QKClipState(inner.param_states))

  def compute_updates(self, hyper_params, params, state, grads, **extra_args):
    """`apply_gradient`'s, as optax's updates: the clipped new parameters minus the old."""
    new_params, new_state = self.apply_gradient(hyper_params, params, state, grads, **extra_args)
    return jax.tree.map(jnp.subtract, new_params, params), new_state


def qk_clip(
  optimizer_def: OptimizerDef,
  tau: float = 100.0,
  alpha: float = 0.5,
  *,
  query: str = "query/(kernel|bias)",
  key: str = "key/(kernel|bias)",
  logit_axes: tuple[str, ...] = ("heads",),
  kv_heads: str = "kv_heads",
  head_dim: str = "kv",
  rope_dims: int = 0,
  key_dims: int | None = None,
  param_logical_axes: PyTree = None,
) -> QKClip:
  """QK-clip (MuonClip; Kimi K2, arXiv 2507.20534): after ``optimizer_def``'s step, each
  attention head whose largest logit ``S`` went above ``tau`` has its query and key weights
  scaled down so that, for the same inputs, it would be ``tau``: ``eta = tau / S``, the query's
  weights by ``eta ** alpha`` and the key's by ``eta ** (1 - alpha)`` (K2's square root split
  at ``alpha=0.5``). A head at or below ``tau`` is left as it is; values are never touched.

  The model reports the statistic; the step takes it as the extra update argument
  ``qk_logits``: ``{module path: S}``, ``S`` the maximum over the batch (and every replica:
  under ``jit`` a ``jnp.max`` over a sharded batch is global) of the head's pre-softmax logits,
  shaped by ``logit_axes`` (``('heads',)``; ``('layers', 'heads')`` for a stack of layers). A
  module's query and key weights are its parameters whose path after the module's matches
  ``query`` and ``key`` (Flax's ``MultiHeadAttention``: ``query/kernel``, ``key/kernel`` and
  their biases); their heads are found by logical axes, ``logit_axes``' names. A key with
  ``kv_heads`` instead (grouped-query attention) is scaled by the smallest ``eta`` of the
  query heads that read it, so every head's logits stay at most ``tau``.

  Multi-head latent attention (DeepSeek's, Kimi K2's): ``rope_dims`` the query's last entries
  along ``head_dim`` (its rotary part, which meets a key shared by every head and left
  unscaled) take all of ``eta``; ``key_dims`` the first entries of the key's ``head_dim`` (the
  rest of a joint key-value weight is the value's) take ``eta ** (1 - alpha)``, the rest 1. The
  numbers are Megatron-LM's ``clip_qk`` (``SelfAttention`` and ``MLASelfAttention``, megatron-core
  0.16.1), as torchtitan's clips Kimi's MLA after every optimizer step (its #4243).

  Args:
    optimizer_def: the definition whose step is clipped (``optcore.contrib.muon`` for
      MuonClip; any other).
    tau: the threshold.
    alpha: the query's share of the scaling, in [0, 1].
    query: the query weights' path after their module's, a regular expression matched whole.
    key: the key weights' the same way.
    logit_axes: the logical axes of each module's ``qk_logits`` array; the last names the heads.
    kv_heads: the logical axis of a grouped key's heads.
    head_dim: the logical axis of the per-head features (read where ``rope_dims`` or
      ``key_dims`` split it).
    rope_dims: the query's rotary entries at the end of ``head_dim`` (MLA; 0: none).
    key_dims: the key's entries at the start of ``head_dim`` (MLA's joint key-value weight;
      None: all of it is the key).
    param_logical_axes: the parameters' logical axes; `optcore.create_sharded` tells them.

  Returns:
    A `QKClip` definition.

  Raises:
    optcore.ArgumentError: a bad setting.
    TypeError: (at a step) no ``qk_logits``, or no logical axes for a clipped weight.
    ValueError: (at a step) ``qk_logits`` that do not fit the model's attention weights.

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import optcore
    >>> params = {'attn': {'query': {'kernel': jnp.ones((4, 2, 2))},
    ...                    'key': {'kernel': jnp.ones((4, 2, 2))}}}
    >>> axes = {'attn': {'query': {'kernel': P('embed', 'heads', 'kv')},
    ...                  'key': {'kernel': P('embed', 'heads', 'kv')}}}
    >>> opt = optcore.qk_clip(optcore.sgd(0.0), tau=100.0, param_logical_axes=axes).create(params)
    >>> opt = opt.apply_gradient(jax.tree.map(jnp.zeros_like, params),
    ...                          extra_args={'qk_logits': {'attn': jnp.array([400.0, 50.0])}})
    >>> opt.target['attn']['query']['kernel'][0]  # head 0: eta = 1/4, its square root; head 1 kept
    Array([[0.5, 0.5],
           [1. , 1. ]], dtype=float32)
  """
  return QKClip(
    optimizer_def,
    param_logical_axes,
    tau=tau,
    alpha=alpha,
    query=query,
    key=key,
    logit_axes=logit_axes,
    kv_heads=kv_heads,
    head_dim=head_dim,
    rope_dims=rope_dims,
    key_dims=key_dims,
  )
