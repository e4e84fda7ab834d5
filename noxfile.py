"""Every task of the optcore workspace.

  nox -s tests         every CPU variant (core, flax, equinox, treex, all) on Python 3.11 and
                       3.13, the core on 3.12 (which resolves 3.13's packages), each that is
                       present (pyenv's are found without setting PYENV_VERSION); a missing
                       one is skipped, and nox says so (with
                       --error-on-missing-interpreters, as on CI, it fails). About 40 minutes
                       for all three on two CPU cores, the first run a few more for the
                       installs; ``nox -s "tests-3.13(variant='core')"`` is one variant
  nox -s quick         the core's tests on the newest Python: about 4 minutes; pytest
                       arguments go after ``--`` (``nox -s quick -- -k soap -x``)
  nox -s lint          ruff check, ruff format --check, and pyright (basedpyright) over packages/
  nox -s demo          one config, five frameworks (examples/swap_frameworks.py)
  nox -s spike         a run through a bad batch: statistics, a skipped step (spike_statistics.py)
  nox -s bench         the benchmarks (reports under benchmarks/results/), on the newest
                       Python and on 3.11 (jax 0.10) those whose numbers depend on the stack
  nox -s optax_suite   optax's own tests with every factory rebound to optcore's as_optax()
  nox -s release       build the four sdists and wheels, twine check them, install each
                       extra from them into a clean venv as a user would
  nox -s tests-cuda    the suite on JAX's CUDA build (needs an NVIDIA GPU)
  nox -s tests-lowest  each package on the minimum versions its pyproject declares
  nox -s tests-latest  every package on the newest releases, without the lock
  nox -s docs          the documentation site (docs/_build/html), its link check,
                       screenshots of four pages, each checked for showing a page, and
                       every page measured at 1280 px for clipped code, tables, figures

Installs come from uv.lock (``uv sync --locked``: a stale lock fails), so every run tests the
versions developers test; uv.lock resolves per Python (jax 0.10 on 3.11, jax 0.12 on 3.12+).
Each variant gets its own venv holding only its package, that package's framework and the
test tools: the core variant proves the core needs no framework. The one-Python sessions
(demo, lint, release) use the newest supported Python present.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

nox.needs_version = ">=2024.10.9"
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["tests"]
# A Python that is not installed is skipped (or, on CI, an error), not downloaded.
nox.options.download_python = "never"

ROOT = Path(__file__).parent
PYTHONS = ["3.11", "3.12", "3.13"]  # requires-python and the classifiers say the same


def _select_pyenv_pythons() -> None:
  """Under pyenv only the selected versions' ``pythonX.Y`` run (the others' shims fail):
  select the newest installed patch of each supported Python, as .ci/run does, unless the
  user chose with ``PYENV_VERSION`` already. Without pyenv this does nothing."""
  pyenv = shutil.which("pyenv")
  if pyenv is None or os.environ.get("PYENV_VERSION"):
    return
  listed = subprocess.run(
    [pyenv, "versions", "--bare"], capture_output=True, text=True, check=False
  )
  installed = listed.stdout.split()
  selected = []
  for minor in PYTHONS:
    patches = [v for v in installed if v.startswith(f"{minor}.") and v[len(minor) + 1 :].isdigit()]
    if patches:
      selected.append(max(patches, key=lambda v: int(v.rsplit(".", 1)[1])))
  if selected:
    os.environ["PYENV_VERSION"] = ":".join(selected)


_select_pyenv_pythons()


def _runs(version: str) -> bool:
  """Whether ``pythonX.Y`` runs here (a pyenv shim of an unselected version does not)."""
  found = shutil.which(f"python{version}")
  if found is None:
    return False
  result = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
  return result.returncode == 0


# The sessions that need one Python take the newest present (3.11 if none is: nox then says so).
PYTHON = next((v for v in reversed(PYTHONS) if _runs(v)), PYTHONS[0])

# variant -> (workspace package to install, test folders it runs)
VARIANTS = {
  "core": ("optcore", ["tests/core"]),
  "flax": ("optcore-flax", ["tests/flax"]),
  "equinox": ("optcore-equinox", ["tests/equinox"]),
  "treex": ("optcore-treex", ["tests/treex"]),
  "all": (None, ["tests/conformance", "tests/distributed", "tests/benchmarks"]),
}
# The cross-face variant ("all": every face together, the 8-device mesh, loopback processes,
# the benchmarks' smoke runs) on the oldest and the newest Python: 3.12 resolves the same jax,
# flax, optax and orbax as 3.13 (docs/development.md's table), so running it there too cost CI
# ten minutes to repeat 3.13's run.
INTEGRATION_PYTHONS = (PYTHONS[0], PYTHONS[-1])
# Dependency groups a variant's tests need beyond "test" (T5X's gin configs for flax).
EXTRA_GROUPS = {"flax": ["gin"], "all": ["checkpoint", "demo"]}
# The multi-device tests run on 8 CPU devices (and spawn their own processes
# for the loopback multi-process run).
EIGHT_CPU_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
# The folders whose tests need 8 devices: tests/conformance needs one and runs apart, with the
# compilation cache (in the 8-device process XLA:CPU segfaulted compiling one of its programs,
# three times in 2026-11-28's 3.13 runs, never on one device).
EIGHT_DEVICE_FOLDERS = ("tests/distributed", "tests/flax/mesh", "tests/benchmarks")
ADAPTERS = {"flax": "optcore_flax", "equinox": "optcore_equinox", "treex": "optcore_treex"}
VERSIONS_SHOWN = ["jax", "jaxlib", "numpy", "optax", "flax", "equinox", "treeo", "orbax-checkpoint"]


def _find_uv() -> str | None:
  """uv as nox's uv backend finds it: ``$UV``, then the uv installed beside nox (``nox[uv]``
  in a venv or by pipx puts it there, not on PATH: the README's first commands), then PATH."""
  if named := os.environ.get("UV"):
    return shutil.which(named)
  try:
    from uv import find_uv_bin  # the uv distribution's own locator, in nox's interpreter

    return find_uv_bin()
  except (ImportError, FileNotFoundError):
    return shutil.which("uv")


