"""T5X's factoring vocabulary and rules: which dimensions of a parameter
Adafactor factors (`FactorDim` roles from the size heuristic, an `HParamMap`
per path, or the parameters' logical axis names)."""

from __future__ import annotations

import copy
import enum
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from optcore._src.ground import paths
from optcore._src.ground.hyper_params import HyperParams, static_key

PyTree = Any


class FactorDim(enum.Enum):
  """The role of one dimension of a parameter in Adafactor's factoring."""

  NONE = None
  BATCH = 1
  ROW = 2
  COLUMN = 3


class HeuristicRule(enum.Enum):
  """T5X's sentinel type: its one member, `HEURISTIC_RULE`, is the factor_map
  value meaning "decide by the size heuristic"."""

  token = 1


#: The factor_map value meaning "decide by the size heuristic".
HEURISTIC_RULE = HeuristicRule.token
#: What a factor_map gives a parameter: the heuristic, or one FactorDim per dimension.
FactorRule = HeuristicRule | tuple[FactorDim, ...]

_FACTOR_NAMES = {
  "none": FactorDim.NONE,
  "unfactorized": FactorDim.NONE,
  "batch": FactorDim.BATCH,
  "row": FactorDim.ROW,
  "col": FactorDim.COLUMN,
  "column": FactorDim.COLUMN,
}


def factor_name_to_factordim(name: Any) -> FactorDim:
  """A FactorDim from itself or its name ('row', 'col', 'column', 'batch', 'none')."""
  if isinstance(name, FactorDim):
    return name
  if isinstance(name, str) and name.lower() in _FACTOR_NAMES:
    return _FACTOR_NAMES[name.lower()]
  raise ValueError(
    f"{name!r} is not a factor dimension; use a FactorDim or one of {sorted(_FACTOR_NAMES)}"
  )


def standard_logical_factor_rules(rules: Mapping[str, Any] | None = None) -> dict[str, FactorDim]:
  """T5X's table from logical axis names to factor roles, updated with ``rules``.

  Example:
    >>> from optcore.t5x import standard_logical_factor_rules, FactorDim
    >>> table = standard_logical_factor_rules({'vocab': 'row'})
    >>> table['embed'], table['vocab'], table['layers']
    (<FactorDim.ROW: 2>, <FactorDim.ROW: 2>, <FactorDim.BATCH: 1>)
  """
  column = (
    "vocab mlp heads kv joined_kv q_wi_fused o_wo_fused kv_fused multiquery_heads mlp_activations"
  ).split()
  table = {name: FactorDim.COLUMN for name in column}
  table.update(embed=FactorDim.ROW, layers=FactorDim.BATCH, stack=FactorDim.BATCH)
  table.update(relpos_buckets=FactorDim.NONE, layer_norm_scale=FactorDim.NONE)
  table.update({k: factor_name_to_factordim(v) for k, v in (rules or {}).items()})
  return table


class HParamMap:
  """A value per parameter path: the first rule whose regex is found
  (``re.search``) in the '/'-joined path wins; no match is a KeyError.
  Called on a parameter tree, it gives the tree of each leaf's value (T5X's).

  Example:
    >>> from optcore.t5x import HParamMap
    >>> scale = HParamMap([(r'embedding', False), (r'.*', True)])
    >>> scale['decoder/embedding']
    False
    >>> scale({'decoder': {'embedding': 0.0, 'mlp': {'kernel': 0.0}}})
    {'decoder': {'embedding': False, 'mlp': {'kernel': True}}}
  """

  def __init__(self, rules: Sequence[tuple[str, Any]]):
    self.rules = tuple((pattern, value) for pattern, value in rules)
    self._compiled = [(re.compile(pattern), value) for pattern, value in self.rules]

  def __getitem__(self, path: str) -> Any:
    for regex, value in self._compiled:
      if regex.search(path):
        return value
    raise KeyError(f"no rule in this HParamMap matches the parameter {path!r}")

  def __call__(self, params: PyTree) -> PyTree:
    """A copy of ``params`` holding each leaf's value (T5X's ``HParamMap(params)``)."""
    return jax.tree_util.tree_map_with_path(lambda keys, _: self[t5x_path(keys)], params)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, HParamMap) and other.rules == self.rules

  def __hash__(self) -> int:
    return hash(("HParamMap", tuple((p, _hashable(v)) for p, v in self.rules)))

  def __repr__(self) -> str:
    return f"HParamMap({list(self.rules)!r})"


