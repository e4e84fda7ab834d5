"""State dicts in Flax's layout, written and read without importing Flax.

``to_state_dict`` turns any pytree into nested dicts: mapping keys, NamedTuple
fields and object attributes become keys, list and tuple items become ``'0'``,
``'1'``, ...; None stays None and arrays stay as they are; a node whose type
has ``state_dict_form`` (`optcore.GroupNorms`) is written as that. ``from_state_dict``
reads such a dict back into the structure of a reference tree and checks every
key, shape and dtype before it builds anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from optcore._src.ground import paths
from optcore._src.ground.checks import dtype_name
from optcore._src.ground.state import OptimizerState
from optcore._src.persistence import placement

PyTree = Any


class StateDictError(ValueError):
  """A state dict that does not fit the tree it is restored into."""


StateDictError.__module__ = "optcore"


@paths.allows_deep_trees
def to_state_dict(tree: Any) -> Any:
  """Converts a pytree into Flax's nested-dict state-dict layout.

  Args:
    tree: any pytree (an optax state, an `OptimizerState`, parameters).

  Returns:
    Nested dicts with string keys, arrays and None at the leaves.

  Example:
    >>> import optax
    >>> from optcore import to_state_dict
    >>> to_state_dict((optax.EmptyState(), {'w': 1.0}, [None]))
    {'0': {}, '1': {'w': 1.0}, '2': {'0': None}}
  """
  if tree is None:
    return None
  if _has_own_form(tree):
    return to_state_dict(tree.state_dict_form())
  hidden = paths.hidden_child(tree)
  if hidden is not None:
    return to_state_dict(hidden[0])
  split = paths.children_with_keys(tree)
  if split is None:
    return tree
  return {paths.key_name(key): to_state_dict(child) for key, child in split[0]}


@paths.allows_deep_trees
def drop_empty(state_dict: Any) -> Any:
  """Removes empty dicts (optax's EmptyState) recursively, as T5X writes them."""
  if not isinstance(state_dict, dict):
    return state_dict
  out = {}
  for key, value in state_dict.items():
    value = drop_empty(value)
    if isinstance(value, dict) and not value:
      continue
    out[key] = value
  return out


def optimizer_state_dict(target: Any, state: Any) -> dict[str, Any]:
  """``{'target': ..., 'state': {'step': ..., 'param_states': ...}}``, Flax's layout."""
  return {"target": to_state_dict(target), "state": to_state_dict(state)}


@paths.allows_deep_trees
def restore_optimizer_state(
  target: Any, state: Any, state_dict: Any, *, legacy: bool = False
) -> tuple[Any, Any]:
  """Reads an optimizer state dict (exactly ``target`` and ``state``) into the
  structure of ``target`` and ``state``; raises `StateDictError` naming the path.

  ``legacy``: read it as flax.optim and T5X read it. Only ``target`` and
  ``state`` are read, other keys are left to the caller (T5X's train state
  passes its ``flax_mutables`` along), and a value whose dtype JAX makes the
  reference's without x64 (NumPy's int64 step, float64 arrays) is taken in the
  reference's dtype, as the original's next step took it.
  """
  if not isinstance(state_dict, Mapping) or not (
    {"target", "state"} <= set(state_dict) if legacy else set(state_dict) == {"target", "state"}
  ):
    found = sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict).__name__
    wanted = "the keys" if legacy else "exactly the keys"
    raise StateDictError(f"an optimizer state dict has {wanted} ['state', 'target'], found {found}")
  new_target = _restore(target, state_dict["target"], "target", legacy)
  new_state = _restore(state, state_dict["state"], "state", legacy)
  return new_target, new_state