#: uv's executable; every session calls it by this path, since ``.venv/bin`` need not be on PATH.
UV = _find_uv()


def uv(session: nox.Session) -> str:
  """uv's path, or the session stops saying how to get it."""
  if UV is None:
    session.error(
      "these sessions install from uv.lock and need uv beside nox: pip install 'nox[uv]' into "
      "the environment nox runs from (or put uv on PATH, or set UV=/path/to/uv)"
    )
  return UV


def sync(session: nox.Session, package: str | None, *groups: str) -> None:
  """Installs ``package`` (every member when None) and ``groups`` from uv.lock."""
  args = [uv(session), "sync", "--locked", "--no-default-groups"]
  args += ["--package", package] if package else ["--all-packages"]
  for group in groups:
    args += ["--group", group]
  session.run_install(
    *args, env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}, external=True
  )


def print_versions(session: nox.Session) -> None:
  """Prints the Python and the resolved versions of the stack this session tests."""
  session.run(
    "python",
    "-c",
    "import importlib.metadata as m, platform; "
    "d = {x.metadata['Name'].lower(): x.version for x in m.distributions()}; "
    f"print('Python', platform.python_version() + ':', "
    f"', '.join(f'{{n}} {{d[n]}}' for n in {VERSIONS_SHOWN!r} if n in d))",
  )


def fetch_test_data(session: nox.Session, folders: list[str]) -> None:
  """What a test needs from a registry is fetched here, never inside pytest: Flax's own NNX
  optimizer suite (tests/support/flax_nnx_suite.py; offline its test skips, saying so)."""
  if "tests/flax" in folders:
    session.run("python", "tests/support/flax_nnx_suite.py")


#: pytest-xdist: one worker per core, a test file per worker at a time (module fixtures are
#: built once). XLA compiles on one thread, so a second worker uses the second core (the core
#: variant: 3.5 minutes with two, 2026-11-26). ``nox -s tests -- -n 0`` runs in one process.
WORKERS = ("-n", "auto", "--dist", "loadfile")
#: What every pytest run here installs beside the package, where not from uv.lock's test group.
TEST_TOOLS = ["pytest>=8.3", "hypothesis>=6.100", "pytest-xdist>=3.6"]

#: The comparisons between two programs whose rounding depends on the CPU's instruction set (a
#: committed reference, per-leaf optax against a grouped buffer, one device against a mesh): run
#: a second time under XLA's SSE4_2 code (no AVX, no FMA), the rounding another CPU gives, so a
#: tolerance that holds on this CPU alone fails here rather than on a user's machine.
FLOAT_SENSITIVE = {
  "core": [
    "tests/core/test_shampoo.py",
    "tests/core/test_soap.py",
    "tests/core/test_grouped.py",
    "tests/core/test_low_bit_state.py",
    "tests/core/test_wrapper_orders.py",
    "tests/core/test_field_optimizers.py",
    "tests/core/test_dion.py",
    "tests/core/test_hyperball.py",
    "tests/core/test_muon_at_scale.py",
    "tests/core/test_kron.py",
    "tests/core/test_multipliers.py",
    "tests/core/test_qk_clip.py",
    "tests/core/test_diloco.py",
  ],
  "flax": [
    "tests/flax/test_matrix_optimizers_flax.py",
    "tests/flax/test_grouped_flax.py",
    "tests/flax/mesh/test_nnx_beyond_optimizer.py",
  ],
  "all": [
    "tests/distributed/test_matrix_optimizers_mesh.py",
    "tests/distributed/test_grouped_sharding.py",
    "tests/distributed/test_low_bit_mesh.py",
    "tests/distributed/test_field_optimizers_mesh.py",
    "tests/distributed/test_muon_mesh.py",
    "tests/conformance/test_grouped_faces.py",
  ],
}
OTHER_ISA = "--xla_cpu_max_isa=SSE4_2"


