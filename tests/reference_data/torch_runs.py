"""What the reference scripts (``make_*_reference.py``) share: a PyTorch optimizer's run
recorded step by step, the commit of the clone it came from, and the ``.npz`` written with
where its numbers came from. Nothing here imports optcore or JAX; the tests never import it
(they read the committed files)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch


def parameters(params0: Mapping[str, np.ndarray]) -> torch.nn.ParameterDict:
  """The case's initial parameters as torch parameters, in the case's order."""
  return torch.nn.ParameterDict(
    {k: torch.nn.Parameter(torch.tensor(v)) for k, v in params0.items()}
  )


def record(
  name: str,
  module: torch.nn.ParameterDict,
  grads: list[Mapping[str, np.ndarray]],
  step: Callable[[], None],
  out: dict[str, np.ndarray],
  *,
  before_step: Callable[[int], None] | None = None,
) -> None:
  """Sets each step's gradients, calls ``before_step(step)`` (a clipper) and ``step()`` (the
  optimizer's), and writes the parameters after it as ``out['{name}/step{i}/{key}']``,
  counting from 1."""
  for i, grad in enumerate(grads, start=1):
    for k, p in module.items():
      p.grad = torch.tensor(grad[k])
    if before_step is not None:
      before_step(i)
    step()
    for k, p in module.items():
      out[f"{name}/step{i}/{k}"] = p.detach().numpy().copy()


def commit(clone: Path, *, short: bool = True) -> str:
  """The clone's checked-out commit, ``'unknown commit'`` where git cannot tell."""
  found = subprocess.run(
    ["git", "-C", str(clone), "rev-parse", *(["--short"] if short else []), "HEAD"],
    capture_output=True,
    text=True,
  )
  return found.stdout.strip() or "unknown commit"


def save(target: Path, out: dict[str, np.ndarray], source: str, steps: int) -> None:
  """``out`` and where it came from (``meta/source``, ``meta/torch``, ``meta/steps``), as a
  compressed ``.npz`` at ``target``."""
  out["meta/source"] = np.array(source)
  out["meta/torch"] = np.array(torch.__version__)
  out["meta/steps"] = np.array(steps)
  np.savez_compressed(target, **out)
  print(f"wrote {target}: {len(out)} arrays")
