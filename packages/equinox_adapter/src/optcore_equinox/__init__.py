"""optcore for Equinox: the optimizer as an ``eqx.Module``.

`Optimizer` takes any optcore definition (or a raw optax transformation) and
a model, optimises the leaves a filter selects, and updates functionally
under ``eqx.filter_jit``.

  >>> import equinox as eqx, jax, jax.numpy as jnp
  >>> import optcore, optcore_equinox
  >>> model = eqx.nn.MLP(2, 1, width_size=4, depth=1, key=jax.random.key(0))
  >>> opt = optcore_equinox.Optimizer(optcore.adam(1e-2), model)
  >>> grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2)) ** 2))(model)
  >>> model, opt = opt.update(grads, model)
  >>> int(opt.state.step)
  1
"""

from importlib.metadata import version as _version

from optcore_equinox._optimizer import Optimizer as Optimizer

__version__ = _version("optcore-equinox")
__all__ = ["Optimizer"]