def compilation_cache(session: nox.Session) -> dict[str, str]:
  """JAX's persistent compilation cache, one folder for every session under .nox: the
  workers and the variants compile the same small programs again and again (the composition
  matrix, the conformance catalogue on each face), and a program compiled once is read back
  by the next. Its key holds the JAX version, the program and XLA_FLAGS, so the SSE4_2 pass
  and the 8-device tests keep programs of their own. Measured on the conformance composition
  matrix (2-core CPU): 78 s without, 78 s cold, 37 s warm."""
  folder = os.path.join(os.path.dirname(session.virtualenv.location), "jax-compilation-cache")
  return {
    "JAX_COMPILATION_CACHE_DIR": folder,
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
  }


def run_pytest(
  session: nox.Session,
  folders: list[str],
  *extra: str,
  env: dict[str, str] | None = None,
  mesh_env: dict[str, str] | None = None,
) -> None:
  """pytest over ``folders``: those that need 8 devices (`EIGHT_DEVICE_FOLDERS`, also inside a
  folder given) run after the rest, in a process of their own (JAX's device count is fixed
  when it starts), with ``mesh_env`` in place of ``env`` where given (the CUDA session's CPU
  meshes); the rest on one device, with the compilation cache."""
  fetch_test_data(session, folders)
  nested = [m for m in EIGHT_DEVICE_FOLDERS for f in folders if m.startswith(f"{f}/")]
  one = [f for f in folders if not f.startswith(EIGHT_DEVICE_FOLDERS)]
  eight = [f for f in folders if f.startswith(EIGHT_DEVICE_FOLDERS)] + nested
  if one:
    _pytest(session, one, *(f"--ignore={m}" for m in nested), *extra, env=env)
  if eight:
    _pytest(session, eight, *extra, env=env if mesh_env is None else mesh_env)


def _pytest(
  session: nox.Session, folders: list[str], *extra: str, env: dict[str, str] | None = None
) -> None:
  eight_devices = any(f.startswith(EIGHT_DEVICE_FOLDERS) for f in folders)
  # Not for the 8-device run: there XLA:CPU's executable.serialize(), which only the cache
  # calls, segfaulted once under jax 0.12 (a conformance test, 2026-11-28), and pytest-xdist's
  # loadfile scheduler then waited forever for the crashed worker's file.
  cache = {} if eight_devices else compilation_cache(session)
  env = {**cache, **(env or {})}
  if eight_devices:
    flags = f"{EIGHT_CPU_DEVICES['XLA_FLAGS']} {env.get('XLA_FLAGS', '')}".strip()
    env["XLA_FLAGS"] = flags
  session.run("python", "-m", "pytest", *folders, *WORKERS, *extra, *session.posargs, env=env)


def run_under_another_isa(session: nox.Session, variant: str) -> None:
  """The variant's float-sensitive files again, under XLA's SSE4_2 instruction set."""
  files = FLOAT_SENSITIVE.get(variant)
  if files:
    session.log(f"the float-sensitive tests again under XLA_FLAGS={OTHER_ISA}")
    run_pytest(session, files, env={"XLA_FLAGS": OTHER_ISA})


