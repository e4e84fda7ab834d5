"""optcore's 8-bit adam step against the strongest minimal hand-written JAX 8-bit blockwise
Adam we could write with the same maps and blocks (issue 65), beside an A/A control, on the
stack it runs on.

The peer is bitsandbytes' CPU form in a few lines of JAX: each moment's codes read back
through its dynamic map times its block's scale, Adam's update, each block's largest absolute
value, and the codes found by ONE gather from a 65,536-entry table indexed by the normalized
value's float16 bits (the nearest map value of each float16), all in one jitted, donated
step that XLA fuses as it likes. (Issue 52's peer dequantized and requantized through
optcore's own `QuantizedArray`: 80.5 bytes a parameter, a weaker baseline.) optcore's codes
are the nearest of the float32 value, not of its float16 rounding: the same code but where a
midpoint lies between the two.

Each is measured as:

  bytes   XLA's bytes accessed a parameter and the step's temporaries (compiled.cost_analysis,
          memory_analysis)
  time    optcore's step over the peer's, compile-order balanced (timing.py), and the peer's
          against a separately built peer (the A/A control)

Results go to results/low_bit_peer_jax<version>.md: `nox -s bench` runs it on the oldest and
the newest stack uv.lock resolves.

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
from timing import balanced_ratio, core_step, device_name, donated_runner, version_suffix

import optcore
from optcore._src.persistence.quantization import quantization_map

RESULTS = Path(__file__).parent / "results"
B1, B2, EPS, LR = 0.9, 0.999, 1e-8, 1e-3


def make_params(total: int) -> dict[str, jax.Array]:
  """8 leaves of 1024 columns adding up to about ``total`` (low_bit.py's shapes)."""
  rows = max(1, total // (8 * 1024))
  rng = np.random.default_rng(0)
  return {f"w{i}": jnp.asarray(rng.standard_normal((rows, 1024)), jnp.float32) for i in range(8)}


BLOCK = 256


def float16_table(signed: bool) -> np.ndarray:
  """For each of the 65,536 float16 bit patterns, the code of the map value nearest its value
  (a tie rounds up; the patterns past [-1, 1], infinities and NaNs clipped to the ends)."""
  values = quantization_map(8, signed)
  midpoints = (values[:-1] + values[1:]) / np.float32(2.0)
  halves = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
  with np.errstate(invalid="ignore"):
    codes = np.searchsorted(midpoints, halves.astype(np.float32), side="right")
  return np.minimum(codes, 255).astype(np.uint8)


MAPS = {signed: jnp.asarray(quantization_map(8, signed)) for signed in (True, False)}
TABLES = {signed: jnp.asarray(float16_table(signed)) for signed in (True, False)}


def dequantize(codes: jax.Array, scales: jax.Array, signed: bool) -> jax.Array:
  """Blocks ``(..., 256)`` of float32 values from their codes and scales."""
  return MAPS[signed][codes.astype(jnp.int32)] * scales[..., None]


def quantize(blocks: jax.Array, signed: bool) -> tuple[jax.Array, jax.Array]:
  """Codes and scales of float32 blocks ``(..., 256)``: one gather a value."""
  scales = jnp.max(jnp.abs(blocks), axis=-1)
  normalized = blocks / jnp.where(scales > 0, scales, 1.0)[..., None]
  bits = jax.lax.bitcast_convert_type(normalized.astype(jnp.float16), jnp.uint16)
  return TABLES[signed][bits.astype(jnp.int32)], scales


def peer_init(params: dict) -> tuple:
  def zeros(p: jax.Array) -> tuple[jax.Array, jax.Array]:
    blocks = p.size // BLOCK
    return jnp.zeros((blocks, BLOCK), jnp.uint8), jnp.zeros((blocks,), jnp.float32)

  return jax.tree.map(zeros, params), jax.tree.map(zeros, params), jnp.zeros((), jnp.int32)


def peer_step(params: dict, state: tuple, grads: dict) -> tuple:
  """The hand-written 8-bit Adam: dequantize, update, quantize through the float16 table."""
  mu_q, nu_q, count = state
  count = count + 1
  t = count.astype(jnp.float32)
  new_params, new_mu, new_nu = {}, {}, {}
  for k, p in params.items():
    g = grads[k].reshape(-1, BLOCK)
    mu = B1 * dequantize(*mu_q[k], True) + (1 - B1) * g
    nu = B2 * dequantize(*nu_q[k], False) + (1 - B2) * g * g
    step = LR * (mu / (1 - B1**t)) / (jnp.sqrt(nu / (1 - B2**t)) + EPS)
    new_params[k] = p - step.reshape(p.shape)
    new_mu[k], new_nu[k] = quantize(mu, True), quantize(nu, False)
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
      f"optcore's 8-bit adam against the strongest minimal hand-written 8-bit Adam, same maps "
      f"and blocks, its codes by one gather from a 65,536-entry table indexed by the float16 "
      f"bits ({machine}), {result['params'] / 1e6:.2f}M parameters in 8 leaves of 1024 "
      "columns; time over the peer's step, median [quartiles].",
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
  name = f"low_bit_peer_jax{version_suffix()}"
  (out / f"{name}.json").write_text(json.dumps({"device": machine, **result}, indent=2))
  (out / f"{name}.md").write_text(text)


if __name__ == "__main__":
  main()
