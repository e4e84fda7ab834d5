"""`multipliers` and `mup`: per-parameter learning-rate and weight-decay multipliers, by path
pattern (big_vision's ``lr_mults`` / ``wd_mults``), by logical axes, and μP's from the
parameters' widths (microsoft/mup's ``MuAdam``, ``MuAdamW`` and ``MuSGD``); one wrapper of the
wrapper protocol (`optcore._src.definitions.wrapper`), with no state of its own."""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple

import jax

from optcore._src.definitions import rates
from optcore._src.definitions.base import OptimizerDef
from optcore._src.definitions.wrapper import ReadsParamAxes, StateWrapper
from optcore._src.ground import arguments as a
from optcore._src.ground import definition_tree
from optcore._src.ground.arguments import ArgumentError
from optcore._src.ground.checks import check_float_params
from optcore._src.ground.declarations import Nested
from optcore._src.ground.hyper_params import static_key
from optcore._src.ground.state import OptimizerState

PyTree = Any
#: A rule's pattern: a regular expression over a parameter's path (``'head/.*'``, matched
#: whole, as big_vision's), or the parameter's logical axes, one name (or None) per dimension.
Pattern = str | tuple[str | None, ...]
Rules = tuple[tuple[Pattern, float], ...]

MUP_RULES = ("adam", "sgd")
FAN_IN = ("first", "last")


def _rules(owner: str, argument: str, given: Any) -> Rules:
  """``given`` as a tuple of ``(pattern, multiplier)``, each checked; ArgumentError naming the
  rule otherwise."""
  if given is None:
    return ()
  if isinstance(given, Mapping):
    given = list(given.items())
  if isinstance(given, (str, bytes)) or not isinstance(given, Sequence):
    raise ArgumentError(
      owner,
      argument,
      f"{argument} must be a list of (pattern, multiplier) pairs, as big_vision's "
      f"([('head/.*', 10.0), ('.*/bias', 0.0)]); got {given!r}.",
    )
  out = []
  for i, rule in enumerate(given):
    where = f"{argument}[{i}]"
    if not isinstance(rule, Sequence) or isinstance(rule, str) or len(rule) != 2:
      raise ArgumentError(
        owner, argument, f"{where} must be a (pattern, multiplier) pair; got {rule!r}."
      )
    pattern, mult = rule
    if isinstance(pattern, str):
      try:
        re.compile(pattern)
      except re.error as e:
        raise ArgumentError(
          owner, argument, f"{where}: {pattern!r} is not a regular expression ({e})."
        ) from None
    elif isinstance(pattern, Sequence) and all(n is None or isinstance(n, str) for n in pattern):
      pattern = tuple(pattern)
    else:
      raise ArgumentError(
        owner,
        argument,
        f"{where}: a pattern is a regular expression over the path ('head/.*') or logical axes, "
        f"one name or None per dimension (('vocab', 'embed')); got {pattern!r}.",
      )
    if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not math.isfinite(mult):
      raise ArgumentError(
        owner, argument, f"{where}: the multiplier must be a finite number; got {mult!r}."
      )
    if mult < 0:
      raise ArgumentError(
        owner,
        argument,
        f"{where}: the multiplier must be >= 0; got {mult}. A negative rate would climb the loss.",
      )
    out.append((pattern, float(mult)))
  return tuple(out)


def _widths(owner: str, given: Any) -> tuple[tuple[str, int], ...] | None:
  if given is None:
    return None
  if not isinstance(given, Mapping) or not given:
    raise ArgumentError(
      owner,
      "base_widths",
      f"base_widths must map each width axis' logical name to its size in the base model "
      f"({{'embed': 64, 'mlp': 256}}); got {given!r}.",
    )
  out = []
  for name, size in given.items():
    if not isinstance(name, str) or isinstance(size, bool) or not isinstance(size, int) or size < 1:
      raise ArgumentError(
        owner,
        "base_widths",
        f"base_widths[{name!r}] must be a positive integer size under an axis name; got {size!r}.",
      )
    out.append((name, size))
  return tuple(sorted(out))