@nox.session(python=PYTHONS)
@nox.parametrize("variant", list(VARIANTS))
def tests(session: nox.Session, variant: str) -> None:
  """The test suite on CPU, one venv per package and Python."""
  if variant == "all" and session.python not in INTEGRATION_PYTHONS:
    session.skip(
      f"the cross-face variant runs on Python {' and '.join(INTEGRATION_PYTHONS)}, the lowest "
      f"and highest stacks uv.lock resolves; Python {session.python} resolves the newest's "
      "(docs/development.md), and the core's variant runs here"
    )
  if variant in ADAPTERS and session.python not in INTEGRATION_PYTHONS:
    session.skip(
      f"Python {session.python} resolves the newest Python's jax, flax, equinox and treeo "
      "(docs/development.md): the frameworks' variants run there, and the core's runs here for "
      "the interpreter"
    )
  package, folders = VARIANTS[variant]
  if session.python != PYTHON:  # the benchmarks' smoke runs: measurement code, newest Python
    folders = [f for f in folders if f != "tests/benchmarks"]
  sync(session, package, "test", *EXTRA_GROUPS.get(variant, []))
  print_versions(session)
  # Every ordered pair of wrappers in every face is Python-independent optcore logic: the newest
  # Python runs it all, the others each wrapper alone (tests/support/composition.py), which keeps
  # CI under its hour.
  full = {"OPTCORE_FULL_MATRIX": "1"} if session.python == PYTHON else None
  # Between the oldest and the newest Python, whose jax, optax and XLA are the newest's (the
  # same programs), the float-sensitive files' numbers cannot differ from the newest's, which
  # runs them twice (two instruction sets): run the rest, the interpreter's part (CI's 45
  # minutes; the cold compiles of these files were about 1.5 of its 49, 2026-11-28).
  middle = session.python not in INTEGRATION_PYTHONS
  skipped = [f"--ignore={f}" for f in FLOAT_SENSITIVE.get(variant, [])] if middle else []
  run_pytest(session, folders, *skipped, env=full)
  if session.python == PYTHON:  # the instruction set is Python-independent: the newest runs it
    run_under_another_isa(session, variant)


@nox.session(python=PYTHON)
def quick(session: nox.Session) -> None:
  """The core's tests on the newest Python, the quick check before a commit (about 4 minutes
  on two CPU cores); ``nox -s quick -- -k soap`` passes pytest arguments."""
  sync(session, "optcore", "test")
  print_versions(session)
  run_pytest(session, VARIANTS["core"][1])


# variant -> what tests-lowest installs beside pytest: the package (its direct requirements
# resolved to their lowest versions) and the test-only tools its folders need.
LOWEST = {
  "core": ["./packages/core"],
  "flax": ["./packages/core", "./packages/flax_adapter", "gin-config>=0.5"],
  "equinox": ["./packages/core", "./packages/equinox_adapter"],
  "treex": ["./packages/core", "./packages/treex_adapter"],
}


@nox.session(name="tests-lowest", python=PYTHONS[0], default=False)
@nox.parametrize("variant", list(LOWEST))
def tests_lowest(session: nox.Session, variant: str) -> None:
  """Each package's tests on the lowest versions its pyproject allows (not from uv.lock)."""
  session.install("--resolution", "lowest-direct", *LOWEST[variant], *TEST_TOOLS)
  print_versions(session)
  run_pytest(session, VARIANTS[variant][1])


@nox.session(name="tests-latest", python=PYTHON, default=False)
def tests_latest(session: nox.Session) -> None:
  """Every package and test on the newest releases the registry serves, without the lock:
  drift in jax, optax, flax, equinox or orbax shows here before users report it."""
  packages = ["./packages/core", *(f"./packages/{a}_adapter" for a in ADAPTERS)]
  tools = [*TEST_TOOLS, "gin-config", "orbax-checkpoint", "matplotlib"]
  session.install("--upgrade", "--resolution", "highest", *packages, *tools)
  print_versions(session)
  for _, folders in VARIANTS.values():
    run_pytest(session, folders)


@nox.session(name="tests-cuda", python=PYTHON, default=False, tags=["cuda"])
def tests_cuda(session: nox.Session) -> None:
  """The whole suite on JAX's CUDA build; skips without an NVIDIA GPU.

  Set OPTCORE_REQUIRE_GPU=1 where a GPU must be present (a GPU runner): then
  a missing GPU fails the session instead of skipping it. OPTCORE_JAX_CUDA
  picks JAX's CUDA extra (default cuda12).
  """
  if not _nvidia_gpu_visible():
    message = "no NVIDIA GPU is visible (nvidia-smi -L lists none)"
    if os.environ.get("OPTCORE_REQUIRE_GPU") == "1":
      session.error(f"OPTCORE_REQUIRE_GPU=1 but {message}")
    session.skip(f"{message}; the CUDA tests need one")
  sync(session, None, "test", "gin")
  jax_version = session.run(
    "python", "-c", "import jax; print(jax.__version__)", silent=True
  ).strip()
  # cuda12 runs on the widest range of drivers; OPTCORE_JAX_CUDA=cuda13 picks the newer build.
  extra = os.environ.get("OPTCORE_JAX_CUDA", "cuda12")
  session.install(f"jax[{extra}]=={jax_version}")
  session.run(
    "python",
    "-c",
    "import jax; d = jax.devices(); assert d[0].platform == 'gpu', d; print('devices:', d)",
  )
  folders = [f for _, fs in VARIANTS.values() for f in fs if f != "tests/distributed"]
  # The mesh tests build CPU meshes; on this machine they still run, on the CPU.
  cpu = {"JAX_PLATFORMS": "cpu"}
  run_pytest(session, folders, env={"OPTCORE_REQUIRE_GPU": "1"}, mesh_env=cpu)
  run_pytest(session, ["tests/distributed"], env=cpu)


