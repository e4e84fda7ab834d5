"""Fingerprints of the state dicts every face writes, for a fixed set of configurations.

A refactor of the core must not change one byte of a checkpoint. The state is
filled with deterministic values (not the result of steps, whose last bit
may move with XLA), so a fingerprint depends only on the layout: the keys,
their nesting, None and empty entries, every leaf's dtype, shape and bytes.

``python tests/support/state_dict_bytes.py --write PATH`` records the
fingerprints; `tests/conformance/test_state_dict_bytes.py` compares with them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

import faces
import jax
import jax.numpy as jnp
import numpy as np
import optax

import optcore


def params() -> dict[str, Any]:
  return {
    "dense": {"kernel": jnp.zeros((4, 3)), "bias": jnp.zeros(3)},
    "scale": jnp.zeros(()),
  }


def definitions() -> dict[str, Callable[[], Any]]:
  """Configurations covering every state layout the core writes."""
  from optcore.t5x import Adafactor

  legacy = optcore.legacy
  return {
    "adam": lambda: optcore.adam(1e-3),
    "sgd_momentum": lambda: optcore.sgd(0.1, momentum=0.9),
    "sgd_plain": lambda: optcore.sgd(0.1),
    "adamw": lambda: optcore.adamw(1e-3, weight_decay=0.1),
    "optax_adafactor": lambda: optcore.adafactor(1e-2),
    "noisy_sgd": lambda: optcore.noisy_sgd(0.1, key=jax.random.key(0)),
    "chain": lambda: optcore.chain([optax.clip_by_global_norm(1.0), optcore.adam(1e-3)]),
    "ready_transformation": lambda: optcore.OptaxWrapper(optax.adam(1e-3)),
    "contrib_schedule_free": lambda: optcore.contrib.schedule_free_adamw(1e-3),
    "legacy_adam": lambda: legacy.Adam(1e-3),
    "legacy_lamb": lambda: legacy.LAMB(1e-3),
    "legacy_weight_norm": lambda: legacy.WeightNorm(legacy.Momentum(0.1)),
    "legacy_adafactor": lambda: legacy.Adafactor(0.1),
    "t5x_adafactor": lambda: Adafactor(0.1),
    "multi_per_parameter": lambda: optcore.MultiOptimizer(
      (r"kernel", legacy.Adam(1e-3)), (r"bias", legacy.Momentum(0.1))
    ),
    "multi_optax": lambda: optcore.MultiOptimizer(
      (r"kernel", optcore.adam(1e-3)), (r"bias|scale", optcore.sgd(0.1, momentum=0.9))
    ),
  }


def fill(tree: Any) -> Any:
  """``tree`` with every numeric leaf replaced by deterministic values of its
  dtype and shape (keys are kept: their data comes from a fixed seed)."""
  leaves, treedef = jax.tree.flatten(tree)
  out = []
  for i, leaf in enumerate(leaves):
    if jnp.issubdtype(jnp.result_type(leaf), jax.dtypes.prng_key):
      out.append(leaf)
      continue
    shape, dtype = jnp.shape(leaf), jnp.result_type(leaf)
    values = (np.arange(int(np.prod(shape))) % 7 + i).reshape(shape)
    out.append(jnp.asarray(values / 4 if jnp.issubdtype(dtype, jnp.inexact) else values, dtype))
  return treedef.unflatten(out)


def fingerprint(state_dict: Any) -> str:
  """sha256 of a canonical encoding of a state dict (or of raw bytes)."""
  digest = hashlib.sha256()
  if isinstance(state_dict, bytes):
    digest.update(state_dict)
  else:
    _encode(state_dict, digest)
  return digest.hexdigest()


def _encode(node: Any, digest: Any) -> None:
  if isinstance(node, Mapping):
    digest.update(b"{")
    for key in sorted(node, key=str):
      digest.update(repr(key).encode() + b":")
      _encode(node[key], digest)
    digest.update(b"}")
  elif isinstance(node, (list, tuple)):
    digest.update(f"{type(node).__name__}[".encode())
    for item in node:
      _encode(item, digest)
    digest.update(b"]")
  elif node is None or isinstance(node, (bool, int, float, str)):
    digest.update(f"{type(node).__name__}:{node!r};".encode())
  else:
    if jnp.issubdtype(jnp.result_type(node), jax.dtypes.prng_key):
      node = jax.random.key_data(node)
    array = np.asarray(node)
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(np.ascontiguousarray(array).tobytes())


def face_fingerprints(face: faces.Face, entry: str | None = None) -> dict[str, str]:
  """The fingerprint of what ``face`` writes for each of `definitions`, its state
  filled; of its ``entry`` (``'state'``) alone when given."""
  out = {}
  for name, build in definitions().items():
    written = face.fingerprint(build(), params(), fill)
    out[name] = fingerprint(written if entry is None else written[entry])
  return out


def all_fingerprints() -> dict[str, dict[str, str]]:
  return {face.name: face_fingerprints(face) for face in faces.FACES}


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--write", required=True, help="the JSON file to write")
  path = parser.parse_args().write
  with open(path, "w") as f:
    json.dump(all_fingerprints(), f, indent=1, sort_keys=True)
    f.write("\n")