def _first_match(rules: Rules, path: str, axes: tuple | None) -> float:
  """The multiplier of the first rule that matches (big_vision's ``make_mask_trees``: first
  match), 1.0 where none does."""
  for pattern, mult in rules:
    if isinstance(pattern, str):
      if re.fullmatch(pattern, path):
        return mult
    elif axes is not None and tuple(axes) == pattern:
      return mult
  return 1.0


class MultipliersState(NamedTuple):
  """The state of `multipliers`.

  Attributes:
    inner: the wrapped definition's ``param_states`` (the multipliers keep nothing of their
      own: they are the definition's, per parameter).
  """

  inner: Nested


class Multipliers(ReadsParamAxes, StateWrapper):
  """``optimizer_def`` with per-parameter rates: see `multipliers` and `mup`."""

  name = "multipliers"
  state_type = MultipliersState
  ungrouped_because = "gives parameters rates of their own, which one buffer's step cannot take"
  twice_hint = "give every rule to one multipliers (a second would multiply the first's rates)"
  config_arguments: ClassVar = MappingProxyType(
    {
      "lr_mults": (),
      "wd_mults": (),
      "base_widths": None,
      "mup_rule": "adam",
      "decoupled_wd": False,
      "fan_in": "first",
    }
  )

  @a.declare(mup_rule=a.OneOf(MUP_RULES), fan_in=a.OneOf(FAN_IN), decoupled_wd=a.Flag())
  def __init__(self, optimizer_def: OptimizerDef, param_logical_axes: Any = None, **settings: Any):
    s = self.settings(settings)
    owner = self.name
    self.lr_mults = _rules(owner, "lr_mults", s["lr_mults"])
    self.wd_mults = _rules(owner, "wd_mults", s["wd_mults"])
    widths = _widths(owner, s["base_widths"])
    self.base_widths = None if widths is None else MappingProxyType(dict(widths))
    self.mup_rule = s["mup_rule"]
    self.fan_in = s["fan_in"]
    self.decoupled_wd = s["decoupled_wd"]
    self.param_logical_axes = param_logical_axes
    super().__init__(optimizer_def)
    if not (optimizer_def_rates(optimizer_def)):
      raise TypeError(
        f"multipliers({optimizer_def.display_name()}): the definition declares no learning rate "
        "or weight decay to multiply (a ready optax transformation has no arguments; build it "
        "with optcore.<name>(...) instead)."
      )
    if not self.lr_mults and not self.wd_mults and self.base_widths is None:
      raise TypeError(
        f"multipliers({optimizer_def.display_name()}) multiplies nothing: give lr_mults, "
        "wd_mults or base_widths (μP), or use the definition itself."
      )

  def config(self) -> dict[str, Any]:
    written = super().config()
    for name in ("lr_mults", "wd_mults"):  # JSON's lists
      if name in written:
        written[name] = [[list(p) if isinstance(p, tuple) else p, m] for p, m in written[name]]
    if "base_widths" in written:
      written["base_widths"] = dict(written["base_widths"])
    return written

  def _static_key(self) -> tuple:
    widths = None if self.base_widths is None else tuple(sorted(self.base_widths.items()))
    return (
      type(self),
      self.optimizer_def,
      self.lr_mults,
      self.wd_mults,
      widths,
      self.mup_rule,
      self.decoupled_wd,
      self.fan_in,
      static_key(self.param_logical_axes),
    )

  def _rules_by_axes(self) -> bool:
    """Whether a rule's pattern is logical axes (not a path)."""
    return any(not isinstance(p, str) for p, _ in (*self.lr_mults, *self.wd_mults))

  def _reads_axes(self) -> bool:
    return self._rules_by_axes() or self.base_widths is not None

  # What each parameter gets

  def _mup(self, path: str, shape: tuple, names: tuple | None) -> tuple[float, float]:
    """μP's ``(lr, wd)`` factors of one parameter (microsoft/mup ``optim.py``): its width
    dimensions are those whose logical axis ``base_widths`` names, each of multiplier ``size /
    base``. Adam-like (``'adam'``): a matrix-like parameter (two width dimensions) gets ``lr /
    fan_in_mult`` (and ``wd * fan_in_mult`` unless ``decoupled_wd``); every other keeps both.
    SGD-like (``'sgd'``): a vector-like one (one width dimension) ``lr * mult``, ``wd / mult``; a
    matrix-like one ``lr * fan_out_mult / fan_in_mult``, ``wd`` by the inverse."""
    assert self.base_widths is not None
    if names is None:
      raise TypeError(
        f"multipliers: μP reads the parameters' logical axes, and none were given for "
        f"{path!r}: pass param_logical_axes= (one PartitionSpec per parameter) or create the "
        "optimizer with optcore.create_sharded(...), which tells them."
      )
    mults = [shape[i] / self.base_widths[n] for i, n in enumerate(names) if n in self.base_widths]
    if len(mults) > 2:
      raise ValueError(
        f"multipliers: the parameter at {path!r} has {len(mults)} width dimensions "
        f"({tuple(names)}); μP (microsoft/mup) defines two at most."
      )
    if not mults:
      return 1.0, 1.0
    if len(mults) == 2:
      # JAX's kernels are (in, out): the first width dimension is the fan-in; torch's (out, in)
      fan_in, fan_out = (mults[0], mults[1]) if self.fan_in == "first" else (mults[1], mults[0])
      lr = 1 / fan_in if self.mup_rule == "adam" else fan_out / fan_in
    else:
      lr = 1.0 if self.mup_rule == "adam" else mults[0]
    return lr, (1.0 if self.decoupled_wd else 1 / lr)

  def factors(self, params: PyTree) -> list[tuple[float, float]]:
    """Each leaf's ``(learning-rate, weight-decay)`` multipliers, in flatten order: its
    ``lr_mults`` and ``wd_mults`` rule (the first that matches; 1.0 where none does) times μP's.

    Raises:
      TypeError: a rule or μP reads logical axes and none were given.
    """
    return list(self._factors(params))

  def _factors(self, params: PyTree) -> tuple[tuple[float, float], ...]:
    """`factors` of ``params`` (arrays, tracers or shapes: only paths and shapes are read)."""
    by_axes = self._rules_by_axes()
    out = []
    for path, leaf, axes in self.named_leaves(params):
      if axes is None and by_axes:
        raise TypeError(
          f"multipliers: a rule names logical axes, and none were given for {path!r}: pass "
          "param_logical_axes= or create the optimizer with optcore.create_sharded(...)."
        )
      lr = _first_match(self.lr_mults, path, axes)
      wd = _first_match(self.wd_mults, path, axes)
      if self.base_widths is not None:
        mup_lr, mup_wd = self._mup(path, tuple(leaf.shape), axes)
        lr, wd = lr * mup_lr, wd * mup_wd
      out.append((lr, wd))
    return tuple(out)

  # The step

  def _hyper_params_for(self, hyper_params: Any, lr: float, wd: float) -> Any:
    def replace(kind: str, value: Any) -> Any:
      return rates.scaled(value, lr if kind == rates.LEARNING_RATE else wd)

    return rates.replace_rates(self.optimizer_def, hyper_params, replace)[0]

  def _groups(self, params: PyTree, grads: PyTree) -> tuple[list[tuple[float, float]], list]:
    factors = list(self._factors(params if params is not None else grads))
    groups = sorted(set(factors), key=lambda f: (f != (1.0, 1.0), f))  # the plain one first
    return factors, groups

  def init_state(self, params: PyTree) -> OptimizerState:
    check_float_params(params)
    inner = self.optimizer_def.init_state(params)
    return OptimizerState(inner.step, MultipliersState(inner.param_states))

  def _run(self, method: str, hyper_params, params, state, grads, **extra_args):
    out, inner = self._run_inner(
      method, hyper_params, params, self._inner_state(state), grads, **extra_args
    )
    return out, OptimizerState(inner.step, MultipliersState(inner.param_states))

  def _run_inner(self, method: str, hyper_params, params, state, grads, **extra_args):
    factors, groups = self._groups(params, grads)
    step = getattr(self.optimizer_def, method)
    if groups == [(1.0, 1.0)]:
      return step(hyper_params, params, state, grads, **extra_args)
    sources = _state_sources(self, hyper_params, params, state, grads, extra_args, factors)
    runs = [
      step(self._hyper_params_for(hyper_params, *g), params, state, grads, **extra_args)
      for g in groups
    ]
    index = {g: i for i, g in enumerate(groups)}
    treedef = jax.tree.structure(runs[0][0])
    per_run = [treedef.flatten_up_to(out) for out, _ in runs]
    # each leaf from the run of its own rates: the others' copies of it are dead code XLA drops
    out = treedef.unflatten([per_run[index[f]][i] for i, f in enumerate(factors)])
    # each state leaf from the run of the parameter it belongs to (the run of rates 1 where it
    # belongs to none or several and reads no rate: every run's is the same there)
    states = [jax.tree.flatten(new)[0] for _, new in runs]
    state_def = jax.tree.structure(runs[0][1])
    picked = [
      states[0 if source is None else index[factors[source]]][j] for j, source in enumerate(sources)
    ]
    return out, state_def.unflatten(picked)

  def compute_updates(self, hyper_params, params, state, grads, **extra_args):
    """The wrapped step's updates, each leaf's computed with its own learning rates and weight
    decays (every one the definition declares, in its groups, members and wrapped definitions
    too); the state is the wrapped definition's, each leaf of it from its own parameter's run
    (`_state_sources`)."""
    return self._run("compute_updates", hyper_params, params, state, grads, **extra_args)

  def apply_gradient(self, hyper_params, params, state, grads, **extra_args):
    return self._run("apply_gradient", hyper_params, params, state, grads, **extra_args)

  def leaf_hyper_params(self, state: OptimizerState, params: PyTree) -> dict[str, jax.Array]:
    """Each parameter's effective rates where a multiplier changes them: ``'<path>/<name>'``
    for every declared learning rate and weight decay (``'head/kernel/learning_rate'``), at the
    next step's count, beside what the wrapped definition reports."""
    inner = self._inner_state(state)
    base = self.optimizer_def.current_hyper_params(inner)
    out = dict(self.optimizer_def.leaf_hyper_params(inner, params))
    lr_names, wd_names = _declared_names(self.optimizer_def)
    named = self.named_leaves(params)
    for (path, _, _), (lr, wd) in zip(named, self._factors(params), strict=True):
      for name, value in base.items():
        leaf_name = name.rsplit("/", 1)[-1]
        factor = lr if leaf_name in lr_names else wd if leaf_name in wd_names else 1.0
        if factor != 1.0:
          out[f"{path}/{name}"] = value * factor
    return out


