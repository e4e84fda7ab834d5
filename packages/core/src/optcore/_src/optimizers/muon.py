"""optcore.contrib.muon: optax's Muon, its matrix dimensions from logical axes, plus what large
trainers run beside it: the Polar Express coefficients (``ns_coeffs="polar_express"``) and
Newton-Schulz on owner devices (``ns_sharding=``, which ``create_sharded`` sets under ZeRO-1).

**Polar Express** (Amsel, Persson, Musco, Gower 2025, arXiv:2505.16932, Algorithm 1 and the
authors' ``basic.py``): a different quintic for each Newton-Schulz step, the first seven of
their table divided by their safety factor 1.01 (``a / 1.01, b / 1.01**3, c / 1.01**5``), the
eighth (``1.875, -1.25, 0.375``) as it is; ``ns_steps`` takes the first rows, the last repeated
beyond eight. Their normalisation comes with them: ``X / (||X||_F * 1.01 + 1e-7)``, in place of
optax's ``X / (||X||_F + eps)`` (``eps`` still goes to the Adam branch). Their code casts to
bfloat16 for speed; optcore computes in the momentum's dtype (float32 for float32 gradients).

**Owner-compute.** With the state split over a data axis (ZeRO-1) and nothing else said, the
compiler partitions Newton-Schulz inside each of its matrix products: eight 256x256 matrices
on eight devices compile to 17 collectives (128 as eight leaves) moving 16 times the bytes of
AdamW's step. ``ns_sharding=NamedSharding(mesh, P('data'))`` instead stacks the matrices of
one shape (every leaf, every layer of a stack), pads the stack to a multiple of the axis'
devices and places it split along its first dimension: each device orthogonalises whole
matrices of its own, with one device's numbers, and the results are gathered with the
parameters. `OptimizerDef.create_sharded` with ``state_axis=`` sets it; ``ns_sharding=False``
keeps the compiler's partitioning.

Everything else is optax's ``contrib.muon``: its names, defaults, state (`optax.contrib.
MuonState` in the Muon branch, AdamW beside it) and, where neither of the above is asked for,
its own transformation (bit for bit).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec
from optax import contrib as optax_contrib

from optcore._src.axes.matrix_axes import check_rules_with_axes, muon_dimension_numbers_fn

PyTree = Any
Dims = optax_contrib.MuonDimensionNumbers
# optax's muon as it was at import, as every optcore alias holds the factory it wrapped: a later
# rebinding of optax.contrib.muon (optax's own suite run against optcore) must not reach here.
_OPTAX_MUON = optax_contrib.muon

#: The authors' table (``basic.py``), before their safety factor.
_POLAR_EXPRESS_RAW = (
  (8.28721201814563, -23.595886519098837, 17.300387312530933),
  (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
  (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
  (3.3184196573706015, -2.488488024314874, 0.51004894012372),
  (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
  (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
  (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
  (1.875, -1.25, 0.375),
)
#: Their safety factor, on every row but the last, and on the norm the input is divided by.
POLAR_EXPRESS_SAFETY = 1.01
#: Their normalisation's additive term (``||X|| * 1.01 + 1e-7``).
POLAR_EXPRESS_EPS = 1e-7
POLAR_EXPRESS: tuple[tuple[float, float, float], ...] = (
  *(
    (a / POLAR_EXPRESS_SAFETY, b / POLAR_EXPRESS_SAFETY**3, c / POLAR_EXPRESS_SAFETY**5)
    for a, b, c in _POLAR_EXPRESS_RAW[:-1]
  ),
  _POLAR_EXPRESS_RAW[-1],
)
#: The preconditionings an owner's Newton-Schulz computes (optax's first-step rescalings, aol
#: and schatten, stay with optax's partitioned program).
OWNER_PRECONDITIONINGS = ("frobenius", "spectral")


def polar_express_coefficients(steps: int) -> tuple[tuple[float, float, float], ...]:
  """The Polar Express quintics of ``steps`` Newton-Schulz steps: the first rows of the
  authors' table (their safety factor applied), its last row repeated beyond it.

  Args:
    steps: the number of steps, a positive integer.

  Returns:
    ``steps`` rows ``(a, b, c)``: ``X <- a X + b (X X^T) X + c (X X^T)^2 X``.

  Raises:
    ValueError: ``steps`` is not a positive integer.

  Example:
    >>> from optcore._src.optimizers.muon import polar_express_coefficients
    >>> rows = polar_express_coefficients(9)
    >>> len(rows), rows[-1], round(rows[0][0], 4)
    (9, (1.875, -1.25, 0.375), 8.2052)
  """
  if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
    raise ValueError(f"polar_express: ns_steps must be a positive integer, got {steps!r}")
  return POLAR_EXPRESS[:steps] + (POLAR_EXPRESS[-1],) * max(0, steps - len(POLAR_EXPRESS))


def _matrix_axes(ndim: int, dims: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """A leaf's reduction and output dimensions (``MuonDimensionNumbers``), non-negative."""
  as_tuple = lambda axes: (axes,) if isinstance(axes, int) else tuple(axes)
  reduction = tuple(ax % ndim for ax in as_tuple(dims.reduction_axis))
  return reduction, tuple(ax % ndim for ax in as_tuple(dims.output_axis))


