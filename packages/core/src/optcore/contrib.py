"""optax.contrib's optimizers as optcore definitions: ``optcore.contrib.<name>``.

Also optcore's own optimizers with no optax original (`OWN_OPTIMIZERS`: ``soap``, ``shampoo``,
``mars``, ``normuon``, ``dion``, ``adamh``, ``muonh``, ``kron``).
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

from optcore._src.definitions.optax_wrapper import wrap_optax_optimizer as _wrap
from optcore._src.definitions.optax_wrapper import wrapped_names as _wrapped_names
from optcore._src.ground.arguments import OPTAX_WEIGHT_DECAY as _WD
from optcore._src.optimizers.adamh import AdamHState as AdamHState
from optcore._src.optimizers.adamh import adamh as _adamh
from optcore._src.optimizers.dion import DionState as DionState
from optcore._src.optimizers.dion import dion as _dion
from optcore._src.optimizers.kron import KronState as KronState
from optcore._src.optimizers.kron import kron as _kron
from optcore._src.optimizers.mars import MarsState as MarsState
from optcore._src.optimizers.mars import mars as _mars
from optcore._src.optimizers.matrix_state import Preconditioners as Preconditioners
from optcore._src.optimizers.muon import muon as _muon
from optcore._src.optimizers.muonh import MuonHState as MuonHState
from optcore._src.optimizers.muonh import muonh as _muonh
from optcore._src.optimizers.normuon import NorMuonState as NorMuonState
from optcore._src.optimizers.normuon import normuon as _normuon
from optcore._src.optimizers.shampoo import GraftingType as GraftingType
from optcore._src.optimizers.shampoo import PreconditionerType as PreconditionerType
from optcore._src.optimizers.shampoo import ShampooState as ShampooState
from optcore._src.optimizers.shampoo import shampoo as _shampoo
from optcore._src.optimizers.soap import SoapState as SoapState
from optcore._src.optimizers.soap import soap as _soap

#: Declared on each factory that takes it: ``weight_decay`` is a weight decay.
_DECAY = {"weight_decay": _WD}

acprop = _wrap(_contrib.acprop, name="contrib.acprop", declare=_DECAY)
ademamix = _wrap(_contrib.ademamix, name="contrib.ademamix", declare=_DECAY)
adopt = _wrap(_contrib.adopt, name="contrib.adopt")
cocob = _wrap(_contrib.cocob, name="contrib.cocob", declare=_DECAY)
dadapt_adamw = _wrap(_contrib.dadapt_adamw, name="contrib.dadapt_adamw", declare=_DECAY)
dog = _wrap(_contrib.dog, name="contrib.dog", declare=_DECAY)
dowg = _wrap(_contrib.dowg, name="contrib.dowg", declare=_DECAY)
dpsgd = _wrap(_contrib.dpsgd, name="contrib.dpsgd")
galore = _wrap(_contrib.galore, name="contrib.galore", declare=_DECAY)
madgrad = _wrap(_contrib.madgrad, name="contrib.madgrad", declare=_DECAY)
mechanize = _wrap(_contrib.mechanize, name="contrib.mechanize", declare=_DECAY)
momo = _wrap(_contrib.momo, name="contrib.momo", declare=_DECAY)
momo_adam = _wrap(_contrib.momo_adam, name="contrib.momo_adam", declare=_DECAY)
# optax's muon, its matrix dimensions from logical axes, Polar Express and Newton-Schulz on owner
# devices (docs/concepts/muon_at_scale.md).
muon = _wrap(
  _muon,
  name="contrib.muon",
  declare={"weight_decay": _WD, "adam_weight_decay": _WD},
)
prodigy = _wrap(_contrib.prodigy, name="contrib.prodigy", declare=_DECAY)
sam = _wrap(_contrib.sam, name="contrib.sam")
schedule_free = _wrap(_contrib.schedule_free, name="contrib.schedule_free")
schedule_free_adamw = _wrap(
  _contrib.schedule_free_adamw, name="contrib.schedule_free_adamw", declare=_DECAY
)
schedule_free_sgd = _wrap(
  _contrib.schedule_free_sgd, name="contrib.schedule_free_sgd", declare=_DECAY
)
simplified_ademamix = _wrap(
  _contrib.simplified_ademamix, name="contrib.simplified_ademamix", declare=_DECAY
)
sophia = _wrap(_contrib.sophia, name="contrib.sophia", declare=_DECAY)
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
# AdamH: Adam on the hyperball, each weight's norm held; its numbers levanter's.
adamh = _wrap(_adamh, name="contrib.adamh")
# MuonH: Muon on the hyperball; its numbers levanter's.
muonh = _wrap(_muonh, name="contrib.muonh")
# PSGD Kron: Kronecker-factored preconditioners; its names, draws and numbers psgd_jax's.
kron = _wrap(_kron, name="contrib.kron")

#: optcore's own optimizers above (no optax original); a config may also name them without
#: ``contrib.`` (``{"name": "soap"}``).
OWN_OPTIMIZERS: tuple[str, ...] = (
  "soap",
  "shampoo",
  "mars",
  "normuon",
  "dion",
  "adamh",
  "muonh",
  "kron",
)

#: The optax.contrib optimizers wrapped above: read from this module, so a line added
#: above is a contrib optimizer everywhere (``optcore.contrib.<name>``, configs).
CONTRIB_OPTIMIZERS: tuple[str, ...] = (*_wrapped_names(globals(), _contrib), *OWN_OPTIMIZERS)

__all__ = [
  "CONTRIB_OPTIMIZERS",
  "OWN_OPTIMIZERS",
  "AdamHState",
  "DionState",
  "KronState",
  "GraftingType",
  "MarsState",
  "MuonHState",
  "NorMuonState",
  "PreconditionerType",
  "Preconditioners",
  "ShampooState",
  "SoapState",
  *CONTRIB_OPTIMIZERS,
]