def optimizer_def_rates(opt_def: OptimizerDef) -> bool:
  """Whether ``opt_def`` declares a learning rate or a weight decay anywhere its step reads."""
  lr, wd = _declared_names(opt_def)
  return bool(lr or wd)


def _declared_names(opt_def: OptimizerDef) -> tuple[set[str], set[str]]:
  """The names of the declared learning rates and weight decays of ``opt_def`` and of every
  definition under it (as `current_hyper_params` keys them, the last part of the path)."""
  lr: set[str] = set()
  wd: set[str] = set()
  for d in definition_tree.iter_definitions(opt_def):
    lr.update(d.learning_rate_names())
    wd.update(d.weight_decay_names())
  return lr, wd


#: `_state_sources`' answers, oldest first, at most `_SOURCES_KEPT` (a jitted step retraces with
#: the same shapes; as `overrides`' checks are kept).
_SOURCES: collections.OrderedDict[Any, tuple[int | None, ...]] = collections.OrderedDict()
_SOURCES_KEPT = 256


def _state_sources(
  wrapper: Multipliers, hyper_params, params, state, grads, extra_args, factors
) -> tuple[int | None, ...]:
  """For each leaf of the wrapped definition's next state, the parameter it belongs to (the
  index of the one parameter whose gradient or value it reads), or None for one that reads
  none or several (a count, a global norm's) and so must read no rate.

  Read from the step's program (which inputs each state output depends on, `_propagate`), once
  per definition and shapes (the last `_SOURCES_KEPT` kept).

  Raises:
    TypeError: a state leaf of no single parameter reads a learning rate or weight decay
      (schedule-free's averages' weight): one state cannot hold two rates' histories.
  """
  shapes = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(jax.typeof(x).shape, jax.typeof(x).dtype), (params, state, grads)
  )
  key = (wrapper, static_key(jax.tree.map(lambda x: (x.shape, x.dtype.str), shapes)))
  if key in _SOURCES:
    _SOURCES.move_to_end(key)
    return _SOURCES[key]

  def next_state(lr: Any, wd: Any, p: Any, s: Any, g: Any) -> Any:
    hp = wrapper._hyper_params_for(hyper_params, lr, wd)
    _, new_state = wrapper.optimizer_def.compute_updates(hp, p, s, g, **extra_args)
    return jax.tree.leaves(new_state)

  jaxpr = jax.make_jaxpr(next_state)(2.0, 2.0, *shapes).jaxpr
  p_leaves = len(jax.tree.leaves(shapes[0]))
  s_leaves = len(jax.tree.leaves(shapes[1]))
  # input index -> the parameter it is of (params' and grads' leaves), "rate" for lr and wd
  owner: list[Any] = ["rate", "rate", *range(p_leaves), *([None] * s_leaves)]
  owner += list(range(len(factors)))
  deps: dict[Any, frozenset] = {}
  for var, who in zip(jaxpr.invars, owner, strict=True):
    deps[var] = frozenset() if who is None else frozenset([who])

  _propagate(jaxpr, deps)

  def of(v: Any) -> frozenset:
    return frozenset() if type(v).__name__ == "Literal" else deps.get(v, frozenset())

  sources: list[int | None] = []
  for j, v in enumerate(jaxpr.outvars):
    read = of(v)
    leaves = {w for w in read if w != "rate"}
    if len(leaves) == 1:
      sources.append(next(iter(leaves)))
      continue
    if "rate" in read:
      raise TypeError(
        f"multipliers({wrapper.optimizer_def.display_name()}): the wrapped definition's state "
        f"(leaf {j}) reads its learning rate or weight decay and belongs to no single parameter "
        "(a schedule-free or learning-rate-free optimizer keeps its rates in a shared average), "
        "so one state cannot serve parameters of different rates. Give each group its own "
        "state instead: optcore.MultiOptimizer((selector, definition with its rate), ...)."
      )
    sources.append(None)
  _SOURCES[key] = found = tuple(sources)
  if len(_SOURCES) > _SOURCES_KEPT:
    _SOURCES.popitem(last=False)
  return found


