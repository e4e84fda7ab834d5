"""Writes `low_bit_reference.npz`: what bitsandbytes and torchao themselves give for block-wise
quantization and for their 8-bit and 4-bit Adam, on fixed inputs.

Run it in an environment with torch (CPU), bitsandbytes and torchao (``nox -s reference``
makes one and runs it, then the tests against its output):

    python tests/reference_data/make_low_bit_reference.py [OUT.npz]

The tests (`tests/core/test_low_bit_state.py`) read the committed file, or the one named by
``OPTCORE_LOW_BIT_REFERENCE``. Nothing here imports optcore or JAX.
"""

from __future__ import annotations

import sys
from pathlib import Path

import bitsandbytes as bnb
import bitsandbytes.functional as bnb_functional
import numpy as np
import torch
import torchao
from low_bit_inputs import HYPER, KEPT_STEPS, arrays_to_quantize, gradients, initial_params
from torchao.optim import AdamW4bit, AdamW8bit
from torchao.optim.quant_utils import quantize_4bit_with_qmap, quantize_8bit_with_qmap, scale_tensor
from torchao.optim.subclass_4bit import get_qmap_signed as qmap4_signed
from torchao.optim.subclass_4bit import get_qmap_unsigned as qmap4_unsigned


def trajectory(make, prefix: str, out: dict[str, np.ndarray]) -> None:
  params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in initial_params().items()}
  opt = make(list(params.values()))
  for step, grads in enumerate(gradients(), start=1):
    for k, p in params.items():
      p.grad = torch.tensor(grads[k])
    opt.step()
    if step in KEPT_STEPS:
      for k, p in params.items():
        out[f"{prefix}/step{step}/{k}"] = p.detach().numpy().copy()
  for k, p in params.items():
    state = opt.state[p]
    for name, value in state.items():
      if isinstance(value, torch.Tensor) and name not in ("qmap1", "qmap2", "step"):
        if hasattr(value, "codes"):  # a torchao subclass: its parts and its values
          out[f"{prefix}/state/{k}/{name}/codes"] = value.codes.numpy().copy()
          out[f"{prefix}/state/{k}/{name}/scale"] = value.scale.numpy().copy()
          out[f"{prefix}/state/{k}/{name}/values"] = value.dequantize().numpy().copy()
        else:
          out[f"{prefix}/state/{k}/{name}"] = value.detach().numpy().copy()


def main(path: Path) -> None:
  torch.manual_seed(0)
  out: dict[str, np.ndarray] = {}
  out["map/8/signed"] = bnb_functional.create_dynamic_map(signed=True).numpy()
  out["map/8/unsigned"] = bnb_functional.create_dynamic_map(signed=False).numpy()
  out["map/4/signed"] = np.array(qmap4_signed(), np.float32)
  out["map/4/unsigned"] = np.array(qmap4_unsigned(), np.float32)

  for name, x in arrays_to_quantize().items():
    out[f"input/{name}"] = x
    signed = name != "second"
    code8 = torch.tensor(out["map/8/signed" if signed else "map/8/unsigned"])
    codes, state = bnb_functional.quantize_blockwise(torch.tensor(x), code=code8, blocksize=256)
    out[f"bnb8/{name}/codes"] = codes.numpy()
    out[f"bnb8/{name}/absmax"] = state.absmax.numpy()
    out[f"bnb8/{name}/values"] = bnb_functional.dequantize_blockwise(codes, state).numpy()
    flat = torch.tensor(x).reshape(-1)
    for bits, block, quantize in (
      (8, 256, quantize_8bit_with_qmap),
      (4, 128, quantize_4bit_with_qmap),
    ):
      if flat.numel() % block:
        continue
      qmap = torch.tensor(out[f"map/{bits}/{'signed' if signed else 'unsigned'}"])
      scaled, scale = scale_tensor(flat, block)
      out[f"ao{bits}/{name}/codes"] = quantize(scaled, qmap).numpy()
      out[f"ao{bits}/{name}/scale"] = scale.numpy()

  lr, betas, eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
  trajectory(
    lambda ps: bnb.optim.Adam8bit(ps, lr=lr, betas=betas, eps=eps, weight_decay=0.0),
    "bnb_adam8",
    out,
  )
  trajectory(
    lambda ps: bnb.optim.AdamW8bit(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd),
    "bnb_adamw8",
    out,
  )
  trajectory(
    lambda ps: AdamW8bit(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd), "ao_adamw8", out
  )
  trajectory(
    lambda ps: AdamW4bit(ps, lr=lr, betas=betas, eps=eps, weight_decay=wd), "ao_adamw4", out
  )

  out["versions"] = np.array(
    [
      f"torch {torch.__version__}",
      f"bitsandbytes {bnb.__version__}",
      f"torchao {torchao.__version__}",
    ]
  )
  np.savez_compressed(path, **out)
  print(f"wrote {path} ({path.stat().st_size} bytes, {len(out)} arrays)")


if __name__ == "__main__":
  main(
    Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("low_bit_reference.npz")
  )