def _oriented(x: jax.Array, dims: Any) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
  """``x`` as a stack ``(batch, rows, cols)`` of its matrices, each with no more rows than
  columns (Newton-Schulz's cheaper side, optax's and the authors' choice), and the inverse."""
  if x.ndim < 2:
    raise ValueError(f"muon: a Muon parameter must have rank >= 2, got shape {x.shape}")
  reduction, output = _matrix_axes(x.ndim, dims)
  if set(reduction) & set(output):
    raise ValueError(
      f"muon: reduction axes {reduction} and output axes {output} overlap (shape {x.shape})"
    )
  batch = tuple(sorted(set(range(x.ndim)) - set(reduction) - set(output)))
  order = batch + reduction + output
  inverse = tuple(sorted(range(x.ndim), key=lambda i: order[i]))
  sizes = lambda axes: tuple(x.shape[ax] for ax in axes)
  flat = tuple(math.prod(sizes(axes)) for axes in (batch, reduction, output))
  unflat = sizes(batch) + sizes(reduction) + sizes(output)
  tall = flat[1] > flat[2]
  stack = x.transpose(order).reshape(flat)
  if tall:
    stack = jnp.swapaxes(stack, 1, 2)

  def back(y: jax.Array) -> jax.Array:
    if tall:
      y = jnp.swapaxes(y, 1, 2)
    return y.reshape(unflat).transpose(inverse)

  return stack, back


def _newton_schulz(
  x: jax.Array, coeffs: jax.Array, steps: int, preconditioning: str, eps: Any, polar: bool
) -> jax.Array:
  """One matrix (rows <= cols), orthogonalised: optax's steps in optax's order of operations
  (``A = X X^T; B = b A + c A A; X = a X + B X``), the authors' normalisation for Polar
  Express."""
  if polar:
    x = x / (jnp.linalg.norm(x, ord="fro") * POLAR_EXPRESS_SAFETY + POLAR_EXPRESS_EPS)
  elif preconditioning == "frobenius":
    x = x / (jnp.linalg.norm(x, ord="fro") + eps)
  else:  # spectral
    x = x / (jnp.linalg.norm(x, ord=2) + eps)
  coeffs = coeffs.astype(x.dtype)

  def step(x: jax.Array, row: jax.Array) -> jax.Array:
    a = x @ x.T
    b = row[1] * a + row[2] * a @ a
    return row[0] * x + b @ x

  if coeffs.ndim == 1:
    for _ in range(steps):
      x = step(x, coeffs)
    return x
  x, _ = jax.lax.scan(lambda x, row: (step(x, row), None), x, coeffs)
  return x


def _devices_along(placement: NamedSharding) -> int:
  axes = placement.spec[0] if len(placement.spec) else None
  names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return math.prod(placement.mesh.shape[name] for name in names)