#: The parameter of a call-like equation that holds the program it calls (jit's, a custom
#: derivative's): followed inside, so a jitted helper over the whole tree keeps each leaf's own.
_CALLED = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _propagate(jaxpr: Any, deps: dict[Any, frozenset]) -> None:
  """Each variable of ``jaxpr`` mapped in ``deps`` to the inputs it reads, from its inputs'
  (already in ``deps``): into a called program, output by output; any other equation with a
  program inside (a loop, a branch) counts every input for every output."""

  def of(v: Any) -> frozenset:
    return frozenset() if type(v).__name__ == "Literal" else deps.get(v, frozenset())

  for eqn in jaxpr.eqns:
    called = next((eqn.params[k] for k in _CALLED if k in eqn.params), None)
    inner = getattr(called, "jaxpr", called)
    if inner is not None and hasattr(inner, "eqns") and len(inner.invars) == len(eqn.invars):
      inner_deps: dict[Any, frozenset] = {
        v: of(o) for v, o in zip(inner.invars, eqn.invars, strict=True)
      }
      _propagate(inner, inner_deps)
      for v, o in zip(eqn.outvars, inner.outvars, strict=True):
        deps[v] = frozenset() if type(o).__name__ == "Literal" else inner_deps.get(o, frozenset())
      continue
    read = frozenset().union(*(of(v) for v in eqn.invars))
    for v in eqn.outvars:
      deps[v] = read