def state_only_dict(optimizer_def: Any, state: Any) -> dict[str, Any]:
  """``{'state': {'step': ..., 'param_states': ...}}``: the state dict of a face that
  does not hold the parameters, in the core's layout (the definition's own
  `state_dict`, so optax's empty states are dropped where the core drops them).

  A ``state.step`` of None (a face that keeps no step of its own, with no
  optax ``count`` to read it from) is left out: ``{'state': {'param_states': ...}}``.

  Args:
    optimizer_def: the definition ``state`` belongs to.
    state: its `OptimizerState`.

  Returns:
    ``{'state': {'step': ..., 'param_states': ...}}``, readable by every face.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt_def = optcore.sgd(0.1, momentum=0.9)
    >>> state = opt_def.init_state({'w': jnp.zeros(2)})
    >>> state_dict = optcore.adapter.state_dict(opt_def, state)
    >>> sorted(state_dict['state']), state_dict['state']['param_states']['0']['trace']
    (['param_states', 'step'], {'w': Array([0., 0.], dtype=float32)})
  """
  step = state.step
  full = state if step is not None else state.replace(step=np.zeros((), np.int32))
  written = optimizer_def.state_dict(None, full)["state"]
  if step is None:
    del written["step"]
  return {"state": written}


def restore_state_only(optimizer_def: Any, state: Any, state_dict: Any) -> Any:
  """``state`` with the values of ``state_dict['state']`` (`state_dict`'s layout,
  or a core or Flax optimizer's, whose ``'target'`` is ignored: the face holds
  no parameters). Raises `StateDictError` naming the path; ``state`` is untouched.

  Where ``state.step`` is None (the face keeps no step), a ``'step'`` in the
  state dict is optional and ignored, and the result's step is None.

  Args:
    optimizer_def: the definition ``state`` belongs to.
    state: the `OptimizerState` whose structure, shapes and dtypes it must have.
    state_dict: ``{'state': ...}``, with or without ``'target'``.

  Returns:
    The restored `OptimizerState`.

  Raises:
    optcore.StateDictError: no ``'state'``, or a key, shape or dtype that
      differs (named by its path).

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt_def = optcore.sgd(0.1, momentum=0.9)
    >>> params = {'w': jnp.zeros(2)}
    >>> saved = optcore.adam(0.1).create(params).state_dict()
    >>> optcore.adapter.restore_state(opt_def, opt_def.init_state(params), saved)
    Traceback (most recent call last):
    ...
    optcore.StateDictError: at 'state/param_states/0': ...
  """
  if not isinstance(state_dict, Mapping) or "state" not in state_dict:
    found = sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict).__name__
    raise StateDictError(f"expected a dict with a 'state' key, found {found}")
  given = state_dict["state"]
  reference = state
  if state.step is None:  # no step kept here: whatever step was written is not read
    reference = state.replace(step=np.zeros((), np.int32))
    if isinstance(given, Mapping):
      given = {**given, "step": reference.step}
  _, restored = optimizer_def.restore_state(None, reference, {"target": None, "state": given})
  return restored if state.step is not None else restored.replace(step=None)


@paths.allows_deep_trees
def from_state_dict(reference: Any, state_dict: Any, *, root: str = "") -> Any:
  """Reads ``state_dict`` back into the structure of ``reference``.

  Every key, shape and dtype is checked first; a mismatch raises a
  `StateDictError` naming the path, and nothing is built. Keys that the
  reference would write as empty dicts may be missing (T5X drops them).

  Args:
    reference: the tree whose structure, shapes and dtypes the result has.
    state_dict: nested dicts as `to_state_dict` writes them (or a checkpoint's).
    root: the path prefix error messages start from.

  Returns:
    A tree of ``reference``'s structure holding the state dict's values.

  Raises:
    optcore.StateDictError: a missing or extra key, a shape or a dtype that
      differs (named by its path); nothing is built then.

  Example:
    >>> import numpy as np
    >>> from optcore import from_state_dict
    >>> ref = {'w': np.zeros(2, np.float32)}
    >>> from_state_dict(ref, {'w': np.ones(2, np.float32)})
    {'w': array([1., 1.], dtype=float32)}
    >>> from_state_dict(ref, {'w': np.ones(3, np.float32)}, root='target')
    Traceback (most recent call last):
    ...
    optcore.StateDictError: at 'target/w': expected ... shape (2,) ... found ... shape (3,) ...
  """
  return _restore(reference, state_dict, root, False)


