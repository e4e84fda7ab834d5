"""One optimizer definition per group of parameters, for any pytree.

Each sub-optimizer sees the parameters with the leaves outside its group
replaced by None, so its state keeps the parameters' structure (None where it
does not act) and a state dict names real paths. Leaves that no group selects
are frozen.

The state's layout is flax.optim's and T5X's when every group keeps
per-parameter state (the legacy algorithms, T5X's Adafactor): ONE tree shaped
like the parameters, each selected leaf holding its group's state and every
other leaf None, so their checkpoints restore. A group that wraps an optax
transformation has a state of optax's own shape, not one per parameter; then
the state is a tuple with one such tree per group (``param_states/0/...``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from optcore._src.containers.export import optax_update_arguments
from optcore._src.definitions.base import OptimizerDef, PyTree
from optcore._src.ground import definition_tree, paths
from optcore._src.ground.hyper_params import HyperParams
from optcore._src.ground.state import OptimizerState
from optcore._src.ground.traversal import Selector, SelectorError, leaves_with_paths, selector_mask
from optcore._src.ground.user_warnings import warn


def _derives_factor_rules(opt_def: OptimizerDef) -> bool:
  """A definition with rules of its own from logical axes (T5X's Adafactor), not one that
  passes them to its children."""
  return not opt_def.children() and hasattr(opt_def, "with_param_axes")


class MultiOptimizer(OptimizerDef):
  """Applies a different optimizer definition to each group of parameters.

  Groups are given by selectors (see `selector_mask`): a `ModelParamTraversal`,
  a ``(path, value) -> bool`` predicate, a regex over the path, a boolean mask
  tree or a function from params to one. Leaves no selector picks are frozen:
  they do not move and have None state. Overlapping groups are an error. All
  groups share the step count.

  ``hyper_params`` is the list of the sub-optimizers' hyper-parameters. An
  override by keyword (``learning_rate=0.1``) goes to every sub-optimizer that
  has it; ``hyper_params=[...]`` replaces them per group.

  The state is one parameter-shaped tree when every group keeps per-parameter
  state (flax.optim's and T5X's layout), else a tuple of one state per group
  (see the module's docstring).

  Args:
    *traversals_and_optimizers: ``(selector, OptimizerDef)`` pairs
      (flax.optim's spelling), or one sequence of them (T5X's).

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> params = {'kernel': jnp.ones(2), 'bias': jnp.ones(2), 'frozen': jnp.ones(2)}
    >>> opt_def = optcore.MultiOptimizer((r'kernel', optcore.sgd(0.1)), (r'bias', optcore.sgd(1.0)))
    >>> opt = opt_def.create(params).apply_gradient({k: jnp.ones(2) for k in params})
    >>> {k: round(float(v[0]), 4) for k, v in opt.target.items()}
    {'bias': 0.0, 'frozen': 1.0, 'kernel': 0.9}
    >>> hp = opt.optimizer_def.hyper_params
    >>> opt = opt.apply_gradient({k: jnp.ones(2) for k in params},
    ...                          hyper_params=[hp[0], hp[1].replace(learning_rate=0.0)])
    >>> {k: round(float(v[0]), 4) for k, v in opt.target.items()}
    {'bias': 0.0, 'frozen': 1.0, 'kernel': 0.8}
  """

  def __init__(self, *traversals_and_optimizers: Any):
    pairs = traversals_and_optimizers
    if len(pairs) == 1 and isinstance(pairs[0], (list, tuple)) and not _is_pair(pairs[0]):
      pairs = tuple(pairs[0])  # T5X: MultiOptimizer(((selector, def), ...))
    for i, pair in enumerate(pairs):
      if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], OptimizerDef)):
        raise TypeError(
          f"MultiOptimizer takes (selector, OptimizerDef) pairs; argument {i} is {pair!r}. "
          "Write MultiOptimizer((selector_a, optcore.adam(1e-3)), (selector_b, optcore.sgd(0.1)))."
        )
      if pair[1].groups_parameters:
        raise TypeError(
          f"MultiOptimizer argument {i} is {pair[1]!r}, which keeps its parameters grouped "
          "between steps; inside a MultiOptimizer it could not. Group the whole: "
          "optcore.grouped(optcore.MultiOptimizer((selector, opt_def), ...))."
        )
    if not pairs:
      raise TypeError("MultiOptimizer needs at least one (selector, OptimizerDef) pair")
    self.traversals = tuple(selector for selector, _ in pairs)
    self.sub_optimizers = tuple(opt for _, opt in pairs)
    super().__init__(HyperParams())
    self.hyper_params = [opt.hyper_params for opt in self.sub_optimizers]

  @property
  def per_parameter_state(self) -> bool:  # type: ignore[override]
    """True when every group keeps per-parameter state: then the state is one tree."""
    return all(opt.per_parameter_state for opt in self.sub_optimizers)

  @property
  def legacy_state_dicts(self) -> bool:  # type: ignore[override]
    """Read as flax.optim and T5X read them when any group is flax.optim-style
    (``create(focus=...)`` of a legacy definition is a MultiOptimizer)."""
    return any(opt.legacy_state_dicts for opt in self.sub_optimizers)

  def why_not_elementwise(self) -> str | None:
    """None when every group's definition is element-wise; else the first reason."""
    reasons = (opt.why_not_elementwise() for opt in self.sub_optimizers)
    return next((r for r in reasons if r is not None), None)

  @property
  def per_example_gradients(self) -> bool:  # type: ignore[override]
    # One gradient tree serves every group: per-example only if every group takes them.
    return all(opt.per_example_gradients for opt in self.sub_optimizers)

  def with_param_axes(self, param_logical_axes: PyTree) -> MultiOptimizer:
    """A new MultiOptimizer whose definitions that derive rules from logical axes (T5X's
    Adafactor: ``with_param_axes``), in a group or wrapped inside one (``skip_bad_steps``), have
    them from their own leaves' axes (None elsewhere); this one is unchanged. One definition in
    two groups becomes two, each with its group's rules.

    Example:
      >>> from jax.sharding import PartitionSpec as P
      >>> import optcore
      >>> shared = optcore.t5x.Adafactor(0.1)
      >>> multi = optcore.MultiOptimizer(('enc', shared), ('dec', shared))
      >>> axes = {'enc': P('layers', 'embed', 'mlp'), 'dec': P('layers', 'mlp', 'embed')}
      >>> told = multi.with_param_axes(axes)
      >>> told.sub_optimizers[0] is not told.sub_optimizers[1], shared.hyper_params.factor_map
      (True, None)
    """
    tell = lambda d, axes: d.with_param_axes(axes) if _derives_factor_rules(d) else d
    return definition_tree.map_definitions(tell, self, param_logical_axes)

  def children(self) -> tuple[OptimizerDef, ...]:
    return self.sub_optimizers

  def group_masks(self, params: PyTree) -> list[PyTree] | None:
    return self.masks(params)

  def with_group_selectors(self, selectors: Sequence[Any]) -> MultiOptimizer:
    return MultiOptimizer(*zip(selectors, self.sub_optimizers, strict=True))

  def with_children(self, children: tuple[OptimizerDef, ...]) -> MultiOptimizer:
    new = self._renewed()
    new.sub_optimizers = tuple(children)
    new.hyper_params = [opt.hyper_params for opt in children]
    return new

  def child_params(self, params: PyTree) -> list[PyTree]:
    """Each group's own leaves (None elsewhere)."""
    return [_masked(params, mask) for mask in self.masks(params)]

  def masks(self, params: PyTree, *, check: bool = False) -> list[PyTree]:
    """The boolean mask of each group.

    With ``check``, overlapping groups raise `SelectorError` listing the
    paths, and a group that selects nothing warns. Parameters holding flax.nnx
    Variables without ``import optcore_flax`` raise a TypeError that says so.
    """
    paths.refuse_unread_nnx_variables(params)  # their paths would end in '/value'
    # flax.optim showed its filters arrays: a Python number is seen as a 0-d array.
    typed = jax.tree.map(_typed, params)
    masks = [selector_mask(selector, typed) for selector in self.traversals]
    if check:
      self._check_groups(masks, params)
    return masks

  def _check_groups(self, masks: list[PyTree], params: PyTree) -> None:
    flat = [jax.tree.leaves(m) for m in masks]
    leaf_paths = [path for path, _ in leaves_with_paths(params)[0]]
    taken: dict[str, int] = {}
    overlaps = []
    for i, picks in enumerate(flat):
      if not any(picks):
        warn(
          f"MultiOptimizer: selector {i} ({self.traversals[i]!r}) matches no parameter, so "
          f"its optimizer {self.sub_optimizers[i]!r} will do nothing and those parameters "
          f"stay as they are; the parameters' paths are {paths.some_paths(leaf_paths)}. To fix: "
          "give a selector one of them matches (a regex such as r'(kernel|weight)$' reads "
          "Flax's and Equinox's names alike).",
        )
      for path, picked in zip(leaf_paths, picks, strict=True):
        if picked and path in taken:
          overlaps.append(f"{path} (selectors {taken[path]} and {i})")
        elif picked:
          taken[path] = i
    if overlaps:
      # flax.optim's message first (its users match on it), then the paths.
      treedef = jax.tree.structure(params)
      indices = treedef.unflatten(
        [[i for i, picks in enumerate(flat) if picks[j]] for j in range(treedef.num_leaves)]
      )
      raise SelectorError(
        f"Multiple optimizers match the same leaves : {indices}. MultiOptimizer: selectors "
        f"overlap at {overlaps[:10]}"
        + (f" and {len(overlaps) - 10} more" if len(overlaps) > 10 else "")
        + ". Each parameter may belong to one group only; narrow the selectors."
      )

  def init_state(self, params: PyTree) -> OptimizerState:
    masks = self.masks(params, check=True)
    states = tuple(
      opt.init_state(_masked(params, mask)).param_states
      for opt, mask in zip(self.sub_optimizers, masks, strict=True)
    )
    return OptimizerState(jnp.asarray(0, dtype=jnp.int32), self._join(params, states, masks))

  def _join(self, params: PyTree, states: Sequence[PyTree], masks: Sequence[PyTree]) -> PyTree:
    """The groups' states in this definition's layout (see the class docstring)."""
    if not self.per_parameter_state:
      return tuple(states)
    treedef = jax.tree.structure(params)
    joined = [None] * treedef.num_leaves
    for state, mask in zip(states, masks, strict=True):
      for i, (leaf_state, picked) in enumerate(
        zip(treedef.flatten_up_to(state), jax.tree.leaves(mask), strict=True)
      ):
        if picked:
          joined[i] = leaf_state
    return treedef.unflatten(joined)

  def _split(self, params: PyTree, param_states: PyTree, masks: Sequence[PyTree]) -> list[PyTree]:
    """Each group's own state: the inverse of `_join`."""
    if not self.per_parameter_state:
      return list(param_states)
    treedef = jax.tree.structure(params)
    flat = treedef.flatten_up_to(param_states)
    return [
      treedef.unflatten([s if k else None for s, k in zip(flat, jax.tree.leaves(m), strict=True)])
      for m in masks
    ]

  def apply_gradient(  # type: ignore[override]  # one HyperParams per group
    self,
    hyper_params: Any,
    params: PyTree,
    state: OptimizerState,
    grads: PyTree,
    **extra_args: Any,
  ) -> tuple[PyTree, OptimizerState]:
    new_params = params
    new_states = []
    masks = self.masks(params)
    sub_states = self._split(params, state.param_states, masks)
    for opt, hp, mask, sub_state in zip(
      self.sub_optimizers, hyper_params, masks, sub_states, strict=True
    ):
      sub_params, sub_state = opt.apply_gradient(
        hp,
        _masked(params, mask),
        OptimizerState(state.step, sub_state),
        _masked(grads, mask),
        **extra_args,
      )
      new_params = _merge(new_params, sub_params, mask)
      new_states.append(sub_state.param_states)
    new_param_states = self._join(params, new_states, masks)
    return new_params, OptimizerState(state.step + 1, new_param_states)

  def derive_param_states_axes(
    self, param_states: tuple, params: PyTree, params_axes: PyTree
  ) -> tuple:
    """Each group's state axes, derived by its own definition from its leaves."""
    masks = self.masks(params)
    axes = [
      opt.derive_param_states_axes(sub_state, _masked(params, mask), _masked(params_axes, mask))
      for opt, mask, sub_state in zip(
        self.sub_optimizers, masks, self._split(params, param_states, masks), strict=True
      )
    ]
    return self._join(params, axes, masks)

  def as_optax(self) -> optax.GradientTransformationExtraArgs:
    """The groups as one optax transformation: each group's own transformation
    on its leaves (exact for wrapped optax), zero updates for frozen leaves."""
    subs = [opt.as_optax() for opt in self.sub_optimizers]

    def init_fn(params: PyTree) -> tuple:
      masks = self.masks(paths.unbox(params), check=True)
      # Each group's own init sees its parameters boxed (nnx Variables), so its moments keep
      # their sharding metadata; a mask is a prefix of the boxed tree.
      keep = lambda mask, x: x if mask else None
      return tuple(
        tx.init(jax.tree.map(keep, m, params)) for tx, m in zip(subs, masks, strict=True)
      )

    def update_fn(updates: PyTree, state: tuple, params: PyTree = None, **kwargs):
      overrides, extra_args = optax_update_arguments(self, kwargs)
      masks = self.masks(updates if params is None else params)
      out = jax.tree.map(jnp.zeros_like, updates)
      new_states = []
      for opt, tx, mask, sub_state in zip(self.sub_optimizers, subs, masks, state, strict=True):
        sub_params = None if params is None else _masked(params, mask)
        mine = {k: v for k, v in overrides.items() if k in opt.overridable_names()}
        sub_updates, sub_state = optax.with_extra_args_support(tx).update(
          _masked(updates, mask), sub_state, sub_params, **mine, **extra_args
        )
        out = _merge(out, sub_updates, mask)
        new_states.append(sub_state)
      return out, tuple(new_states)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)  # pyright: ignore[reportArgumentType]  # a tuple state, optax's protocol says OptState

  def check_state_values(self, state: OptimizerState, where: str = "state/param_states") -> None:
    """Each group's own checks, on its own state (`accumulate` around a group's definition)."""
    if self.per_parameter_state:  # one tree of per-parameter states: no wrapper among them
      return
    for i, (opt, sub) in enumerate(zip(self.sub_optimizers, state.param_states, strict=True)):
      opt.check_state_values(OptimizerState(state.step, sub), f"{where}/{i}")

  def keeps_ema(self) -> bool:
    return any(opt.keeps_ema() for opt in self.sub_optimizers)

  def from_optax_state(self, optax_state: Any, step: Any) -> OptimizerState:
    """One state per group from `as_optax`'s tuple (`OptimizerDef.from_optax_state`); groups
    of flax.optim's per-parameter definitions joined into one tree in the parameters'
    structure, as `init_state` lays them out."""
    groups = [
      opt.from_optax_state(sub, step)
      for opt, sub in zip(self.sub_optimizers, optax_state, strict=True)
    ]
    shared = groups[0].step if groups else jnp.asarray(step, jnp.int32)
    if self.per_parameter_state:  # each group's tree is None where another group's leaves are
      return OptimizerState(shared, _overlay([g.param_states for g in groups]))
    return OptimizerState(shared, tuple(g.param_states for g in groups))

  def to_optax_state(self, state: OptimizerState, like: Any = None) -> tuple:
    """The inverse of `from_optax_state`. A per-parameter layout is split by ``like``, a state
    of this definition's `as_optax` for the same parameters (which group holds which leaf).

    Raises:
      TypeError: a per-parameter layout without ``like``.
    """
    if self.per_parameter_state:
      if like is None:
        raise TypeError(
          "to_optax_state of a MultiOptimizer of per-parameter definitions needs like=, a "
          "state of its as_optax() for the same parameters (it says which group holds which)."
        )
      templates = [self.sub_optimizers[i].from_optax_state(sub, 0).param_states
                   for i, sub in enumerate(like)]  # fmt: skip
      groups = [
        OptimizerState(state.step, _take(state.param_states, i, templates))
        for i in range(len(templates))
      ]
    else:
      groups = self._group_states(state)
    return tuple(
      opt.to_optax_state(sub) for opt, sub in zip(self.sub_optimizers, groups, strict=True)
    )

  def _group_states(self, state: Any) -> list[Any]:
    """Each group's own state: from an `OptimizerState` (one per group in its ``param_states``,
    the step shared), or from the tuple `as_optax` keeps (each group's ``as_optax()`` state)."""
    if isinstance(state, OptimizerState):
      return [OptimizerState(state.step, sub) for sub in state.param_states]
    return list(state)

  def current_hyper_params(self, state: Any) -> dict[str, jax.Array]:
    """Per group, ``'0/learning_rate'``, ...: each at its group's own step (see
    `OptimizerDef.current_hyper_params`); the state of `as_optax` (one state per group) too."""
    if isinstance(state, OptimizerState):
      return super().current_hyper_params(state)
    return {
      f"{i}/{name}": value
      for i, (opt, sub) in enumerate(zip(self.sub_optimizers, state, strict=True))
      for name, value in opt.current_hyper_params(sub).items()
    }

  def ema_params(self, state: OptimizerState) -> PyTree:
    """The moving averages the groups keep (`optcore.ema` around a group's definition), in the
    parameters' structure, None where no group keeps one (the faces fill those with the
    parameters themselves)."""
    if self.per_parameter_state or not self.keeps_ema():
      return super().ema_params(state)
    averages = [
      opt.ema_params(sub)
      for opt, sub in zip(self.sub_optimizers, self._group_states(state), strict=True)
      if opt.keeps_ema()
    ]
    first = lambda *xs: next((x for x in xs if x is not None), None)
    return jax.tree.map(first, *averages, is_leaf=lambda x: x is None)

  def extra_arg_names(self) -> frozenset[str] | None:
    """What any group reads (None when one reads whatever it is given)."""
    names = [opt.extra_arg_names() for opt in self.sub_optimizers]
    return None if None in names else frozenset().union(*names)

  def overridable_names(self) -> frozenset[str]:
    """Every name some group accepts."""
    return frozenset().union(*(opt.overridable_names() for opt in self.sub_optimizers))

  def update_hyper_params(self, **hyper_param_overrides: Any) -> Any:  # one per group
    """``hyper_params=[...]`` replaces all; a keyword goes to each group that takes it (its
    `overridable_names`: a ``chain``'s members' names too), ``'1/learning_rate'`` (the name
    `optcore.current_hyper_params` reports) to the second group only."""
    hyper_params = list(hyper_param_overrides.pop("hyper_params", self.hyper_params))
    if len(hyper_params) != len(self.sub_optimizers):
      raise TypeError(
        f"hyper_params= needs one entry per group ({len(self.sub_optimizers)}), "
        f"got {len(hyper_params)}"
      )
    names = [opt.overridable_names() for opt in self.sub_optimizers]
    per_group: list[dict[str, Any]] = [{} for _ in self.sub_optimizers]
    unknown = []
    for key, value in hyper_param_overrides.items():
      group, _, rest = key.partition("/")
      if group.isdigit() and int(group) < len(names) and rest in names[int(group)]:
        per_group[int(group)][rest] = value
        continue
      takers = [i for i, taken in enumerate(names) if key in taken]
      unknown += [] if takers else [key]
      for i in takers:
        per_group[i][key] = value
    if unknown:
      valid = sorted(set().union(*names))
      raise TypeError(
        f"MultiOptimizer: no sub-optimizer has the hyper-parameter(s) {unknown}; the valid "
        f"names are: {', '.join(valid)} (or '<group index>/<name>' for one group)"
      )
    return [
      opt.update_hyper_params(hyper_params=hp, **mine)
      for opt, hp, mine in zip(self.sub_optimizers, hyper_params, per_group, strict=True)
    ]

  def _static_key(self) -> tuple:
    return (type(self), tuple(map(_selector_key, self.traversals)), self.sub_optimizers)

  def __repr__(self) -> str:
    pairs = ", ".join(
      f"({s!r}, {o!r})" for s, o in zip(self.traversals, self.sub_optimizers, strict=True)
    )
    return f"MultiOptimizer({pairs})"


def _is_pair(x: Any) -> bool:
  return isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], OptimizerDef)