def multipliers(
  optimizer_def: OptimizerDef,
  lr_mults: Sequence[tuple[Pattern, float]] | None = None,
  wd_mults: Sequence[tuple[Pattern, float]] | None = None,
  *,
  param_logical_axes: PyTree = None,
) -> Multipliers:
  """``optimizer_def`` with per-parameter learning-rate and weight-decay multipliers, by path
  pattern (big_vision's ``config.lr_mults`` / ``config.wd_mults`` form) or by logical axes.

  Each rule is ``(pattern, multiplier)``; a parameter takes the multiplier of the first rule
  whose pattern matches it (big_vision's first match), 1.0 where none does. A pattern is a
  regular expression matched against the parameter's whole path, its keys joined by ``/``
  (``'encoder/layer_0/attn/kernel'``, ``'.*/bias'``), or a tuple of logical axis names, one per
  dimension, matching a parameter whose axes are exactly those (``('vocab', 'embed')``).

  What a multiplier multiplies is declared where the definition is defined: every learning
  rate (``learning_rate``, muon's ``adam_learning_rate``, MARS's ``lr_1d``, flax.optim's and
  T5X's) and every weight decay (``weight_decay``, Adafactor's ``weight_decay_rate``) the step
  reads, in a ``chain``'s members, a group of a `MultiOptimizer` or a wrapped definition too: a
  parameter's step is the wrapped step with those rates, as a PyTorch parameter group with
  ``lr`` and ``weight_decay`` set is. A schedule is multiplied at every step. The state is the
  wrapped definition's; a definition whose state reads its rates (schedule-free) is refused at
  its first step.

  Unlike big_vision (where ``wd_mults`` defaults to ``[('.*/kernel$', 1.0)]`` and a parameter no
  rule matches is not decayed), a parameter no ``wd_mults`` rule matches keeps the wrapped
  definition's decay: end the list with ``('.*', 0.0)`` for big_vision's behaviour. And the rates
  multiply the definition's own arguments: optax's ``adamw`` decays by ``lr * wd``, big_vision's
  chain by ``schedule * wd``.

  Args:
    optimizer_def: the definition (optax, legacy, contrib, a `MultiOptimizer`).
    lr_mults: ``[(pattern, multiplier), ...]`` for the learning rates.
    wd_mults: ``[(pattern, multiplier), ...]`` for the weight decays.
    param_logical_axes: the parameters' logical axes, one PartitionSpec (or tuple) per
      parameter, where a rule names axes; `optcore.create_sharded` tells them.

  Returns:
    A `Multipliers` definition.

  Raises:
    optcore.ArgumentError: a rule that is not a (pattern, multiplier) pair, a pattern that is
      no regular expression, a negative or non-finite multiplier.
    TypeError: ``optimizer_def`` declares no rate, or no rule is given.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> import optcore
    >>> params = {'body': {'kernel': jnp.ones(2)}, 'head': {'kernel': jnp.ones(2)}}
    >>> opt_def = optcore.multipliers(optcore.sgd(0.1), lr_mults=[('head/.*', 10.0)])
    >>> opt = opt_def.create(params).apply_gradient(jax.tree.map(jnp.ones_like, params))
    >>> opt.target['body']['kernel'], opt.target['head']['kernel']
    (Array([0.9, 0.9], dtype=float32), Array([0., 0.], dtype=float32))
  """
  return Multipliers(
    optimizer_def, param_logical_axes, lr_mults=lr_mults or (), wd_mults=wd_mults or ()
  )