def _orthogonalize_leaves(
  stacks: list[jax.Array], one: Callable[[jax.Array], jax.Array], placement: Any
) -> list[jax.Array]:
  """Each stack of matrices orthogonalised: one at a time as optax does (``placement`` None),
  or the stacks of one shape and dtype together, split over ``placement``'s first axis so that
  each device orthogonalises whole matrices of its own."""
  if placement is None:
    return [jax.vmap(one)(s) for s in stacks]
  out: list[Any] = [None] * len(stacks)
  groups: dict[tuple, list[int]] = {}
  for i, s in enumerate(stacks):
    groups.setdefault((s.shape[1:], s.dtype), []).append(i)
  owners = _devices_along(placement)
  # a step runs an optimizer's maths with the mesh's axes Auto (`sharding.with_auto_axes`):
  # the owners are named on that mesh, whatever types the placement's mesh gives its axes
  mesh = placement.mesh
  auto = jax.sharding.Mesh(
    mesh.devices, mesh.axis_names, axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names)
  )
  where = NamedSharding(auto, PartitionSpec(placement.spec[0], None, None))
  for members in groups.values():
    sizes = [stacks[i].shape[0] for i in members]
    joined = jnp.concatenate([stacks[i] for i in members], axis=0)
    pad = -joined.shape[0] % owners  # zero matrices: Newton-Schulz leaves them zero
    if pad:
      joined = jnp.concatenate([joined, jnp.zeros((pad, *joined.shape[1:]), joined.dtype)])
    pin = lambda x: jax.lax.with_sharding_constraint(x, where)
    done = pin(jax.vmap(one)(pin(joined)))
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    for i, start, size in zip(members, starts, sizes, strict=True):
      out[i] = done[start : start + size]
  return out


def scale_by_muon(
  ns_coeffs: Any = (3.4445, -4.7750, 2.0315),
  ns_steps: int = 5,
  beta: Any = 0.95,
  eps: Any = 1e-8,
  mu_dtype: Any = None,
  *,
  nesterov: bool = True,
  adaptive: bool = False,
  preconditioning: str = "frobenius",
  weight_dimension_numbers: Any = None,
  polar: bool = False,
  placement: NamedSharding | None = None,
) -> optax.GradientTransformation:
  """optax's ``scale_by_muon`` (its moments, bias corrections and state, `optax.contrib.
  MuonState`), its orthogonalisation optcore's: the Polar Express normalisation (``polar``)
  and owner devices (``placement``)."""
  mu_dtype = None if mu_dtype is None else jax.dtypes.canonicalize_dtype(mu_dtype)

  def init_fn(params: PyTree) -> optax_contrib.MuonState:
    coeffs = jnp.asarray(ns_coeffs)
    if coeffs.ndim == 2:
      coeffs = coeffs[-ns_steps:]
    mu = optax.tree.zeros_like(params, dtype=mu_dtype)
    return optax_contrib.MuonState(count=jnp.zeros([], jnp.int32), mu=mu, ns_coeffs=coeffs)

  def update_fn(updates: PyTree, state: Any, params: PyTree = None) -> tuple[PyTree, Any]:
    del params
    dims = weight_dimension_numbers(updates)
    mu = optax.tree.update_moment(updates, state.mu, beta, 1)
    count = optax.safe_increment(state.count)
    if nesterov:
      mu_hat = jax.tree.map(
        lambda m, g: beta * m + (1 - beta) * g,
        optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
        optax.tree.bias_correction(updates, beta, count),
      )
    else:
      mu_hat = optax.tree.bias_correction(mu, beta, count)
    is_dims = lambda x: isinstance(x, Dims)
    dim_leaves, treedef = jax.tree.flatten(dims, is_leaf=is_dims)
    hats = treedef.flatten_up_to(mu_hat)
    oriented = [_oriented(x, d) for x, d in zip(hats, dim_leaves, strict=True)]
    one = functools.partial(
      _newton_schulz,
      coeffs=state.ns_coeffs,
      steps=ns_steps,
      preconditioning=preconditioning,
      eps=eps,
      polar=polar,
    )
    done = _orthogonalize_leaves([s for s, _ in oriented], one, placement)
    new = treedef.unflatten([back(y) for (_, back), y in zip(oriented, done, strict=True)])
    if adaptive:  # scaled by the dual norm of the momentum (optax's adaptive)
      new = jax.tree.map(lambda x, y: jnp.sum(x.conj() * y) * y, mu_hat, new)
    mu = optax.tree.cast(mu, mu_dtype)
    return new, optax_contrib.MuonState(count=count, mu=mu, ns_coeffs=state.ns_coeffs)

  return optax.GradientTransformation(init_fn, update_fn)