def _has_own_form(node: Any) -> bool:
  """Whether ``node``'s type writes state dicts in a layout of its own (``state_dict_form``;
  `optcore.GroupNorms`: an array a group, its rows one array in the state) and reads it back
  (``from_state_dict_form``). Asked of the type: an nnx Variable forwards attributes."""
  return hasattr(type(node), "state_dict_form")


def _restore(ref: Any, value: Any, path: str, legacy: bool) -> Any:
  if ref is None:
    if value is not None:
      raise StateDictError(f"at {path!r}: expected None, found {describe(value)}.")
    return None
  if _has_own_form(ref):
    return ref.from_state_dict_form(_restore(ref.state_dict_form(), value, path, legacy))
  hidden = paths.hidden_child(ref)
  if hidden is not None:
    child, treedef = hidden
    return treedef.unflatten([_restore(child, value, path, legacy)])
  split = paths.children_with_keys(ref)
  if split is None:
    return _restore_leaf(ref, value, path, legacy)
  children, treedef = split
  if not isinstance(value, Mapping):
    raise StateDictError(
      f"at {path!r}: expected a dict with keys {[paths.key_name(k) for k, _ in children]} "
      f"(for a {type(ref).__name__}), found {describe(value)}."
    )
  names = [paths.key_name(k) for k, _ in children]
  not_strings = [k for k in value if not isinstance(k, str)]
  if not_strings:
    key = not_strings[0]
    raise StateDictError(
      f"at {path!r}: found the key {key!r} ({type(key).__name__}); state dict keys are strings "
      f"(a list's items are '0', '1', ...), and this {type(ref).__name__} has keys {names}. "
      f"Write the key as {str(key)!r}."
    )
  extra = sorted(set(value) - set(names))
  if extra:
    raise StateDictError(
      f"at {path!r}: unexpected keys {extra}; this {type(ref).__name__} has keys {names}. "
      "The state dict was written for a different optimizer or parameter structure."
    )
  new_children = []
  for name, (_, child) in zip(names, children, strict=True):
    child_path = f"{path}/{name}" if path else name
    if name in value:
      new_children.append(_restore(child, value[name], child_path, legacy))
    elif _is_empty(child):
      new_children.append(child)
    else:
      raise StateDictError(
        f"at {child_path!r}: missing from the state dict; expected {describe(child)}. "
        "The state dict was written for a different optimizer or parameter structure."
      )
  return treedef.unflatten(new_children)


def _restore_leaf(ref: Any, value: Any, path: str, legacy: bool) -> Any:
  if isinstance(ref, PartitionSpec):  # a tree of logical axes (derive_logical_axes)
    if not isinstance(value, PartitionSpec):
      raise StateDictError(f"at {path!r}: expected a PartitionSpec, found {describe(value)}.")
    return value
  if isinstance(value, Mapping) or value is None:
    raise StateDictError(f"at {path!r}: expected {describe(ref)}, found {describe(value)}.")
  if _is_key(ref) and not _is_key(value):
    # Formats without typed PRNG keys (msgpack, ...) store their key data.
    value = _wrap_key_data(ref, value, path)
  ref_shape = np.shape(ref)
  if np.shape(value) != ref_shape:
    raise StateDictError(
      f"at {path!r}: expected {describe(ref)}, found {describe(value)}. The state dict was "
      "written for parameters of other shapes, or by a definition of other settings (a "
      "skip_bad_steps window of another length); restore into an optimizer created from the "
      "same parameters and settings."
    )
  ref_dtype = getattr(ref, "dtype", None)
  if ref_dtype is None and isinstance(ref, (bool, int, float, complex)):
    _check_python_number(ref, value, path)
  if ref_dtype is not None:
    value_dtype = getattr(value, "dtype", None)
    if value_dtype is None:  # a Python scalar or list: take the reference's dtype, if it fits
      return _python_value(value, ref, path)
    if value_dtype != ref_dtype and legacy and _same_without_x64(value, ref_dtype, path):
      return np.asarray(value).astype(ref_dtype)
    if value_dtype != ref_dtype:
      raise StateDictError(
        f"at {path!r}: expected {describe(ref)}, found {describe(value)}. Cast the "
        f"checkpoint's value to {dtype_name(ref_dtype)} before restoring it."
      )
  return value


