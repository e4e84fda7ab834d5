"""The cases of `make_qk_clip_reference.py` and of `tests/core/test_qk_clip.py`: attention
weights in Megatron-LM's layouts (torch's ``(out, in)``) and each head's maximum logit, drawn
here so that the script and the test read the same numbers. No optcore, JAX or torch."""

from __future__ import annotations

import numpy as np

HIDDEN = 8
#: name -> (kind, heads, query groups (kv heads), head dim, rotary dims, value dims, tau, alpha).
#: 'mha' and 'gqa': Megatron's ``SelfAttention`` (one ``linear_qkv``); 'mla': its
#: ``MLASelfAttention`` without a query low-rank (``linear_q_proj`` and ``linear_kv_up_proj``).
CASES = {
  "mha": ("mha", 4, 4, 3, 0, 3, 10.0, 0.5),
  "mha_alpha": ("mha", 4, 4, 3, 0, 3, 10.0, 0.3),
  "gqa": ("mha", 6, 2, 3, 0, 3, 10.0, 0.5),
  "mla": ("mla", 4, 4, 3, 2, 3, 10.0, 0.5),
  "mla_alpha": ("mla", 5, 5, 4, 2, 2, 25.0, 0.7),
}
KV_LORA_RANK = 5


def case_inputs(name: str) -> dict[str, np.ndarray]:
  """The case's weights (torch layout, float64) and ``logits`` (one per query head): some far
  above ``tau``, some just above, at or below it, and negative."""
  kind, heads, groups, dim, rope, v_dim, tau, _ = CASES[name]
  rng = np.random.default_rng(sum(map(ord, name)))
  scale = np.array([6.0, 1.01, 1.0, 0.5, -0.3, 2.5])[:heads]
  logits = tau * scale * rng.uniform(0.98, 1.02, heads)
  logits[2] = tau  # exactly the threshold: left as it is
  out = {"logits": logits}
  if kind == "mha":
    rows = heads * dim + 2 * groups * dim
    out["linear_qkv"] = rng.normal(size=(rows, HIDDEN))
  else:
    out["linear_q_proj"] = rng.normal(size=(heads * (dim + rope), HIDDEN))
    out["linear_kv_up_proj"] = rng.normal(size=(heads * (dim + v_dim), KV_LORA_RANK))
  return out