def _typed(x: Any) -> Any:
  return jnp.asarray(x) if isinstance(x, (bool, int, float, complex)) else x


def _masked(tree: PyTree, mask: PyTree) -> PyTree:
  """``tree`` with the leaves outside ``mask`` replaced by None."""
  return jax.tree.map(lambda x, keep: x if keep else None, tree, mask)


def _merge(params: PyTree, updated: PyTree, mask: PyTree) -> PyTree:
  """``params`` with the leaves inside ``mask`` taken from ``updated``."""
  leaves, treedef = jax.tree.flatten(params)
  keep = jax.tree.leaves(mask)
  new = iter(jax.tree.leaves(updated))
  return treedef.unflatten([next(new) if k else p for p, k in zip(leaves, keep, strict=True)])


def _selector_key(selector: Selector) -> Any:
  """Mask trees compare by value; other selectors as themselves (functions by identity)."""
  leaves, treedef = jax.tree.flatten(selector)
  if jax.tree_util.treedef_is_leaf(treedef):
    return selector
  return (treedef, tuple(bool(x) for x in leaves))


def _children(tree: Any) -> tuple[list[Any], Any]:
  """``tree``'s immediate children (None included) and the one-level structure."""
  return jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is not tree)


def _overlay(trees: Sequence[Any]) -> Any:
  """Trees of one structure, each None wherever another holds its subtree, as one tree."""
  present = [t for t in trees if t is not None]
  if len(present) < 2:
    return present[0] if present else None
  levels = [_children(t) for t in present]
  return levels[0][1].unflatten([_overlay(c) for c in zip(*(lv[0] for lv in levels), strict=True)])


def _take(joined: Any, i: int, templates: Sequence[Any]) -> Any:
  """The inverse of `_overlay` for tree ``i``: ``joined`` where ``templates[i]`` holds its
  subtree alone, None where another template does."""
  if templates[i] is None:
    return None
  if all(t is None for k, t in enumerate(templates) if k != i):
    return joined
  children, treedef = _children(joined)
  split = [_children(t)[0] if t is not None else [None] * len(children) for t in templates]
  return treedef.unflatten([_take(c, i, [s[n] for s in split]) for n, c in enumerate(children)])
