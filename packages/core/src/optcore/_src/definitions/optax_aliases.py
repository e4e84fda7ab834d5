"""optax's optimizer aliases as optcore definitions, one line each.

Written out, not generated in a loop, so that IDEs and type checkers see
``optcore.adam`` with optax's signature; `OPTAX_ALIASES` is read from these
lines. `tests/core/test_optax_wrapping.py` checks them against what the
installed optax offers (`tests/support/optax_names.py`), so an optimizer that
a new optax adds cannot be missed.
"""

import optax as _optax

from optcore._src.definitions.optax_wrapper import wrap_optax_optimizer as _wrap
from optcore._src.definitions.optax_wrapper import wrapped_names as _wrapped_names
from optcore._src.ground.arguments import OPTAX_WEIGHT_DECAY as _WD
from optcore._src.ground.arguments import declare_for as _declare_for

#: Declared on each factory that takes it: ``weight_decay`` is a weight decay.
_DECAY = {"weight_decay": _WD}
# Not an optimizer, but a chain's member that decays: wrapped (`wrap_optax_optimizer`), its rate
# is a weight decay, for `cautious` and `multipliers` (torch's coupled L2: a decay before adam).
_declare_for(_optax.add_decayed_weights, **_DECAY)

adabelief = _wrap(_optax.adabelief, name="adabelief")
adadelta = _wrap(_optax.adadelta, name="adadelta", declare=_DECAY)
adafactor = _wrap(_optax.adafactor, name="adafactor", declare={"weight_decay_rate": _WD})
adagrad = _wrap(_optax.adagrad, name="adagrad")
adam = _wrap(_optax.adam, name="adam")
adamax = _wrap(_optax.adamax, name="adamax")
adamaxw = _wrap(_optax.adamaxw, name="adamaxw", declare=_DECAY)
adamw = _wrap(_optax.adamw, name="adamw", declare=_DECAY)
adan = _wrap(_optax.adan, name="adan", declare=_DECAY)
amsgrad = _wrap(_optax.amsgrad, name="amsgrad")
fromage = _wrap(_optax.fromage, name="fromage")
lamb = _wrap(_optax.lamb, name="lamb", declare=_DECAY)
lars = _wrap(_optax.lars, name="lars", declare=_DECAY)
lbfgs = _wrap(_optax.lbfgs, name="lbfgs")
lion = _wrap(_optax.lion, name="lion", declare=_DECAY)
nadam = _wrap(_optax.nadam, name="nadam")
nadamw = _wrap(_optax.nadamw, name="nadamw", declare=_DECAY)
noisy_sgd = _wrap(_optax.noisy_sgd, name="noisy_sgd")
novograd = _wrap(_optax.novograd, name="novograd", declare=_DECAY)
polyak_sgd = _wrap(_optax.polyak_sgd, name="polyak_sgd")
radam = _wrap(_optax.radam, name="radam")
rmsprop = _wrap(_optax.rmsprop, name="rmsprop")
rprop = _wrap(_optax.rprop, name="rprop")
sgd = _wrap(_optax.sgd, name="sgd")
sign_sgd = _wrap(_optax.sign_sgd, name="sign_sgd")
signum = _wrap(_optax.signum, name="signum")
sm3 = _wrap(_optax.sm3, name="sm3")
yogi = _wrap(_optax.yogi, name="yogi")
optimistic_gradient_descent = _wrap(
  _optax.optimistic_gradient_descent, name="optimistic_gradient_descent"
)
optimistic_adam = _wrap(_optax.optimistic_adam, name="optimistic_adam")
optimistic_adam_v2 = _wrap(_optax.optimistic_adam_v2, name="optimistic_adam_v2")

#: The optax optimizer aliases wrapped above, in the order written (optax's): read from
#: this module, so a line added above is an alias everywhere (``optcore.<name>``, configs).
OPTAX_ALIASES: tuple[str, ...] = _wrapped_names(globals(), _optax)