def _scale_by_shape(dims_fn: Callable[[PyTree], PyTree], consistent_rms: Any):
  """optax's width scaling of each orthogonalised matrix (``sqrt(max(1, fan_out / fan_in))``,
  or ``sqrt(max(fan_in, fan_out)) * consistent_rms``)."""

  def scale(update: jax.Array, dims: Any) -> jax.Array:
    reduction, output = _matrix_axes(update.ndim, dims)
    fan_in = math.prod(update.shape[ax] for ax in reduction)
    fan_out = math.prod(update.shape[ax] for ax in output)
    if consistent_rms is not None:
      return jnp.sqrt(jnp.maximum(fan_in, fan_out)) * consistent_rms * update
    return jnp.sqrt(jnp.maximum(1, fan_out / fan_in)) * update

  def update_fn(updates: PyTree, state: Any, params: PyTree = None) -> tuple[PyTree, Any]:
    del params
    is_dims = lambda x: isinstance(x, Dims)
    return jax.tree.map(scale, updates, dims_fn(updates), is_leaf=is_dims), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def _own_muon(
  learning_rate: Any,
  coeffs: Any,
  ns_steps: int,
  beta: Any,
  eps: Any,
  weight_decay: Any,
  weight_decay_mask: Any,
  mu_dtype: Any,
  dims: Any,
  options: Mapping[str, Any],
) -> optax.GradientTransformation:
  """optax's muon composition (a Muon branch and AdamW, labelled by the dimension numbers),
  with optcore's `scale_by_muon`."""
  leaf = lambda x: x is None or isinstance(x, (Dims, optax.MaskedNode))
  if dims is None:  # optax's rule: 2-D parameters are matrices, one Dims() for them all
    dims_of: Callable[[PyTree], PyTree] = lambda _: Dims()

    def labels(params: PyTree) -> PyTree:
      return jax.tree.map(lambda x: "muon" if x.ndim == 2 else "adam", params)

  else:
    dims_of = dims if callable(dims) else (lambda _: dims)

    def labels(params: PyTree) -> PyTree:  # dimension numbers first: they may be a prefix
      return jax.tree.map(
        lambda d, x: jax.tree.map(lambda _: "adam" if d is None else "muon", x),
        dims_of(params),
        params,
        is_leaf=leaf,
      )

  def muon_dims(params: PyTree) -> PyTree:  # the Muon branch sees the Adam leaves masked
    mask = jax.tree.map(lambda label: label == "muon", labels(params))
    return jax.tree.map(
      lambda d, m: jax.tree.map(lambda on: d if on else optax.MaskedNode(), m),
      dims_of(params),
      mask,
      is_leaf=leaf,
    )

  nesterov = options["nesterov"]
  adam_lr = options["adam_learning_rate"]
  muon_branch = optax.chain(
    scale_by_muon(
      coeffs,
      ns_steps,
      beta,
      eps,
      mu_dtype,
      nesterov=nesterov,
      adaptive=options["adaptive"],
      preconditioning=options["preconditioning"],
      weight_dimension_numbers=muon_dims,
      polar=options["polar"],
      placement=options["placement"],
    ),
    _scale_by_shape(muon_dims, options["consistent_rms"]),
    optax.add_decayed_weights(weight_decay, weight_decay_mask),
    optax.scale_by_learning_rate(learning_rate),
  )
  adam = optax.adamw(
    learning_rate=learning_rate if adam_lr is None else adam_lr,
    b1=options["adam_b1"],
    b2=options["adam_b2"],
    eps=eps,
    eps_root=options["adam_eps_root"],
    weight_decay=options["adam_weight_decay"],
    mu_dtype=mu_dtype,
    nesterov=nesterov,
  )
  return optax.transforms.partition({"muon": muon_branch, "adam": adam}, labels)


