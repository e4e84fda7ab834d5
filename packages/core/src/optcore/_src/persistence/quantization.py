"""Block-wise quantization of optimizer state: the maps, `QuantizedArray`, and the functions
that make one from a float array and read it back.

The method is Dettmers et al. 2022 ("8-bit Optimizers via Block-wise Quantization"): a tensor
is cut into blocks of ``block_size`` consecutive elements (row-major, as the flattened tensor),
each block is divided by its largest absolute value (its scale), and each quotient, in
[-1, 1], is stored as the index of the nearest value of a fixed map of ``2**bits`` values.

The maps are the published ones:

- 8 bits: bitsandbytes' dynamic map (``create_dynamic_map``: a dynamic exponent, up to 7
  bits, and a fraction in the bits left), signed for a first moment, unsigned for a second;
- 4 bits: torchao's (after Li et al. 2023, "Memory Efficient Optimizers with 4-bit
  States"): the dynamic map with 3 exponent bits for a first moment, and the 16 linear values
  1/16 ... 1 (no zero) for a second.
"""

from __future__ import annotations

import functools
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from optcore._src.ground import stored
from optcore._src.persistence import placement

#: The default block sizes: bitsandbytes' 8-bit optimizers and torchao's 4-bit ones.
DEFAULT_BLOCK_SIZE = {8: 256, 4: 128}


