"""optcore's 8-bit adam step against a minimal hand-written JAX 8-bit blockwise Adam with the
same maps and blocks (issue 52's peer), beside an A/A control.

The peer is what a user writes in a few lines: dequantize each moment (`QuantizedArray`, the
same dynamic maps and 256-element blocks), Adam's update, quantize both moments back, in one
jitted, donated step; XLA fuses it as it likes. Each is measured as:

  bytes   XLA's bytes accessed a parameter and the step's temporaries (compiled.cost_analysis,
          memory_analysis)
  time    optcore's step over the peer's, compile-order balanced (timing.py), and the peer's
          against a separately built peer (the A/A control)

  python benchmarks/low_bit_peer.py [--quick] [--total N]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from timing import balanced_ratio, core_step, device_name, donated_runner

import optcore
from optcore import QuantizedArray

RESULTS = Path(__file__).parent / "results"
B1, B2, EPS, LR = 0.9, 0.999, 1e-8, 1e-3


def make_params(total: int) -> dict[str, jax.Array]:
  """8 leaves of 1024 columns adding up to about ``total`` (low_bit.py's shapes)."""
  rows = max(1, total // (8 * 1024))
  rng = np.random.default_rng(0)
  return {f"w{i}": jnp.asarray(rng.standard_normal((rows, 1024)), jnp.float32) for i in range(8)}


def peer_init(params: dict) -> tuple:
  zeros = jax.tree.map(jnp.zeros_like, params)
  quantize = lambda signed: lambda x: QuantizedArray.quantize(x, bits=8, signed=signed)
  return (
    jax.tree.map(quantize(True), zeros),
    jax.tree.map(quantize(False), zeros),
    jnp.zeros((), jnp.int32),
  )


def peer_step(params: dict, state: tuple, grads: dict) -> tuple:
  """The hand-written 8-bit Adam: dequantize, update, requantize."""
  mu_q, nu_q, count = state
  count = count + 1
  t = count.astype(jnp.float32)
  new_params, new_mu, new_nu = {}, {}, {}
  for k, p in params.items():
    g = grads[k]
    mu = B1 * mu_q[k].dequantize() + (1 - B1) * g
    nu = B2 * nu_q[k].dequantize() + (1 - B2) * g * g
    new_params[k] = p - LR * (mu / (1 - B1**t)) / (jnp.sqrt(nu / (1 - B2**t)) + EPS)
    new_mu[k], new_nu[k] = mu_q[k].requantize(mu), nu_q[k].requantize(nu)
  return new_params, (new_mu, new_nu, count)


def peer_runner(params: dict, grads: dict, steps: int):
  step = jax.jit(peer_step, donate_argnums=(0, 1))
  holder = [jax.tree.map(jnp.copy, params)]
  holder.append(peer_init(holder[0]))

  def run() -> None:
    p, s = holder
    for _ in range(steps):
      p, s = step(p, s, grads)
    jax.block_until_ready(p)
    holder[:] = [p, s]

  return run, step, holder


def optcore_def() -> optcore.OptimizerDef:
  # min_size=0: every leaf quantized, as the peer quantizes them (a smoke run's are small)
  return optcore.low_bit_state(optcore.adam(LR), bits=8, min_size=0)


def costs(step, *args) -> tuple[float, float]:
  compiled = step.lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float(cost["bytes accessed"]), compiled.memory_analysis().temp_size_in_bytes / 1e6


def measure(total: int, rounds: int, steps: int) -> dict:
  params = make_params(total)
  n = sum(p.size for p in params.values())
  grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), params)
  _, step, holder = peer_runner(params, grads, steps)
  peer_bytes, peer_temps = costs(step, *holder, grads)
  core_bytes, core_temps = costs(core_step(), optcore_def().create(params), grads)
  builders = {
    "peer": lambda: peer_runner(params, grads, steps)[0],
    "control": lambda: peer_runner(params, grads, steps)[0],
    # timing.donated_runner steps on the same gradients of 1e-3
    "optcore": lambda: donated_runner(optcore_def(), params, steps),
  }
  build = lambda key: builders[key]()
  return {
    "params": int(n),
    "bytes_per_parameter": {"peer": peer_bytes / n, "optcore": core_bytes / n},
    "temporaries_mb": {"peer": peer_temps, "optcore": core_temps},
    "optcore": balanced_ratio(build, "peer", "optcore", rounds, steps)["ratio"],
    "control": balanced_ratio(build, "peer", "control", rounds, steps)["ratio"],
  }


def report(result: dict, machine: str) -> str:
  band = lambda r: f"x{r[0]:.3f} [{r[1]:.3f}-{r[2]:.3f}]"
  b, t = result["bytes_per_parameter"], result["temporaries_mb"]
  return "\n".join(
    [
      f"optcore's 8-bit adam against a minimal hand-written 8-bit Adam, same maps and blocks "
      f"({machine}), {result['params'] / 1e6:.2f}M parameters in 8 leaves of 1024 columns; "
      "time over the peer's step, median [quartiles].",
      "",
      "| step | bytes accessed / parameter | temporaries (MB) | step time |",
      "|---|---|---|---|",
      f"| hand-written | {b['peer']:.1f} | {t['peer']:.1f} | x1 (the baseline) |",
      f"| optcore | {b['optcore']:.1f} | {t['optcore']:.1f} | {band(result['optcore'])} |",
      f"| A/A control | | | {band(result['control'])} |",
      "",
    ]
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--total", type=int, default=4_194_304)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--out", default=str(RESULTS))
  args = parser.parse_args()
  if args.quick:
    args.total, args.rounds, args.steps = 65536, 2, 2
  device = jax.devices()[0]
  machine = f"{device_name(device)}, {platform.machine()}, jax {jax.__version__}"
  result = measure(args.total, args.rounds, args.steps)
  text = report(result, machine)
  print(text)
  out = Path(args.out)
  out.mkdir(exist_ok=True)
  (out / "low_bit_peer.json").write_text(json.dumps({"device": machine, **result}, indent=2))
  (out / "low_bit_peer.md").write_text(text)


if __name__ == "__main__":
  main()