def muon(
  learning_rate: optax.ScalarOrSchedule,
  ns_coeffs: Any = (3.4445, -4.7750, 2.0315),
  ns_steps: int = 5,
  beta: float = 0.95,
  eps: float = 1e-8,
  weight_decay: float = 0.0,
  weight_decay_mask: Any = None,
  mu_dtype: Any = None,
  *,
  nesterov: bool = True,
  adaptive: bool = False,
  preconditioning: Literal["frobenius", "spectral", "aol", "schatten"] = "frobenius",
  adam_b1: float = 0.9,
  adam_b2: float = 0.999,
  adam_eps_root: float = 0.0,
  adam_weight_decay: float = 0.0,
  adam_learning_rate: optax.ScalarOrSchedule | None = None,
  muon_weight_dimension_numbers: Any = None,
  consistent_rms: float | None = None,
  param_logical_axes: PyTree = None,
  matrix_rules: Mapping[str, str] | None = None,
  ns_sharding: NamedSharding | bool | None = None,
) -> optax.GradientTransformation:
  """Muon (optax's ``contrib.muon``), its matrix dimensions from logical axes, the Polar
  Express coefficients (``ns_coeffs="polar_express"``) and Newton-Schulz on owner devices.

  Every argument up to ``consistent_rms`` is optax's, with its meaning and default.

  Args:
    learning_rate: the rate, a number or a schedule.
    ns_coeffs: ``(a, b, c)``, a table of rows, or a preset: optax's ``"standard"`` and
      ``"dion"``, or ``"polar_express"`` (the authors' table and normalisation, see the
      module's docs; ``ns_steps`` takes its first rows).
    ns_steps: Newton-Schulz steps.
    beta: the momentum's decay.
    eps: optax's: added to the norm before Newton-Schulz (not with Polar Express, which
      brings its own) and Adam's epsilon.
    weight_decay: decoupled weight decay of the Muon branch (times the rate).
    weight_decay_mask: optax's mask of it.
    mu_dtype: the momentum's dtype.
    nesterov: Nesterov momentum (both branches).
    adaptive: scale by the dual norm of the momentum.
    preconditioning: optax's normalisation before Newton-Schulz.
    adam_b1: the Adam branch's ``b1``.
    adam_b2: the Adam branch's ``b2``.
    adam_eps_root: the Adam branch's ``eps_root``.
    adam_weight_decay: the Adam branch's weight decay.
    adam_learning_rate: the Adam branch's rate (None: ``learning_rate``).
    muon_weight_dimension_numbers: optax's matrix dimensions by hand.
    consistent_rms: optax's consistent-RMS scaling.
    param_logical_axes: the parameters' logical axes, from which the matrix dimensions are
      derived (`optcore.partitioning.muon_dimension_numbers`).
    matrix_rules: axis name -> ``"matrix"``, ``"batch"`` or ``"adam"``, over
      ``MATRIX_AXIS_RULES``.
    ns_sharding: where the matrices are orthogonalised: ``NamedSharding(mesh, P(axis))``
      assigns whole matrices to the devices along ``axis``; None: set by ``create_sharded``
      under ZeRO-1 (``state_axis=``), else the compiler's choice; False: the compiler's.

  Returns:
    An optax transformation (optax's own where neither Polar Express nor owners are asked).

  Raises:
    TypeError: ``matrix_rules`` without ``param_logical_axes``, or both those and
      ``muon_weight_dimension_numbers``.
    ValueError: an unknown preset, or Polar Express with another ``preconditioning``, or
      owners with optax's aol or schatten first step.

  Example:
    >>> import jax.numpy as jnp
    >>> import optcore
    >>> opt = optcore.contrib.muon(0.02, ns_coeffs="polar_express").create({'w': jnp.eye(2)})
    >>> opt = opt.apply_gradient({'w': jnp.array([[1.0, 0.0], [0.0, 2.0]])})
    >>> [round(float(x), 3) for x in jnp.diag(opt.target['w'])]  # both moved by about 0.02
    [0.978, 0.982]
  """
  check_rules_with_axes("muon", param_logical_axes, matrix_rules)
  dims = muon_weight_dimension_numbers
  if param_logical_axes is not None:
    if dims is not None:
      raise TypeError(
        "muon: pass param_logical_axes (the matrix dimensions derived from them) or "
        "muon_weight_dimension_numbers (given by hand), not both"
      )
    dims = muon_dimension_numbers_fn(param_logical_axes, matrix_rules)
  polar = isinstance(ns_coeffs, str) and ns_coeffs == "polar_express"
  placement = ns_sharding if isinstance(ns_sharding, NamedSharding) else None
  if ns_sharding not in (None, False, True) and placement is None:
    raise TypeError(
      f"muon: ns_sharding must be a NamedSharding (whole matrices split over its first axis), "
      f"None or False; got {ns_sharding!r}"
    )
  if ns_sharding is True:
    raise TypeError(
      "muon: ns_sharding=True names no devices; pass NamedSharding(mesh, P('data')), or leave "
      "it None for create_sharded(..., state_axis='data') to set"
    )
  if placement is not None and (len(placement.spec) == 0 or placement.spec[0] is None):
    placement = None  # a replicated sharding names no owners: every device computes all
  if polar and preconditioning != "frobenius":
    raise ValueError(
      f"muon: ns_coeffs='polar_express' brings its authors' normalisation "
      f"(X / (||X|| * 1.01 + 1e-7)); preconditioning={preconditioning!r} would replace it. "
      "Leave preconditioning at 'frobenius', or pass the coefficients as a table"
    )
  if placement is not None and preconditioning not in OWNER_PRECONDITIONINGS:
    raise ValueError(
      f"muon: owner devices (ns_sharding=) orthogonalise with {OWNER_PRECONDITIONINGS}; "
      f"preconditioning={preconditioning!r} is optax's own first step. Pass ns_sharding=False"
    )
  if not polar and placement is None:
    return _OPTAX_MUON(
      learning_rate, ns_coeffs, ns_steps, beta, eps, weight_decay, weight_decay_mask,
      mu_dtype, nesterov=nesterov, adaptive=adaptive, preconditioning=preconditioning,
      adam_b1=adam_b1, adam_b2=adam_b2, adam_eps_root=adam_eps_root,
      adam_weight_decay=adam_weight_decay, adam_learning_rate=adam_learning_rate,
      muon_weight_dimension_numbers=dims, consistent_rms=consistent_rms,
    )  # fmt: skip
  if polar:
    coeffs: Any = polar_express_coefficients(ns_steps)
  elif isinstance(ns_coeffs, str):
    if ns_coeffs not in _PRESETS:
      raise ValueError(
        f"muon: unknown ns_coeffs preset {ns_coeffs!r}; the presets are "
        f"{sorted([*_PRESETS, 'polar_express'])}"
      )
    coeffs = _PRESETS[ns_coeffs]
  else:
    coeffs = ns_coeffs
  table = jnp.asarray(coeffs)
  if table.ndim > 2 or table.shape[-1] != 3:
    raise ValueError(f"muon: ns_coeffs must have shape (3,) or (n, 3), got {table.shape}")
  if table.ndim == 2 and table.shape[0] > ns_steps:
    raise ValueError(f"muon: {table.shape[0]} rows of ns_coeffs for ns_steps={ns_steps}")
  options = {
    "nesterov": nesterov,
    "adaptive": adaptive,
    "preconditioning": preconditioning,
    "adam_b1": adam_b1,
    "adam_b2": adam_b2,
    "adam_eps_root": adam_eps_root,
    "adam_weight_decay": adam_weight_decay,
    "adam_learning_rate": adam_learning_rate,
    "consistent_rms": consistent_rms,
    "polar": polar,
    "placement": placement,
  }
  return _own_muon(
    learning_rate, coeffs, ns_steps, beta, eps, weight_decay, weight_decay_mask, mu_dtype,
    dims, options,
  )  # fmt: skip


#: optax's presets (``optax.contrib.muon``'s), for the owners' program.
_PRESETS: Mapping[str, Any] = {
  "standard": (3.4445, -4.7750, 2.0315),
  "dion": (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
  ),
}

#: The argument `create_sharded` fills with the state's split (`OptimizerDef.with_state_split`).
muon.placement_argument = "ns_sharding"  # type: ignore[attr-defined]
# optax's muon extended: the wrapped names (`optcore.contrib.CONTRIB_OPTIMIZERS`) follow
# ``__wrapped__`` to optax's factory; the signature stays this one's.
muon.__signature__ = inspect.signature(muon)  # type: ignore[attr-defined]
muon.__wrapped__ = _OPTAX_MUON  # type: ignore[attr-defined]