def _linspace_f32(start: float, stop: float, num: int) -> np.ndarray:
  """``num`` float32 values from ``start`` to ``stop`` as PyTorch's CPU ``linspace`` gives
  them (the maps are defined by it): the step in float32, the first half ``start + step * i``
  and the second ``stop - step * (num - 1 - i)``, each rounded once (a fused multiply-add)."""
  start32, stop32 = np.float32(start), np.float32(stop)
  step = np.float64(np.float32((stop32 - start32) / np.float32(num - 1)))
  index = np.arange(num, dtype=np.float64)
  up = np.float64(start32) + step * index
  down = np.float64(stop32) - step * (num - 1 - index)
  return np.where(index < num // 2, up, down).astype(np.float32)


def dynamic_map(signed: bool, max_exponent_bits: int, total_bits: int) -> np.ndarray:
  """The dynamic quantization map of Dettmers (2016, 2022), sorted, float32.

  For each exponent ``e`` from ``-(max_exponent_bits - 1)`` to 0, the means of consecutive
  points of a linear grid on [0.1, 1] scaled by ``10**e``; the grids grow finer as the
  exponent grows (fewer bits for the exponent leave more for the fraction). Then 0 and 1.
  Signed maps hold each value with both signs.

  Args:
    signed: both signs (a first moment) or only positive values (a second moment).
    max_exponent_bits: 7 for bitsandbytes' 8-bit map, 3 for torchao's 4-bit one.
    total_bits: the code's width.

  Returns:
    The ``2**total_bits`` values, ascending, as float32.

  Example:
    >>> from optcore._src.persistence.quantization import dynamic_map
    >>> m = dynamic_map(True, 3, 4)
    >>> len(m), round(float(m[0]), 6), float(m[-1])
    (16, -0.8875, 1.0)
  """
  values: list[np.ndarray] = []
  sign_bits = 1
  fraction_bits = total_bits - sign_bits - max_exponent_bits
  for i in range(max_exponent_bits):
    items = 2 ** (i + fraction_bits) + 1 if signed else 2 ** (i + fraction_bits + 1) + 1
    grid = _linspace_f32(0.1, 1.0, items)
    means = (grid[:-1] + grid[1:]) / np.float32(2.0)
    scale = np.float32(10.0 ** (-(max_exponent_bits - 1) + i))
    values.append(scale * means)
    if signed:
      values.append(-scale * means)
  extra = 2**fraction_bits - 1
  if extra > 0:
    grid = _linspace_f32(0.1, 1.0, extra + 1)
    means = (grid[:-1] + grid[1:]) / np.float32(2.0)
    scale = np.float32(10.0 ** (-(max_exponent_bits - 1) + max_exponent_bits - 1))
    values.append(scale * means)
    if signed:
      values.append(-scale * means)
  values.append(np.array([0.0, 1.0], np.float32))
  out = np.sort(np.concatenate(values).astype(np.float32))
  if len(out) != 2**total_bits:
    raise AssertionError(f"dynamic map of {len(out)} values for {total_bits} bits")
  return out


@functools.cache
def quantization_map(bits: int, signed: bool) -> np.ndarray:
  """The map a state of ``bits`` bits uses: see the module's docstring.

  Args:
    bits: 8 or 4.
    signed: a first moment (signed values) or a second (non-negative).

  Returns:
    The ``2**bits`` values, ascending, float32 (read-only).
  """
  if bits == 8:
    values = dynamic_map(signed, 7, 8)
  elif bits == 4:
    values = dynamic_map(True, 3, 4) if signed else _linspace_f32(0.0, 1.0, 17)[1:]
  else:
    raise ValueError(f"quantization: bits must be 8 or 4, got bits={bits!r}")
  values.setflags(write=False)
  return values


def _midpoints(values: np.ndarray) -> np.ndarray:
  return ((values[:-1] + values[1:]) / np.float32(2.0)).astype(np.float32)


#: The ways a normalized value becomes a code: "nearest", the nearest map value (the published
#: method: bitsandbytes' CUDA kernels, torchao); "bitsandbytes_cpu", as bitsandbytes' CPU
#: backend rounds: through a table of 65,536 evenly spaced values on [-1, 1], the nearest code
#: of the nearest table entry (coarser near zero and at the midpoints).
ROUNDINGS = ("nearest", "bitsandbytes_cpu")

_TABLE_SIZE = 65536


@functools.cache
def _cpu_table(bits: int, signed: bool) -> np.ndarray:
  """bitsandbytes' CPU lookup table for a map: for each of 65,536 evenly spaced values on
  [-1, 1], the first code whose upper midpoint is not below it."""
  grid = np.float32(-1.0) + (
    np.float32(2.0) * np.arange(_TABLE_SIZE, dtype=np.float32)
  ) / np.float32(_TABLE_SIZE - 1)
  table = np.searchsorted(_midpoints(quantization_map(bits, signed)), grid, side="left")
  return table.astype(np.uint8)


@functools.cache
def _nearest_table(bits: int, signed: bool) -> np.ndarray:
  """What the nearest code is found from without a search: one uint32 for each of the 65,536
  patterns of a float32's top 16 bits, from which a value's code follows with its low 16 bits
  alone.

  The values sharing their top 16 bits run from the one whose low bits are 0 (the nearest
  zero) outward, and every published map puts at most one midpoint among them, at some low
  bits ``L``: the code is ``base + (x >= threshold)``, with ``x`` the low bits (their
  complement for a negative value, which grows toward zero as they shrink). An entry is
  ``(base + 1) * 2**17 - threshold``, so that ``(entry + x) >> 17`` is the code: the
  threshold is at most ``2**16`` (where nothing splits: above every ``x``; past the finite
  values, the count at the interval's start, never more), so the sum carries into bit 17
  exactly where ``x`` reaches it. One use of the entry: XLA writes out a gather whose value
  is used twice."""
  midpoints = _midpoints(quantization_map(bits, signed))
  top = np.arange(65536, dtype=np.uint32)
  first = (top << np.uint32(16)).view(np.float32)
  last = ((top << np.uint32(16)) | np.uint32(0xFFFF)).view(np.float32)
  with np.errstate(invalid="ignore"):
    at_first = np.searchsorted(midpoints, first, side="right").astype(np.int64)
    at_last = np.searchsorted(midpoints, last, side="right").astype(np.int64)
  finite = (top & 0x7F80) != 0x7F80  # 0x7F80 and 0xFF80 begin the infinities and NaNs
  if np.abs(at_last - at_first)[finite].max() > 1:
    raise AssertionError(f"the {bits}-bit map has two midpoints between two bfloat16 values")
  split = finite & (at_first != at_last)
  negative = top >= 0x8000
  # the split's midpoint: the one between the interval's two ends, and its low 16 bits
  index = np.clip(np.minimum(at_first, at_last), 0, len(midpoints) - 1)
  low = (midpoints[index].view(np.uint32) & np.uint32(0xFFFF)).astype(np.int64)
  # a positive value's code steps up at ``x = low`` (a value at the midpoint rounds up); a
  # negative one's at its low bits ``<= low``, ``x = 0xFFFF - low`` complemented
  threshold = np.where(split, np.where(negative, 0xFFFF - low, low), 1 << 16)
  base = np.where(split, np.minimum(at_first, at_last), at_first)
  return ((base + 1) * (1 << 17) - threshold).astype(np.uint32)


@functools.cache
def _negative_splits(bits: int, signed: bool) -> bool:
  """Whether a midpoint splits some negative interval of `_nearest_table` (not in an unsigned
  map, whose negative values all take code 0): then a negative value's low bits are
  complemented before the comparison."""
  return bool(np.any(_nearest_table(bits, signed)[0x8000:] % (1 << 17) != 1 << 16))


def _codes(normalized: jax.Array, bits: int, signed: bool, rounding: str) -> jax.Array:
  if rounding == "bitsandbytes_cpu":
    clipped = jnp.clip(normalized, -1.0, 1.0)
    index = ((clipped + 1.0) * 0.5 * np.float32(_TABLE_SIZE - 1) + 0.5).astype(jnp.uint16)
    return _lookup(jnp.asarray(_cpu_table(bits, signed)), index)
  # The nearest code is the number of midpoints at or below the value (a tie rounds up): one
  # table read at the value's top 16 bits gives the count up to its bfloat16 truncation and
  # where in the low bits the one midpoint past it lies (`_nearest_table`). One gather and a
  # few integer operations an element, all fused (issue 65: a count finished by comparisons
  # with two more gathers ran x1.18 a one-gather peer's step).
  bits32 = jax.lax.bitcast_convert_type(normalized.astype(jnp.float32), jnp.uint32)
  entry = _lookup(jnp.asarray(_nearest_table(bits, signed)), bits32 >> 16)
  x = bits32 & 0xFFFF
  if _negative_splits(bits, signed):  # else a negative value's code is its interval's
    x = x ^ ((bits32 >> 31) * jnp.uint32(0xFFFF))
  return ((entry + x) >> 17).astype(jnp.uint8)


def _lookup(table: jax.Array, index: jax.Array) -> jax.Array:
  """``table[index]`` for indices in range by construction (no bounds handling compiled)."""
  return table.at[index.astype(jnp.int32)].get(mode="promise_in_bounds")


def layout(shape: tuple[int, ...], bits: int, block_size: int) -> tuple[tuple[int, ...], bool]:
  """The shape of the scales of a tensor of ``shape``, and whether its blocks lie along its
  last dimension.

  When the last dimension is a multiple of ``block_size`` the blocks lie along it, so codes
  of shape ``shape[:-1] + (shape[-1] // block_size, bytes per block)`` keep every leading
  dimension (and its sharding); otherwise the flattened tensor is cut into
  ``ceil(size / block_size)`` blocks, the last one padded. The blocks are the same row-major
  runs of ``block_size`` elements either way.
  """
  if shape and shape[-1] % block_size == 0:
    return (*shape[:-1], shape[-1] // block_size), True
  return (max(1, math.ceil(math.prod(shape) / block_size)),), False


@jax.tree_util.register_pytree_with_keys_class
class QuantizedArray:
  """A float array stored block-wise quantized: ``codes`` and one ``scale`` per block.

  Attributes:
    codes: uint8, the code of each element (two 4-bit codes a byte at 4 bits, the even
      element in the high half), shaped ``scales.shape + (block bytes,)``.
    scales: float32, each block's largest absolute value (at 4 bits at least 1e-12, as
      torchao keeps it).
    shape: the float array's shape.
    dtype: the float array's dtype (what `dequantize` gives).
    bits: 8 or 4.
    signed: which map (see `quantization_map`).
    block_size: elements a block.
    rounding: how its codes were chosen (`ROUNDINGS`), and will be again.

  Example:
    >>> import jax.numpy as jnp
    >>> from optcore import QuantizedArray
    >>> q = QuantizedArray.quantize(jnp.linspace(-1.0, 1.0, 512), bits=8, signed=True)
    >>> q.codes.shape, q.scales.shape, q.nbytes
    ((2, 256), (2,), 520)
    >>> float(jnp.max(jnp.abs(q.dequantize() - jnp.linspace(-1.0, 1.0, 512)))) < 0.01
    True
  """

  def __init__(
    self,
    codes: Any,
    scales: Any,
    *,
    shape: tuple[int, ...],
    dtype: Any,
    bits: int,
    signed: bool,
    block_size: int,
    rounding: str = "nearest",
  ):
    self.codes = codes
    self.scales = scales
    self.shape = tuple(shape)
    self.dtype = jnp.dtype(dtype)
    self.bits = bits
    self.signed = signed
    self.block_size = block_size
    self.rounding = rounding

  #: The format, static in a pytree (its aux data): what two arrays must share to be one type.
  FORMAT: ClassVar[tuple[str, ...]] = ("shape", "dtype", "bits", "signed", "block_size", "rounding")

  def tree_flatten_with_keys(self) -> tuple:
    keys = (jax.tree_util.GetAttrKey("codes"), jax.tree_util.GetAttrKey("scales"))
    aux = tuple(getattr(self, n) for n in self.FORMAT)
    aux = (*aux[:1], self.dtype.name, *aux[2:])  # a hashable dtype name
    return tuple(zip(keys, (self.codes, self.scales), strict=True)), aux

  @classmethod
  def tree_unflatten(cls, aux: tuple, children: Any) -> QuantizedArray:
    return cls(*children, **dict(zip(cls.FORMAT, aux, strict=True)))

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  @property
  def nbytes(self) -> int:
    """Bytes held: codes and scales."""
    return sum(
      math.prod(np.shape(x)) * jnp.dtype(x.dtype).itemsize for x in (self.codes, self.scales)
    )

  @classmethod
  def quantize(
    cls,
    x: Any,
    *,
    bits: int = 8,
    signed: bool = True,
    block_size: int | None = None,
    rounding: str = "nearest",
  ) -> QuantizedArray:
    """``x`` quantized block-wise: each block divided by its largest absolute value, each
    quotient stored as the index of the nearest map value (a tie rounds up).

    Args:
      x: a real floating array.
      bits: 8 or 4.
      signed: the signed map (a first moment) or the unsigned one (a second moment;
        negative values are clipped to the map's smallest).
      block_size: elements a block; None for 256 at 8 bits, 128 at 4 (an even number at
        4 bits).
      rounding: "nearest" (the published method), or "bitsandbytes_cpu" (its CPU
        backend's table, to reproduce a run of it bitwise): see `ROUNDINGS`.

    Returns:
      The `QuantizedArray`.

    Raises:
      ValueError: ``bits`` is not 8 or 4, ``block_size`` is not a positive int (even at
        4 bits), or ``rounding`` is not one of `ROUNDINGS`.
    """
    block_size = check_block_size(bits, block_size)
    check_rounding(rounding)
    x = jnp.asarray(x)
    scales_shape, rowwise = layout(x.shape, bits, block_size)
    values = x.astype(jnp.float32)
    if rowwise:
      blocks = values.reshape(*scales_shape, block_size)
    else:
      flat = values.reshape(-1)
      pad = scales_shape[0] * block_size - flat.size
      blocks = jnp.pad(flat, (0, pad)).reshape(*scales_shape, block_size)
    fmt = {"bits": bits, "signed": signed, "block_size": block_size, "rounding": rounding}
    return cls(
      *_quantized_blocks(blocks, bits, signed, rounding), shape=x.shape, dtype=x.dtype, **fmt
    )

  @property
  def block_shape(self) -> tuple[int, ...] | None:
    """The shape of its blocks' values, ``scales.shape + (block_size,)``, where the blocks lie
    along the last dimension (a reshape of the values away); else None."""
    scales_shape, rowwise = layout(self.shape, self.bits, self.block_size)
    return (*scales_shape, self.block_size) if rowwise else None

  def dequantize_blocks(self) -> jax.Array:
    """The float values in `block_shape`, in ``dtype`` (blocks along the last dimension)."""
    (codes, scales), _ = placement.to_device((self.codes, self.scales))
    if self.bits == 4:
      codes = jnp.stack([codes >> 4, codes & 0xF], axis=-1).reshape(*codes.shape[:-1], -1)
    table = jnp.asarray(quantization_map(self.bits, self.signed))
    return (_lookup(table, codes) * scales[..., None]).astype(self.dtype)

  def requantize_blocks(self, blocks: Any) -> QuantizedArray:
    """Values in `block_shape` (blocks along the last dimension) quantized in this array's
    format: `requantize` of their reshape, without it."""
    values = jnp.asarray(blocks).astype(jnp.float32)
    codes, scales = _quantized_blocks(values, self.bits, self.signed, self.rounding)
    fmt = {n: getattr(self, n) for n in self.FORMAT}
    return QuantizedArray(codes, scales, **fmt)

  def requantize(self, x: Any) -> QuantizedArray:
    """``x`` (of this array's shape) quantized in this array's format."""
    return self.quantize(
      x, bits=self.bits, signed=self.signed, block_size=self.block_size, rounding=self.rounding
    )

  def dequantize(self) -> jax.Array:
    """The float values back: each code's map value times its block's scale, in ``dtype``, on
    the device (codes kept in host memory are read there: the map is a device constant)."""
    blocks = self.dequantize_blocks()
    if self.block_shape is not None:
      return blocks.reshape(self.shape)
    return blocks.reshape(-1)[: self.size].reshape(self.shape)

  def __repr__(self) -> str:
    return (
      f"QuantizedArray(shape={self.shape}, dtype={self.dtype.name}, bits={self.bits}, "
      f"signed={self.signed}, block_size={self.block_size})"
    )


def _quantized_blocks(
  blocks: jax.Array, bits: int, signed: bool, rounding: str
) -> tuple[jax.Array, jax.Array]:
  """The codes and scales of float32 ``blocks`` (the last axis a block)."""
  scales = jnp.max(jnp.abs(blocks), axis=-1)
  if bits == 4:  # torchao's floor on a block's scale (an all-zero block)
    scales = jnp.maximum(scales, jnp.float32(1e-12))
  if rounding == "bitsandbytes_cpu":  # its CPU kernel multiplies by the reciprocal
    normalized = blocks * jnp.where(scales > 0, 1.0 / scales, 0.0)[..., None]
  else:
    normalized = blocks / jnp.where(scales > 0, scales, jnp.float32(1.0))[..., None]
  codes = _codes(normalized, bits, signed, rounding)
  if rounding == "bitsandbytes_cpu":  # an all-zero block: code 0 (scale 0 reads 0 back)
    codes = jnp.where(scales[..., None] > 0, codes, jnp.uint8(0))
  if bits == 4:
    codes = (codes[..., 0::2] << 4) | codes[..., 1::2]
  return codes, scales


def check_block_size(bits: int, block_size: int | None) -> int:
  """``block_size``, or the default for ``bits``; ValueError for a bad one."""
  if bits not in DEFAULT_BLOCK_SIZE:
    raise ValueError(f"low_bit_state: bits must be 8 or 4, got bits={bits!r}")
  if block_size is None:
    return DEFAULT_BLOCK_SIZE[bits]
  if (
    not isinstance(block_size, (int, np.integer))
    or isinstance(block_size, bool)
    or block_size < 2
    or (bits == 4 and block_size % 2)
  ):
    raise ValueError(
      f"low_bit_state: block_size must be an int of at least 2 (even at 4 bits, two codes a "
      f"byte), got block_size={block_size!r}; the published sizes are 256 at 8 bits and 128 "
      "at 4."
    )
  return int(block_size)


def check_rounding(rounding: str) -> str:
  """``rounding``, or ValueError naming `ROUNDINGS`."""
  if rounding not in ROUNDINGS:
    raise ValueError(f"low_bit_state: rounding must be one of {ROUNDINGS}, got {rounding!r}")
  return rounding


def is_quantized(x: Any) -> bool:
  """Whether ``x`` is a `QuantizedArray` (an ``is_leaf`` for tree functions)."""
  return isinstance(x, QuantizedArray)


def dequantize_tree(tree: Any) -> Any:
  """``tree`` with each `QuantizedArray` (any stored leaf) replaced by its float values."""
  return stored.values(tree)


def requantize_like(values: Any, like: Any) -> Any:
  """``values`` (``like``'s structure, float arrays where ``like`` has a `QuantizedArray`)
  with each of those quantized in ``like``'s format there."""
  return stored.stored_like(values, like)


# A QuantizedArray declares what every walk of a state must know of it, once: its values,
# its format for new values, and that its codes' last dimension is one block (whole on a
# device); its scales' is not.
stored.register(
  QuantizedArray,
  stored.StoredFormat(
    values=lambda q: q.dequantize(),
    like=lambda q, v: q.requantize(v),
    whole_rows=(True, False),
  ),
)


def dequantize_state(tree: Any) -> Any:
  """Any optimizer state (an `OptimizerState`, an ``as_optax()`` state, a face's), or an
  optimizer, with each `QuantizedArray` (what `low_bit_state` stores) replaced by its float
  values: the state a float optimizer would hold, for reading, logging or a ``transplant``.

  Args:
    tree: a pytree.

  Returns:
    The same pytree, each `QuantizedArray` a float array of its shape and dtype.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.low_bit_state(optcore.adam(0.1)).create({'w': jnp.ones(4096)})
    >>> opt = opt.apply_gradient({'w': jnp.full(4096, 0.5)})
    >>> mu = optcore.dequantize_state(opt.state).param_states.inner[0].mu['w']
    >>> mu.dtype, round(float(mu[0]), 6)
    (dtype('float32'), 0.05)
  """
  return dequantize_tree(tree)