def _nvidia_gpu_visible() -> bool:
  if shutil.which("nvidia-smi") is None:
    return False
  result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
  return result.returncode == 0 and "GPU" in result.stdout


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
  """ruff check and ruff format --check over the whole repository, then pyright (basedpyright,
  pyproject's [tool.basedpyright]) over the four packages, with every framework installed so the
  adapters' imports resolve."""
  sync(session, None, "lint")
  session.run("ruff", "check", ".")
  session.run("ruff", "format", "--check", ".")
  session.run("basedpyright", "--pythonpath", str(Path(session.bin) / "python"))


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
  """One config through the core, Flax, Flax NNX, Equinox and Treex: the same numbers, a
  checkpoint moved between frameworks, the loss curves in swap_frameworks.png."""
  session.log(f"Python {PYTHON}: the newest of {', '.join(PYTHONS)} that runs here")
  sync(session, None, "checkpoint", "demo")
  print_versions(session)
  session.run("python", "examples/swap_frameworks.py", *session.posargs)


# The libraries low_bit_state is held to, pinned (their numbers are committed in
# tests/reference_data/low_bit_reference.npz), and torch's CPU build.
LOW_BIT_REFERENCE = ["torch==2.13.0+cpu", "bitsandbytes==0.50.2", "torchao==0.18.0"]
#: The one author's package of issue 51 on PyPI (its zclip.py is the clone's that wrote
#: field_reference.npz); MARS, C-Optim, NorMuon and Dion are on GitHub only, which CI cannot
#: reach: their scripts run by hand from clones (tests/reference_data/make_*_reference.py).
FIELD_REFERENCE = ["zclip==1.0.0"]
#: microsoft/mup as on PyPI (1.0.0, 2022: no decoupled_wd, which make_mup_reference.py leaves
#: out there) and the one import it makes beyond torch; its pandas, seaborn and torchvision
#: serve its plotting, which the reference does not import.
MUP_REFERENCE = ["pyyaml>=6"]
MUP_REFERENCE_NO_DEPS = ["mup==1.0.0"]
#: Megatron-LM's QK-clip (make_qk_clip_reference.py): its methods import torch, numpy and
#: packaging only; its other pins (a CUDA stack's) are not needed on CPU.
QK_CLIP_REFERENCE_NO_DEPS = ["megatron-core==0.16.1"]
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@nox.session(python=PYTHONS[0])
def reference(session: nox.Session) -> None:
  """bitsandbytes and torchao (torch on CPU) write the low-bit reference data anew, the
  committed file must equal it, and low_bit_state's tests run against it; zclip and mup write
  their trajectories anew, Megatron-LM its QK-clip, and the committed ones must equal them:
  one Python, one environment, apart from the test matrix. torch's CPU wheel comes from pip's
  find-links (PIP_FIND_LINKS, a local wheel) where it is set, else from PyTorch's CPU index."""
  sync(session, "optcore", "test")
  links = os.environ.get("PIP_FIND_LINKS")
  where = ["--find-links", links] if links else ["--extra-index-url", TORCH_CPU_INDEX]
  session.run_install(
    uv(session), "pip", "install", "--python", session.virtualenv.location, *where,
    *LOW_BIT_REFERENCE, *FIELD_REFERENCE, *MUP_REFERENCE, external=True,
  )  # fmt: skip
  session.run_install(
    uv(session), "pip", "install", "--python", session.virtualenv.location, "--no-deps",
    *MUP_REFERENCE_NO_DEPS, *QK_CLIP_REFERENCE_NO_DEPS, external=True,
  )  # fmt: skip
  fresh = os.path.join(session.create_tmp(), "low_bit_reference.npz")
  session.run("python", "tests/reference_data/make_low_bit_reference.py", fresh)
  field = os.path.join(session.create_tmp(), "field_reference_zclip.npz")
  script = "tests/reference_data/make_field_reference.py"
  session.run("python", script, "--zclip-only", field)
  mup = os.path.join(session.create_tmp(), "mup_reference.npz")
  session.run("python", "tests/reference_data/make_mup_reference.py", mup)
  qk_clip = os.path.join(session.create_tmp(), "qk_clip_reference.npz")
  session.run("python", "tests/reference_data/make_qk_clip_reference.py", qk_clip)
  env = {
    "OPTCORE_LOW_BIT_REFERENCE": fresh,
    "OPTCORE_FIELD_REFERENCE": field,
    "OPTCORE_MUP_REFERENCE": mup,
    "OPTCORE_QK_CLIP_REFERENCE": qk_clip,
  }
  tests = [
    "tests/core/test_low_bit_state.py",
    "tests/core/test_field_optimizers.py",
    "tests/core/test_multipliers.py",
    "tests/core/test_qk_clip.py",
  ]
  run_pytest(session, tests, env=env)