def _hashable(value: Any) -> Any:
  return tuple(value) if isinstance(value, list) else value


class _Roles:
  """The dimensions of one parameter by role; ``factored`` when ROW and COLUMN exist."""

  def __init__(self, ndim: int, batch=(), rows=(), cols=()):
    self.ndim = ndim
    self.batch, self.rows, self.cols = tuple(batch), tuple(rows), tuple(cols)
    self.factored = bool(self.rows) and bool(self.cols)
    self.non_batch = tuple(d for d in range(ndim) if d not in self.batch)

  def kept(self, dropped: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in range(self.ndim) if d not in dropped)


_LOGGED_RULES: set[tuple[str, tuple, tuple]] = set()


def _log_ignored_rule(path: str, shape: tuple[int, ...], rule: tuple) -> None:
  """T5X logs (it does not warn) that a rank <= 2 rule falls back to the heuristic."""
  key = (path, shape, rule)
  if key not in _LOGGED_RULES:
    _LOGGED_RULES.add(key)
    logging.getLogger("optcore.t5x").warning(
      "Since rank of parameter %s %d is less than or equal to 2, the factorization method "
      "falls back to heuristics and the provided factor rule %s is ignored.",
      path,
      len(shape),
      rule,
    )


def t5x_path(keys: Sequence[Any]) -> str:
  """T5X's parameter path: the '/'-joined names, without a leading slash."""
  return paths.path_str(keys)[1:]