def _check_python_number(ref: Any, value: Any, path: str) -> None:
  """A Python number in the state (no dtype to compare) takes a number of its kind:
  never a string, and never a fraction where it holds an integer."""
  kind = np.asarray(value).dtype.kind if not isinstance(value, str) else "U"
  if isinstance(ref, bool):
    fits = "b"
  else:
    fits = "biu" if isinstance(ref, int) else "biuf" if isinstance(ref, float) else "biufc"
  if kind not in fits:
    raise StateDictError(
      f"at {path!r}: expected a number like {ref!r} ({type(ref).__name__}), found "
      f"{describe(value)}. The state dict was not written by this optimizer, or was decoded "
      "wrongly."
    )


def _same_without_x64(value: Any, ref_dtype: Any, path: str) -> bool:
  """Whether JAX without x64 gives ``value`` and the reference one dtype (int64 and
  int32, float64 and float32); an integer that int32 cannot hold raises."""
  try:
    canonical = jax.dtypes.canonicalize_dtype
    same = canonical(value.dtype) == canonical(ref_dtype)
  except TypeError:  # typed PRNG keys have no canonical NumPy dtype
    return False
  if same and np.dtype(ref_dtype).kind in "iu":
    info, array = np.iinfo(ref_dtype), np.asarray(value)
    if array.size and (array.min() < info.min or array.max() > info.max):
      raise StateDictError(
        f"at {path!r}: expected an array of dtype {dtype_name(ref_dtype)}, found "
        f"{describe(value)} holding values outside its range; restoring it would wrap them."
      )
  return same


def _python_value(value: Any, ref: Any, path: str) -> Any:
  """A Python number (or nested list) in the reference's dtype; never truncated,
  never a string: those raise `StateDictError`."""
  ref_dtype = np.dtype(ref.dtype)
  try:
    array = np.asarray(value)
  except (ValueError, TypeError):
    array = np.asarray(value, dtype=object)
  if array.dtype.kind not in "biufc":
    held = "strings" if array.dtype.kind in "SU" else "values that are not numbers"
    raise StateDictError(
      f"at {path!r}: expected {describe(ref)}, found {describe(value)} holding {held}. The "
      "state dict was not written by an optimizer (or was decoded wrongly)."
    )
  if ref_dtype.kind in "biu" and array.dtype.kind in "fc" and not np.all(np.mod(array, 1) == 0):
    raise StateDictError(
      f"at {path!r}: expected {describe(ref)}, found {describe(value)}, which is not a whole "
      f"number: restoring it as {ref_dtype.name} would truncate it. Write the integer value."
    )
  return array.astype(ref_dtype)


def _is_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _wrap_key_data(ref: Any, value: Any, path: str) -> Any:
  impl = jax.random.key_impl(ref) if isinstance(ref, jax.Array) else None
  expected = jax.eval_shape(jax.random.key_data, ref)
  if np.shape(value) != expected.shape or np.asarray(value).dtype != expected.dtype:
    raise StateDictError(
      f"at {path!r}: expected {describe(ref)} or its key data of shape {expected.shape} and "
      f"dtype {expected.dtype}, found {describe(value)}."
    )
  return jax.random.wrap_key_data(jnp.asarray(value), impl=impl)


def key_data_for_export(tree: Any) -> Any:
  """``tree`` with typed PRNG key arrays as their key data, for formats without
  them (msgpack); `from_state_dict` reads key data back into a key.

  Args:
    tree: a pytree, typed PRNG keys among its leaves.

  Returns:
    The same tree, each key array replaced by its ``uint32`` key data.

  Example:
    >>> import jax
    >>> import optcore
    >>> optcore.adapter.key_data_for_export({'key': jax.random.key(0)})['key'].dtype
    dtype('uint32')
  """
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _is_empty(tree: Any) -> bool:
  """True where `to_state_dict` writes nothing but (nested) empty dicts."""
  return tree is not None and not jax.tree_util.tree_leaves(tree) and _has_no_none(tree)


def _has_no_none(tree: Any) -> bool:
  return all(x is not None for x in jax.tree_util.tree_leaves(tree, is_leaf=lambda x: x is None))


