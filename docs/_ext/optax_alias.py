"""``.. optax-alias:: optcore.adam``: one entry of the API reference for a wrapped optax alias.

An alias carries optax's signature and docstring, and optax's docstrings are written for optax's
own site (links into its gallery, its substitutions): rendered here they would break the build.
The entry gives the signature, the docstring's first line and a link to optax's page instead.
"""

from __future__ import annotations

import importlib
import inspect

from sphinx.util.docutils import SphinxDirective

OPTAX_API = "https://optax.readthedocs.io/en/latest/api"


def _resolve(dotted: str):
  module, _, name = dotted.rpartition(".")
  return getattr(importlib.import_module(module), name)


def _optax_page(name: str, contrib: bool) -> str:
  if contrib:
    return f"{OPTAX_API}/contrib.html#optax.contrib.{name}"
  return f"{OPTAX_API}/optimizers.html#optax.{name}"


class OptaxAlias(SphinxDirective):
  required_arguments = 1

  def run(self):
    dotted = self.arguments[0]
    func = _resolve(dotted)
    name = dotted.rpartition(".")[2]
    contrib = ".contrib." in dotted or name == "dpsgd"
    summary = (inspect.getdoc(func) or "").strip().splitlines()[0:1]
    where = f"optax.contrib.{name}" if contrib else f"optax.{name}"
    text = (
      f".. py:function:: {dotted}{inspect.signature(func)}\n\n"
      f"   {summary[0] if summary else ''}\n\n"
      f"   ``{where}`` as an optcore definition whose arguments are overridable "
      f"hyper-parameters; optax's documentation: `{where} <{_optax_page(name, contrib)}>`_.\n"
    )
    return self.parse_text_to_nodes(text)


def setup(app):
  app.add_directive("optax-alias", OptaxAlias)
  return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
