"""optax.contrib's optimizers as optcore definitions: ``optcore.contrib.<name>``.

Also optcore's own optimizers with no optax original (`OWN_OPTIMIZERS`: ``soap``, ``shampoo``,
``mars``, ``normuon``, ``dion``).
Optimizer wrappers (mechanize, sam, schedule_free, split_real_and_imaginary)
take optax transformations or optcore definitions. The list is written out,
one line each, so that IDEs and type checkers see every name, and
`CONTRIB_OPTIMIZERS` is read from it; `tests/core/test_optax_wrapping.py`
checks it against the installed ``optax.contrib``, so an optimizer a new
optax adds cannot be missed.

Example:
  >>> import jax.numpy as jnp
  >>> import optcore
  >>> opt = optcore.contrib.adopt(learning_rate=1e-3).create({'w': jnp.ones(2)})
  >>> opt.apply_gradient({'w': jnp.ones(2)}, learning_rate=0.0).target['w']
  Array([1., 1.], dtype=float32)
"""

import optax.contrib as _contrib

from optcore._src.axes.matrix_axes import muon_with_axes as _muon_with_axes
from optcore._src.definitions.optax_wrapper import wrap_optax_optimizer as _wrap
from optcore._src.definitions.optax_wrapper import wrapped_names as _wrapped_names
from optcore._src.optimizers.dion import DionState as DionState
from optcore._src.optimizers.dion import dion as _dion
from optcore._src.optimizers.mars import MarsState as MarsState
from optcore._src.optimizers.mars import mars as _mars
from optcore._src.optimizers.matrix_state import Preconditioners as Preconditioners
from optcore._src.optimizers.normuon import NorMuonState as NorMuonState
from optcore._src.optimizers.normuon import normuon as _normuon
from optcore._src.optimizers.shampoo import GraftingType as GraftingType
from optcore._src.optimizers.shampoo import PreconditionerType as PreconditionerType
from optcore._src.optimizers.shampoo import ShampooState as ShampooState
from optcore._src.optimizers.shampoo import shampoo as _shampoo
from optcore._src.optimizers.soap import SoapState as SoapState
from optcore._src.optimizers.soap import soap as _soap

acprop = _wrap(_contrib.acprop, name="contrib.acprop")
ademamix = _wrap(_contrib.ademamix, name="contrib.ademamix")
adopt = _wrap(_contrib.adopt, name="contrib.adopt")
cocob = _wrap(_contrib.cocob, name="contrib.cocob")
dadapt_adamw = _wrap(_contrib.dadapt_adamw, name="contrib.dadapt_adamw")
dog = _wrap(_contrib.dog, name="contrib.dog")
dowg = _wrap(_contrib.dowg, name="contrib.dowg")
dpsgd = _wrap(_contrib.dpsgd, name="contrib.dpsgd")
galore = _wrap(_contrib.galore, name="contrib.galore")
madgrad = _wrap(_contrib.madgrad, name="contrib.madgrad")
mechanize = _wrap(_contrib.mechanize, name="contrib.mechanize")
momo = _wrap(_contrib.momo, name="contrib.momo")
momo_adam = _wrap(_contrib.momo_adam, name="contrib.momo_adam")
muon = _wrap(_muon_with_axes, name="contrib.muon")
prodigy = _wrap(_contrib.prodigy, name="contrib.prodigy")
sam = _wrap(_contrib.sam, name="contrib.sam")
schedule_free = _wrap(_contrib.schedule_free, name="contrib.schedule_free")
schedule_free_adamw = _wrap(_contrib.schedule_free_adamw, name="contrib.schedule_free_adamw")
schedule_free_sgd = _wrap(_contrib.schedule_free_sgd, name="contrib.schedule_free_sgd")
simplified_ademamix = _wrap(_contrib.simplified_ademamix, name="contrib.simplified_ademamix")
sophia = _wrap(_contrib.sophia, name="contrib.sophia")
split_real_and_imaginary = _wrap(
  _contrib.split_real_and_imaginary, name="contrib.split_real_and_imaginary"
)
# optcore's own, with no optax original: the matrix-preconditioned optimizers, their
# numbers those of their authors' code (docs/concepts/soap.md, shampoo.md).
soap = _wrap(_soap, name="contrib.soap")
shampoo = _wrap(_shampoo, name="contrib.shampoo")
# MARS: variance-reduced AdamW and Lion, its numbers the authors' (docs/concepts/mars.md).
mars = _wrap(_mars, name="contrib.mars")
# NorMuon: Muon with per-row second moments, its numbers the authors' (the same page).
normuon = _wrap(_normuon, name="contrib.normuon")
# Dion: low-rank orthonormalised updates with error feedback, its numbers the authors'.
dion = _wrap(_dion, name="contrib.dion")

#: optcore's own optimizers above (no optax original); a config may also name them without
#: ``contrib.`` (``{"name": "soap"}``).
OWN_OPTIMIZERS: tuple[str, ...] = ("soap", "shampoo", "mars", "normuon", "dion")

#: The optax.contrib optimizers wrapped above: read from this module, so a line added
#: above is a contrib optimizer everywhere (``optcore.contrib.<name>``, configs).
CONTRIB_OPTIMIZERS: tuple[str, ...] = (*_wrapped_names(globals(), _contrib), *OWN_OPTIMIZERS)

__all__ = [
  "CONTRIB_OPTIMIZERS",
  "OWN_OPTIMIZERS",
  "DionState",
  "GraftingType",
  "MarsState",
  "NorMuonState",
  "PreconditionerType",
  "Preconditioners",
  "ShampooState",
  "SoapState",
  *CONTRIB_OPTIMIZERS,
]
