"""The authors' PyTorch SOAP against torch's AdamW, timed as benchmarks/timing.py times JAX:
interleaved rounds in both build orders, beside an A/A control (AdamW against AdamW).

Run by benchmarks/matrix_optimizers.py with a Python that has torch:

    PY soap_reference_timing.py SOAP_CLONE '[[128, 128], ...]' ROUNDS STEPS

prints JSON: the median and quartiles of SOAP's and the control's per-round ratios, and
AdamW's mean step in ms. Imports neither JAX nor optcore.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time


def main() -> None:
  source, shapes, rounds, steps = sys.argv[1], json.loads(sys.argv[2]), *map(int, sys.argv[3:])
  sys.path.insert(0, source)
  import torch
  from soap import SOAP  # the authors' class, from their clone

  torch.manual_seed(0)
  makers = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.01),
    "soap": lambda ps: SOAP(ps, lr=3e-3),
  }

  def build(name):
    kind = "adamw" if name == "control" else name
    params = [torch.nn.Parameter(torch.randn(*s) / math.sqrt(s[0])) for s in shapes]
    grads = [torch.randn(*s) for s in shapes]
    opt = makers[kind](params)

    def run():
      for _ in range(steps):
        for p, g in zip(params, grads, strict=True):
          p.grad = g
        opt.step()

    run()  # the first step: SOAP sets up its bases
    return run

  def interleaved(order):
    runners = {k: build(k) for k in order}
    times = {k: [] for k in order}
    for _ in range(rounds):
      for k in order:
        start = time.perf_counter()
        runners[k]()
        times[k].append((time.perf_counter() - start) / steps)
    return times

  def quantiles(values):
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return [statistics.median(values), q1, q3]

  out = {"torch": torch.__version__, "threads": torch.get_num_threads()}
  base_times = []
  for face in ("soap", "control"):
    per_order = []
    for order in (("adamw", face), (face, "adamw")):
      times = interleaved(order)
      per_order.append([f / b for f, b in zip(times[face], times["adamw"], strict=True)])
      base_times += times["adamw"]
    combined = [math.sqrt(a * b) for a, b in zip(*per_order, strict=True)]
    out[face] = quantiles(combined)
  out["adamw_ms"] = 1e3 * statistics.median(base_times)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