class FactorRules:
  """`Adafactor`'s factoring: each parameter's dimension roles from its rule,
  and T5X's ``set_param_axes`` from logical axis names."""

  hyper_params: HyperParams
  #: Set by `Adafactor`: T5X's (a rank > 2 parameter needs a rule) or flax.optim's numerics.
  _t5x_numerics: bool

  def _roles(self, path: str, shape: tuple[int, ...]) -> _Roles:
    """The dimensions' roles, parsed as T5X's ``_parse_rule`` parses them.

    The state's layout: the constructor's values decide, never an override.
    Not factored: no rule (all dimensions averaged). A None rule: the same.
    `HEURISTIC_RULE` (the default without ``factor_map``): the size heuristic,
    and T5X's ValueError for rank > 2. An explicit rule of the wrong rank:
    ValueError; one of rank <= 2 without BATCH: ignored (logged, as T5X logs
    it) for the heuristic. flax.optim's Adafactor has no rules: the heuristic.
    """
    hp = self.hyper_params
    factor_map = hp.get("factor_map")
    if not hp.factored:
      rule = None
    else:
      rule = factor_map[path] if factor_map else HEURISTIC_RULE  # T5X: an empty map too
    if rule is None:
      return _Roles(len(shape))
    heuristic = rule is HEURISTIC_RULE
    if not isinstance(rule, HeuristicRule) and len(shape) <= 2:
      rule_dims = tuple(factor_name_to_factordim(r) for r in rule)
      if len(rule_dims) == len(shape) and FactorDim.BATCH not in rule_dims:
        _log_ignored_rule(path, shape, rule_dims)
        heuristic = True
    if heuristic:
      if self._t5x_numerics and len(shape) > 2:
        raise ValueError(
          f"A parameter with rank strictly higher than 2 must have an explicit factorization "
          f"rule: {path}, {shape}. Give Adafactor a factor_map rule for it (a tuple of "
          "FactorDim per dimension, e.g. (FactorDim.BATCH, FactorDim.ROW, FactorDim.COLUMN)), "
          "derive the rules from its logical axes (with_param_axes), or pass factored=False."
        )
      if len(shape) < 2:
        return _Roles(len(shape))
      order = np.argsort(np.asarray(shape))
      if shape[order[-2]] < hp.min_dim_size_to_factor:
        return _Roles(len(shape))
      return _Roles(len(shape), rows=(int(order[-2]),), cols=(int(order[-1]),))
    assert not isinstance(rule, HeuristicRule)  # the heuristic returned above
    rule = tuple(factor_name_to_factordim(r) for r in rule)
    if len(rule) != len(shape):
      raise ValueError(
        f"Factorization rule {rule} has incorrect rank for param of rank {len(shape)}: "
        f"{path}, {shape}. Give one FactorDim per dimension."
      )
    dims = lambda role: tuple(i for i, r in enumerate(rule) if r is role)
    return _Roles(len(shape), dims(FactorDim.BATCH), dims(FactorDim.ROW), dims(FactorDim.COLUMN))

  def with_param_axes(self, param_logical_axes: PyTree) -> Any:
    """A new definition whose ``factor_map`` is derived from the parameters'
    logical axis names (T5X's ``set_param_axes``, without changing this one).

    Each name maps to a role through ``logical_factor_rules`` (default:
    `standard_logical_factor_rules`), as `factor_rules` says; a parameter of
    rank <= 2 without BATCH keeps the size heuristic. Definitions are
    immutable: an optimizer made from this one keeps its own factoring. (The
    T5X face, ``optcore_flax.adafactor``, keeps T5X's in-place
    ``set_param_axes`` on top of this.)

    Args:
      param_logical_axes: a `PartitionSpec` of logical names per parameter
        (None: another group's parameter, skipped).

    Returns:
      The new definition; this one where the rules do not change.

    Raises:
      KeyError: a logical name with no factor rule (named with its path).
      ValueError: ROW, COLUMN and NONE in one parameter.

    Example:
      >>> import jax.numpy as jnp
      >>> from jax.sharding import PartitionSpec as P
      >>> from optcore.t5x import Adafactor
      >>> opt_def = Adafactor(1e-2).with_param_axes({'scan': P('layers', 'embed', 'mlp')})
      >>> opt_def.create({'scan': jnp.ones((2, 4, 3))}).state.param_states['scan'].v_row.shape
      (2, 4)
    """
    rules = []
    for path, rule in self.factor_rules(param_logical_axes).items():
      if len(rule) <= 2 and FactorDim.BATCH not in rule:
        rule = HEURISTIC_RULE
      rules.append((f"^{re.escape(path)}$", rule))
    return self.with_factor_map(HParamMap(rules))

  def factor_rules(self, param_logical_axes: PyTree) -> dict[str, tuple[FactorDim, ...]]:
    """T5X's factor rule of each parameter from its logical axis names, by
    T5X's '/'-joined path (None axes, another group's leaves, are skipped).

    A name maps to its role through ``logical_factor_rules`` (default:
    `standard_logical_factor_rules`); an unknown or None name raises
    KeyError; ROW, COLUMN and NONE in one parameter raise ValueError; a
    parameter without both ROW and COLUMN is not factored (its ROW and COLUMN
    become NONE, BATCH is kept), as in T5X.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> from optcore.t5x import Adafactor
      >>> rules = Adafactor().factor_rules({'bias': P('embed'), 'kernel': P('vocab', 'embed')})
      >>> rules['bias'], rules['kernel']
      ((<FactorDim.NONE: None>,), (<FactorDim.COLUMN: 3>, <FactorDim.ROW: 2>))
    """
    table = standard_logical_factor_rules(self.hyper_params.logical_factor_rules)
    is_spec = lambda x: x is None or isinstance(x, (PartitionSpec, tuple))
    rules = {}
    for keys, axes in jax.tree_util.tree_flatten_with_path(param_logical_axes, is_leaf=is_spec)[0]:
      path = t5x_path(keys)
      if axes is None:  # not this definition's parameter (a MultiOptimizer's other group)
        continue
      names = tuple(axes)
      unknown = [n for n in names if n not in table]
      if unknown:
        raise KeyError(
          f"Adafactor: no factor rule for the logical axes {unknown} of {path!r}; "
          "add them to logical_factor_rules, e.g. {'my_axis': FactorDim.COLUMN}."
        )
      rule = tuple(table[n] for n in names)
      if {FactorDim.ROW, FactorDim.COLUMN, FactorDim.NONE} <= set(rule):
        raise ValueError(
          f"Adafactor: {path!r} has axes {names} with roles "
          f"{[r.name for r in rule]}: ROW, COLUMN and NONE cannot be combined in one parameter."
        )
      if not {FactorDim.ROW, FactorDim.COLUMN} <= set(rule):
        factored = (FactorDim.ROW, FactorDim.COLUMN)
        rule = tuple(FactorDim.NONE if r in factored else r for r in rule)
      rules[path] = rule
    return rules

  def with_factor_map(self, factor_map: Any) -> Any:
    """A new definition with ``factor_map`` (this one where it is the same map)."""
    if static_key(factor_map) == static_key(self.hyper_params.get("factor_map")):
      return self
    new = copy.copy(self)
    new.__dict__.pop("_key_cache", None)  # another definition
    new.hyper_params = self.hyper_params.replace(factor_map=factor_map)
    return new