#: The authors' JAX Shampoo, as its continuation on PyPI (make_shampoo_reference.py in
#: tests/reference_data says why it stands for the google-research file); without its pins.
SHAMPOO_REFERENCE = ["precondition-opt==0.3.0"]
#: The authors' JAX PSGD Kron (make_kron_reference.py); without its pins (it asks matplotlib).
KRON_REFERENCE = ["psgd-jax==0.2.9"]


@nox.session(python=PYTHON)
def shampoo_reference(session: nox.Session) -> None:
  """The authors' JAX optimizers write their reference trajectories anew, the committed files
  must agree with them: Shampoo (`tests/core/test_shampoo.py`) and PSGD Kron
  (`tests/core/test_kron.py`), one environment (both import flax and chex)."""
  sync(session, None, "test")  # every member: flax, which the references import
  session.run_install(
    uv(session), "pip", "install", "--python", session.virtualenv.location, "--no-deps",
    *SHAMPOO_REFERENCE, *KRON_REFERENCE, external=True,
  )  # fmt: skip
  session.run_install(
    uv(session), "pip", "install", "--python", session.virtualenv.location, "chex", external=True
  )
  print_versions(session)
  fresh = os.path.join(session.create_tmp(), "shampoo_reference.npz")
  session.run("python", "tests/reference_data/make_shampoo_reference.py", fresh)
  kron = os.path.join(session.create_tmp(), "kron_reference.npz")
  session.run("python", "tests/reference_data/make_kron_reference.py", kron)
  env = {"OPTCORE_SHAMPOO_REFERENCE": fresh, "OPTCORE_KRON_REFERENCE": kron}
  run_pytest(session, ["tests/core/test_shampoo.py", "tests/core/test_kron.py"], env=env)


#: What optax's own tests import beside optax (its test extras).
OPTAX_TEST_TOOLS = ["absl-py", "scikit-learn"]


@nox.session(name="optax_suite", python=PYTHON, default=False)
def optax_suite(session: nox.Session) -> None:
  """optax's own test suite judges optcore's optax face: run as it is and with every optax
  factory rebound to optcore.<name>(...).as_optax() (tests/support/optax_rebound.py); fails on
  any test that fails only rebound (tests/support/optax_suite.py)."""
  sync(session, "optcore", "test")
  session.run_install(
    uv(session), "pip", "install", "--python", session.virtualenv.location, *OPTAX_TEST_TOOLS,
    external=True,
  )  # fmt: skip
  print_versions(session)
  session.run("python", "tests/support/optax_suite.py", *WORKERS, *session.posargs)


@nox.session(python=PYTHON)
def spike(session: nox.Session) -> None:
  """A run through a bad batch: per-layer statistics logged each step, the bad step skipped,
  a restore mid-window, the statistics plotted to spike_statistics.png."""
  sync(session, None, "demo")
  print_versions(session)
  session.run("python", "examples/spike_statistics.py", *session.posargs)


#: What the oldest stack measures beside the newest: the benchmarks whose results depend on
#: the jax and XLA they compile with, each written per stack (results/*_jax<version>.md).
PER_STACK_BENCHMARKS = ("robustness.py", "low_bit_peer.py")


