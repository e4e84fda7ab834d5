"""What a framework adapter builds on: one step, state dicts, shardings.

An adapter (optcore's Flax, Equinox and Treex faces, or your own for another
framework) translates its framework's objects to parameters, a state and
gradients, and calls these functions; it computes nothing itself. So every
face checks the same inputs, honours or refuses the same overrides with the
same errors, and writes the same state dicts.

- `as_definition`: an optcore definition or an optax transformation, as a definition.
- `step`: the gradient checks, the hyper-parameters for this step (every
  override refusal included), and the update (new parameters, or optax-style
  updates with ``apply_updates=False``).
- `split_update_arguments`: an ``update``'s keywords as hyper-parameter overrides and
  optax's extra arguments (``value``, ``grad``, ``value_fn``), for a face whose ``update``
  takes both, as ``nnx.Optimizer``'s does (a name neither is refused by `step`).
- `optax_update_arguments`: the same split by optax's contract, for a face that is an optax
  transformation (``as_optax()``): a keyword no hyper-parameter goes on to the definitions that
  read it and is ignored by the others.
- `state_dict` / `restore_state`: the state alone, ``{'state': {'step',
  'param_states'}}``, readable by every face (a core or Flax optimizer's
  ``'target'`` is ignored on restore).
- `state_logical_axes` / `state_shardings`: the state's axes and
  `NamedSharding` objects from the parameters' axes; `StatePlacement`, the
  placement keywords a face's sharding functions take as ``**placement`` and
  pass through whole (see `optcore.Placement`); `shard_method`, a face's ``shard`` made from its
  ``shardings``, with the same arguments.
- `transplant_state`: a state filled from a state dict written for another
  optimizer or other parameters, where parameter, role and shape still match
  (what each face's ``transplant`` calls).
- `key_data_for_export`: typed PRNG keys as key data, for formats without
  them (msgpack).
- `map_definitions` / `iter_definitions`: the one walk over a tree of definitions (a wrapper's
  wrapped definition, a `MultiOptimizer`'s groups), for a face that translates its own
  selectors or settings wherever they sit.
- `step_count`: the number of updates a state has taken, by one rule in every face.
- `warn`: a warning attributed to the user's line, whatever path led to it.
- `fill_unaveraged`: a definition's ``ema_params`` with the parameters no
  `MultiOptimizer` group averages filled in from the parameters.

See "Writing an adapter" in the documentation (docs/concepts/adapters.md) for the Treex
face as a worked example.

Example:
  >>> import jax, jax.numpy as jnp
  >>> import optcore
  >>> from optcore import adapter
  >>> opt_def = adapter.as_definition(optcore.sgd(0.1, momentum=0.9), 'my face')
  >>> params = {'w': jnp.ones(2)}
  >>> state = opt_def.init_state(params)
  >>> params, state = adapter.step(opt_def, params, state, {'w': jnp.ones(2)}, learning_rate=0.5)
  >>> params['w'], sorted(adapter.state_dict(opt_def, state)['state'])
  (Array([0.5, 0.5], dtype=float32), ['param_states', 'step'])
"""

from optcore._src.containers.export import optax_update_arguments as optax_update_arguments
from optcore._src.containers.export import split_update_arguments as split_update_arguments
from optcore._src.containers.optimizer import fill_unaveraged as fill_unaveraged
from optcore._src.containers.state_axes import StatePlacement as StatePlacement
from optcore._src.containers.state_axes import shard_method as shard_method
from optcore._src.containers.state_axes import state_logical_axes as state_logical_axes
from optcore._src.containers.state_axes import state_shardings as state_shardings
from optcore._src.containers.step import apply_step as step
from optcore._src.definitions.base import step_count as step_count
from optcore._src.definitions.optax_wrapper import as_definition as as_definition
from optcore._src.ground.definition_tree import iter_definitions as iter_definitions
from optcore._src.ground.definition_tree import map_definitions as map_definitions
from optcore._src.ground.user_warnings import warn as warn
from optcore._src.persistence.serialization import key_data_for_export as key_data_for_export
from optcore._src.persistence.serialization import restore_state_only as restore_state
from optcore._src.persistence.serialization import state_only_dict as state_dict
from optcore._src.persistence.transplant import transplant_state as transplant_state

__all__ = [
  "StatePlacement",
  "as_definition",
  "fill_unaveraged",
  "iter_definitions",
  "key_data_for_export",
  "map_definitions",
  "optax_update_arguments",
  "restore_state",
  "shard_method",
  "split_update_arguments",
  "state_dict",
  "state_logical_axes",
  "state_shardings",
  "step",
  "step_count",
  "transplant_state",
  "warn",
]
