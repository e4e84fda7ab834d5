"""Writes `qk_clip_reference.npz`: the attention weights after Megatron-LM's own QK-clip
(``SelfAttention.clip_qk`` and ``MLASelfAttention.clip_qk``, megatron-core 0.16.1) on the cases
of `qk_clip_inputs.py`, in float32 and in float64; the float64 run is the float32 run's own
spread, what the tests' tolerance is made from.

Megatron's methods are run as they are, on an object that holds what they read (the config,
the per-head maxima, the weights): building the whole attention layer needs its parallel state,
which a CPU process without ``torch.distributed`` does not have, and the methods read nothing
else. torchtitan's QK-clip (pytorch/torchtitan#4243, Kimi's MLA) is the issue's reference, but
it is in no torchtitan release (0.3.0, 2026-09-03, predates it); Megatron's is the released one
it follows (per-head ``eta = min(1, tau / S)``, the query's rotary part by ``eta``, values left).

    pip install torch && pip install --no-deps megatron-core==0.16.1
    python tests/reference_data/make_qk_clip_reference.py [OUT]

`nox -s reference` writes it anew and the test compares the committed file with it. Nothing
here imports optcore or JAX.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import torch
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.multi_latent_attention import MLASelfAttention
from qk_clip_inputs import CASES, case_inputs


def _layer(kind: str, name: str, dtype: torch.dtype) -> types.SimpleNamespace:
  _, heads, groups, dim, rope, v_dim, tau, alpha = CASES[name]
  inputs = case_inputs(name)
  config = types.SimpleNamespace(
    qk_clip=True,
    qk_clip_threshold=tau,
    qk_clip_alpha=alpha,
    qk_head_dim=dim,
    qk_pos_emb_head_dim=rope,
    v_head_dim=v_dim,
    q_lora_rank=None,
  )
  layer = types.SimpleNamespace(
    config=config,
    core_attention=types.SimpleNamespace(
      current_max_attn_logits=torch.tensor(inputs["logits"], dtype=dtype)
    ),
    num_attention_heads_per_partition=heads,
    num_query_groups_per_partition=groups,
    query_projection_size=heads * dim,
    kv_projection_size=groups * dim,
    cache_mla_latents=False,
  )
  for weight in ("linear_qkv", "linear_q_proj", "linear_kv_up_proj"):
    if weight in inputs:
      param = torch.nn.Parameter(torch.tensor(inputs[weight], dtype=dtype), requires_grad=False)
      setattr(layer, weight, types.SimpleNamespace(weight=param))
  cls = SelfAttention if kind == "mha" else MLASelfAttention
  for method in ("_clip_linear_qkv", "_clip_q_proj_weight", "_clip_kv_proj_weight"):
    if hasattr(cls, method):
      setattr(layer, method, types.MethodType(getattr(cls, method), layer))
  layer.clip_qk = types.MethodType(cls.clip_qk, layer)
  return layer


def main(out_path: str) -> None:
  out: dict[str, np.ndarray] = {}
  for name, (kind, *_) in CASES.items():
    for dtype, suffix in ((torch.float32, ""), (torch.float64, "/float64")):
      layer = _layer(kind, name, dtype)
      layer.clip_qk()
      for weight in ("linear_qkv", "linear_q_proj", "linear_kv_up_proj"):
        if hasattr(layer, weight):
          out[f"{name}/{weight}{suffix}"] = getattr(layer, weight).weight.detach().numpy()
  meta = f"megatron-core {__import__('megatron.core').core.__version__}, torch {torch.__version__}"
  out["meta"] = np.array(meta)
  np.savez(out_path, **out)
  print(f"wrote {out_path}: {meta}")


if __name__ == "__main__":
  sys.path.insert(0, str(Path(__file__).parent))
  main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_name("qk_clip_reference.npz")))