def mup(
  optimizer_def: OptimizerDef,
  base_widths: Mapping[str, int],
  *,
  rule: str = "adam",
  decoupled_wd: bool = False,
  fan_in: str = "first",
  lr_mults: Sequence[tuple[Pattern, float]] | None = None,
  wd_mults: Sequence[tuple[Pattern, float]] | None = None,
  param_logical_axes: PyTree = None,
) -> Multipliers:
  """μP's per-parameter learning rates and weight decays (Yang et al., "Tensor Programs V";
  microsoft/mup's ``MuAdam``, ``MuAdamW`` and ``MuSGD``) from the parameters' logical axes.

  ``base_widths`` names the width axes and their sizes in the base model (``{'embed': 64,
  'mlp': 256}``): a parameter's dimension whose logical axis is named there is a width
  dimension of multiplier ``size / base``, every other dimension is finite. Then, as mup's
  optimizers scale each parameter group:

  - ``rule='adam'`` (Adam-like: adam, adamw, lion, rmsprop, adafactor): a matrix-like parameter
    (two width dimensions: hidden weights) gets ``lr / fan_in_mult``, and ``wd * fan_in_mult``
    unless ``decoupled_wd``; vector-like ones (input and output weights, biases) and finite ones
    keep both;
  - ``rule='sgd'`` (SGD-like): a vector-like parameter gets ``lr * mult`` (and ``wd / mult``), a
    matrix-like one ``lr * fan_out_mult / fan_in_mult`` (and ``wd`` by the inverse).

  ``fan_in='first'``: of a matrix-like parameter's two width dimensions the first is its fan-in
  (JAX's and Flax's kernels, ``(in, out)``); ``'last'`` for torch's ``(out, in)`` layout. The
  output layer's forward multiplier and the initialisation (mup's ``MuReadout``,
  ``set_base_shapes``' rescaling) are the model's, not the optimizer's.

  Args:
    optimizer_def: the definition whose rates μP scales.
    base_widths: ``{axis name: size in the base model}``.
    rule: ``'adam'`` or ``'sgd'``.
    decoupled_wd: leave the weight decays unscaled (mup's ``decoupled_wd``).
    fan_in: ``'first'`` or ``'last'``.
    lr_mults: path or axes rules multiplied in as well (`multipliers`).
    wd_mults: the same for weight decays.
    param_logical_axes: the parameters' logical axes; `optcore.create_sharded` tells them.

  Returns:
    A `Multipliers` definition.

  Raises:
    optcore.ArgumentError: bad ``base_widths``, ``rule``, ``fan_in`` or rules.
    TypeError: (at the first step) a parameter without logical axes.
    ValueError: (at the first step) a parameter with more than two width dimensions.

  Example:
    >>> import jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import optcore
    >>> params = {'hidden': jnp.ones((8, 8)), 'bias': jnp.ones(8)}
    >>> axes = {'hidden': P('embed', 'mlp'), 'bias': P('mlp')}
    >>> opt_def = optcore.mup(optcore.adam(1e-2), {'embed': 4, 'mlp': 4}, param_logical_axes=axes)
    >>> [lr for lr, _ in opt_def.factors(params)]  # bias, hidden (flatten order)
    [1.0, 0.5]
  """
  return Multipliers(
    optimizer_def,
    param_logical_axes,
    lr_mults=lr_mults or (),
    wd_mults=wd_mults or (),
    base_widths=base_widths,
    mup_rule=rule,
    decoupled_wd=decoupled_wd,
    fan_in=fan_in,
  )