@nox.session(python=list(dict.fromkeys(INTEGRATION_PYTHONS)))
def bench(session: nox.Session) -> None:
  """optcore against raw optax for every face (step time, eager, compile, memory,
  bandwidth), the Equinox filter_jit loop, the NNX face against nnx.Optimizer (its step, and
  the pains Flax users reported: nnx_pains.py, 8 devices), the grouped
  layout's full train steps, sharded state memory and ZeRO-1 on 8 devices, host offload,
  mixed-precision state and accumulation (training_at_scale.py), state at 16, 8 and 4 bits and
  stochastic rounding (low_bit.py), the 8-bit step against a hand-written one (low_bit_peer.py),
  SOAP and Shampoo against AdamW and Muon and the authors' JAX
  Shampoo (matrix_optimizers.py; with `-- --reference SOAP_CLONE --torch-python PY` also the
  authors' SOAP), SOAP's and Shampoo's refresh and the rest at three sizes (matrix_sizes.py),
  MARS, NorMuon, Dion, cautious AdamW and ZClip beside them (field_optimizers.py);
  writes Markdown and JSON
  reports to benchmarks/results/. On the oldest Python (the oldest stack uv.lock resolves:
  jax 0.10) it runs the benchmarks whose numbers depend on the stack (`PER_STACK_BENCHMARKS`,
  and nnx_pains.py), each written beside the newest stack's."""
  sync(session, None, "checkpoint")  # training_at_scale.py imports the demo, which saves with orbax
  print_versions(session)
  if session.python != PYTHON:
    for script in PER_STACK_BENCHMARKS:
      session.run("python", f"benchmarks/{script}", *session.posargs)
    session.run("python", "benchmarks/nnx_pains.py", env=EIGHT_CPU_DEVICES)
    return
  session.run_install(  # the authors' JAX Shampoo, timed by matrix_optimizers.py
    uv(session), "pip", "install", "--python", session.virtualenv.location, "--no-deps",
    *SHAMPOO_REFERENCE, external=True,
  )  # fmt: skip
  session.run_install(
    uv(session), "pip", "install", "--python", session.virtualenv.location, "chex", external=True
  )
  session.run("python", "benchmarks/suite.py", *session.posargs)
  session.run("python", "benchmarks/grouped.py", *session.posargs)
  session.run("python", "benchmarks/equinox_step.py", *session.posargs)
  session.run("python", "benchmarks/nnx_step.py", *session.posargs)
  session.run("python", "benchmarks/nnx_pains.py", env=EIGHT_CPU_DEVICES)
  session.run("python", "benchmarks/robustness.py", *session.posargs)
  session.run("python", "benchmarks/low_bit.py", *session.posargs)
  session.run("python", "benchmarks/low_bit_peer.py", *session.posargs)
  session.run("python", "benchmarks/matrix_optimizers.py", *session.posargs)
  session.run("python", "benchmarks/matrix_sizes.py", *session.posargs)
  session.run("python", "benchmarks/field_optimizers.py", *session.posargs)
  session.run("python", "benchmarks/state_memory.py", env=EIGHT_CPU_DEVICES)
  session.run("python", "benchmarks/zero1.py", env=EIGHT_CPU_DEVICES)
  session.run("python", "benchmarks/training_at_scale.py", *session.posargs)


@nox.session(python=PYTHON)
def release(session: nox.Session) -> None:
  """Builds the four sdists and wheels into dist/, checks their metadata with twine (the
  README renders as the PyPI page; the URLs and classifiers are valid), then installs each
  extra from the wheels into a clean venv, as a user would, and the core from its sdist."""
  dist = ROOT / "dist"
  shutil.rmtree(dist, ignore_errors=True)
  session.run(uv(session), "build", "--all-packages", "--out-dir", str(dist), external=True)
  built = sorted(p.name for p in dist.iterdir() if p.name.endswith((".whl", ".tar.gz")))
  session.log(f"built: {built}")
  if sum(name.endswith(".whl") for name in built) != 4 or len(built) != 8:
    session.error(f"expected 4 sdists and 4 wheels, found {built}")
  session.install("twine>=6.1")
  session.run("twine", "check", "--strict", *(str(dist / name) for name in built))
  # Pinned, so a same-named project on PyPI can never stand in for the build.
  version = next(dist.glob("optcore-*.whl")).name.split("-")[1]
  users = {extra: (f"optcore[{extra}]=={version}", module) for extra, module in ADAPTERS.items()}
  users["sdist"] = (str(next(dist.glob("optcore-*.tar.gz"))), "optcore")
  for name, (requirement, module) in users.items():
    venv = Path(session.create_tmp()) / f"user-{name}"
    shutil.rmtree(venv, ignore_errors=True)
    session.run(uv(session), "venv", "--quiet", "--python", PYTHON, str(venv), external=True)
    python = str(venv / "bin" / "python")
    # What a user types, with the freshly built distributions standing in for PyPI's.
    session.run(uv(session), "pip", "install", "--quiet", "--python", python, "pip", external=True)
    session.run(
      python,
      "-m",
      "pip",
      "install",
      "--quiet",
      "--find-links",
      str(dist),
      requirement,
      external=True,
    )
    session.run(
      python,
      "-c",
      f"import optcore, {module}; assert {module}.__version__ == optcore.__version__; "
      f"print({requirement!r}, optcore.__version__, 'imports optcore and {module}')",
      external=True,
    )