def describe(x: Any) -> str:
  """A short description of ``x`` for error messages."""
  if x is None:
    return "None"
  if isinstance(x, Mapping):
    return f"a dict with keys {sorted(map(str, x))}"
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return f"an array of shape {tuple(x.shape)} and dtype {dtype_name(x.dtype)}"
  if isinstance(x, (int, float, complex, bool, np.generic)):
    return f"a scalar {x!r}"
  split = paths.children_with_keys(x)
  if split is not None:
    return f"a {type(x).__name__} with keys {[paths.key_name(k) for k, _ in split[0]]}"
  return f"a {type(x).__name__}"


class StateDictMethods:
  """`OptimizerDef`'s state-dict methods: Flax's layout out, checked restores in."""

  #: Set on `OptimizerDef`; read by `restore_state`.
  legacy_state_dicts: bool

  def state_dict(self, target: PyTree, state: OptimizerState) -> dict[str, Any]:
    """The state dict of ``target`` and ``state`` in Flax's layout.

    Args:
      target: the parameters (None for a face that does not hold them).
      state: their `OptimizerState`.

    Returns:
      ``{'target': ..., 'state': {'step': ..., 'param_states': ...}}``: nested
      dicts of arrays, every key a string (`to_state_dict`).

    Example:
      >>> import jax.numpy as jnp
      >>> import optcore
      >>> opt_def = optcore.sgd(0.1, momentum=0.9)
      >>> params = {'w': jnp.ones(2)}
      >>> written = opt_def.state_dict(params, opt_def.init_state(params))
      >>> sorted(written['state']), written['state']['param_states']['0']['trace']
      (['param_states', 'step'], {'w': Array([0., 0.], dtype=float32)})
    """
    return optimizer_state_dict(target, state)

  def restore_state(
    self, target: PyTree, state: OptimizerState, state_dict: Mapping[str, Any]
  ) -> tuple[PyTree, OptimizerState]:
    """Reads a `state_dict` into the structure of ``target`` and ``state``.

    With `legacy_state_dicts` (flax.optim's interface), keys beside
    ``'target'`` and ``'state'`` are ignored and 64-bit NumPy values restore
    into their 32-bit state leaves, as in flax.optim and T5X.

    Args:
      target: the parameters whose structure, shapes and dtypes it must have.
      state: the `OptimizerState` likewise.
      state_dict: ``{'target': ..., 'state': ...}`` as `state_dict` writes it.

    Returns:
      ``(target, state)`` holding the state dict's values.

    Raises:
      optcore.StateDictError: a missing or extra key, a shape or a dtype that
        differ (the message names the path), or a value the definition cannot
        continue from (`check_state_values`); nothing is changed then.

    Example:
      >>> import numpy as np, jax.numpy as jnp
      >>> from optcore import legacy
      >>> opt = legacy.Momentum(0.1).create({'w': jnp.zeros(2)})
      >>> state_dict = opt.state_dict()
      >>> state_dict['state']['step'] = np.int64(7)  # as T5X's replace_step writes it
      >>> state_dict['flax_mutables'] = {}  # as T5X's train state passes it
      >>> opt.restore_state(state_dict).state.step
      array(7, dtype=int32)
    """
    new_target, new_state = restore_optimizer_state(
      target, state, state_dict, legacy=self.legacy_state_dicts
    )
    self.check_state_values(new_state)
    # JAX arrays where this optimizer's own were placed (create_sharded's layout, host memory),
    # so the next eager step takes them; a legacy face gives NumPy's back as flax.optim did.
    where = {"placed_only": self.legacy_state_dicts}
    return (
      placement.keep_placement(new_target, target, **where),
      placement.keep_placement(new_state, state, **where),
    )

  def check_state_values(self, state: OptimizerState, where: str = "state/param_states") -> None:
    """Raises `StateDictError` for a restored ``state`` whose structure, shapes and dtypes fit
    but whose values this definition cannot continue from (`accumulate`'s ``mini_step`` of a
    longer window), naming the path below ``where`` (the state dict path of
    ``state.param_states``). Every restore and transplant calls it; by default it accepts all."""