# The pages nox -s docs photographs, and the window each is shown in (width, height).
SCREENSHOTS = {
  "index.html": ("home.png", (1366, 1100)),
  "migration/flax_optim.html": ("migration_flax_optim.png", (1366, 2400)),
  "api/optcore.html": ("api_optimizer.png", (1366, 2400)),  # optcore.Optimizer comes first
  "benchmarks.html": ("benchmarks.png", (1366, 2400)),
}


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
  """Builds the documentation site with warnings as errors into docs/_build/html, checks every
  internal link (and that each name of the API index links to its entry), then renders the home
  page, the flax.optim migration guide, optcore.Optimizer's API entry and the benchmarks page
  in headless Chromium to docs/_build/screenshots/ (Chromium from PATH; with
  OPTCORE_INSTALL_CHROMIUM=1 Debian's package is installed with apt when missing), checks each
  shows a page, not a blank, and measures every page at 1280 px: no code
  block, table, figure or contents entry clipped (docs/_tools/check_clipping.py).

  Chromium is looked for first, before anything is built, so a machine without it hears what
  to install at once; ``nox -s docs -- --site-only`` builds the site and checks its links
  without it."""
  site_only = "--site-only" in session.posargs
  unknown = [arg for arg in session.posargs if arg != "--site-only"]
  if unknown:
    session.error(f"nox -s docs takes only --site-only after --, not {unknown}")
  chromium = None if site_only else _chromium(session)
  sync(session, None, "docs")
  build = ROOT / "docs" / "_build"
  shutil.rmtree(build / "html", ignore_errors=True)
  session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", str(build / "html"))
  session.run("python", "docs/_tools/check_links.py", str(build / "html"))
  if chromium is None:
    session.log(f"site: {build / 'html' / 'index.html'} (--site-only: no screenshots)")
    return
  shots = build / "screenshots"
  shots.mkdir(parents=True, exist_ok=True)
  for page, (name, (width, height)) in SCREENSHOTS.items():
    session.run(
      chromium,
      "--headless",
      "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
      "--disable-gpu",  # scroll bars shown: a block that scrolls must not look clipped
      f"--window-size={width},{height}",
      f"--screenshot={shots / name}",
      (build / "html" / page).as_uri(),
      external=True,
      silent=True,
    )
    if not (shots / name).stat().st_size:
      session.error(f"Chromium wrote an empty screenshot of {page}")
  session.run(
    "python", "docs/_tools/check_screenshots.py", *(str(p) for p in sorted(shots.glob("*.png")))
  )
  # Every page at a laptop's 1280 px: no code block, table, figure or contents entry clipped.
  session.run(
    "python", "docs/_tools/check_clipping.py", str(build / "html"), "--chromium", chromium
  )
  session.log(f"site: {build / 'html' / 'index.html'}; screenshots: {sorted(shots.glob('*.png'))}")


def _chromium(session: nox.Session) -> str:
  """Chromium from PATH. Where it is missing this says how to get it, and installs Debian's
  package with apt-get only when asked to (``OPTCORE_INSTALL_CHROMIUM=1``, as .ci/run does)."""
  for name in ("chromium", "chromium-browser"):
    if found := shutil.which(name):
      return found
  if os.environ.get("OPTCORE_INSTALL_CHROMIUM") != "1":
    session.error(
      "the site's screenshots and clipping checks need Chromium, which is not on PATH (nothing "
      "was built): install your distribution's package (Debian/Ubuntu: sudo apt-get install "
      "chromium fonts-dejavu-core), or rerun with OPTCORE_INSTALL_CHROMIUM=1 to let this "
      "session run apt-get for you, or build the site alone with nox -s docs -- --site-only"
    )
  if shutil.which("apt-get") is None:
    session.error("the screenshots need Chromium: install your distribution's chromium package")
  sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
  if sudo and shutil.which("sudo") is None:
    session.error("Chromium is missing and installing it needs root: apt-get install chromium")
  session.run(*sudo, "apt-get", "update", "-qq", external=True)
  session.run(
    *sudo,
    "apt-get",
    "install",
    "-y",
    "-qq",
    "--no-install-recommends",
    "chromium",
    "fonts-dejavu-core",
    external=True,
    env={"DEBIAN_FRONTEND": "noninteractive"},
  )
  found = shutil.which("chromium")
  if found is None:
    session.error("apt-get installed chromium, but no chromium is on PATH")
  return found
