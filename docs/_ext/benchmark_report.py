"""Renders the benchmark page's figure from ``benchmarks/results/`` at build time.

``nox -s bench`` writes its reports to ``benchmarks/results/`` (``suite.json`` and the Markdown
tables the page includes); this extension draws the step-time ratios per face from
``suite.json`` into ``docs/_generated/step_ratios.png`` before Sphinx reads the pages, so the
page shows the numbers of the last committed run and never a pasted copy.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
FACES = ("core", "flax", "equinox", "treex")
REPORTS = (
  "suite",
  "equinox_step",
  "state_memory",
  "zero1",
  "grouped",
  "training_at_scale",
  "low_bit",
  "matrix_optimizers",
)
GROUPED_LABELS = {
  "grouped": "grouped step",
  "grouped_one_buffer": "one buffer",
  "grouped_update": "the update alone",
  "grouped_packed_grad": "grad of packed",
  "split_back": "split back",
}


def load_suite(results: Path = RESULTS) -> dict:
  """The suite's report; a missing one is an error that says how to make it."""
  missing = [f"{name}.md" for name in REPORTS if not (results / f"{name}.md").exists()]
  if missing or not (results / "suite.json").exists():
    raise FileNotFoundError(
      f"benchmarks/results/ lacks {missing or ['suite.json']}: run `nox -s bench` (it writes "
      "them) and commit the results the documentation should show"
    )
  return json.loads((results / "suite.json").read_text())


def _device(report: dict) -> str:
  """The report's device, ``'cpu (cpu)'`` (as reports before the fix wrote it) read as ``'cpu'``."""
  return re.sub(r"^(\S+) \(\1\)", r"\1", report["device"])


def plot_step_ratios(report: dict, out: Path) -> None:
  """One bar per face and row (optimizer, size): its median ratio over raw optax, with the
  quartiles as error bars, and the A/A control's quartiles as a grey band per row."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = report["jitted"]
  labels = [f"{r['optimizer']}\n{r['params'] / 1e6:.1f}M" for r in rows]
  width = 0.8 / len(FACES)
  fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 3.6), dpi=120)
  for i, row in enumerate(rows):
    _, low, high = row["control"]
    label = "A/A control (quartiles)" if i == 0 else None
    ax.fill_between([i - 0.45, i + 0.45], low, high, color="0.85", label=label, zorder=0)
  for j, face in enumerate(FACES):
    xs = [i - 0.4 + (j + 0.5) * width for i in range(len(rows))]
    medians = [r[face][0] for r in rows]
    errors = [
      [max(0.0, r[face][0] - r[face][1]) for r in rows],
      [max(0.0, r[face][2] - r[face][0]) for r in rows],
    ]
    ax.bar(xs, medians, width, label=face, zorder=2)
    ax.errorbar(xs, medians, yerr=errors, fmt="none", ecolor="0.2", lw=0.8, zorder=3)
  ax.axhline(1.0, color="black", lw=0.8, zorder=1)
  ax.set_xticks(range(len(rows)), labels, fontsize=8)
  ax.set_ylabel("step time / raw optax")
  low = min(min(r[f][1] for f in FACES) for r in rows)
  high = max(max(r[f][2] for f in FACES) for r in rows)
  ax.set_ylim(min(0.8, low - 0.02), max(1.2, high + 0.02))
  ax.set_title(f"Jitted step, optcore over raw optax ({_device(report)})", fontsize=9)
  ax.legend(fontsize=7, ncol=5, loc="upper left")
  fig.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out)
  plt.close(fig)


def plot_grouped(report: dict, out: Path) -> None:
  """`optcore.grouped` over raw optax (benchmarks/grouped.py): one horizontal bar per model and
  variant, quartiles as error bars, each model's A/A control as a grey band; trace+compile
  below. Horizontal, so every label reads level at the page's size (the figure is drawn as
  wide as the article shows it, 9 inches at 100 dpi)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  bars = [(row, key) for row in report["rows"] for key in GROUPED_LABELS if key in row]
  rows = report["rows"]
  fig, (steps, compiles) = plt.subplots(
    2,
    1,
    figsize=(9, 0.42 * (len(bars) + len(rows)) + 2.2),
    dpi=100,
    gridspec_kw={"height_ratios": [len(bars), len(rows)]},
  )
  for i, (row, key) in enumerate(bars):
    _, low, high = row["control"]
    steps.fill_betweenx([i - 0.45, i + 0.45], low, high, color="0.85", zorder=0)
    median, q1, q3 = row[key]
    steps.barh(i, median, 0.7, color="C0" if key == "grouped" else "C1", zorder=2)
    steps.errorbar(median, i, xerr=[[median - q1], [q3 - median]], fmt="none", ecolor="0.2")
  steps.axvline(1.0, color="black", lw=0.8)
  labels = [f"{row['model']}: {GROUPED_LABELS[key]}" for row, key in bars]
  steps.set_yticks(range(len(bars)), labels, fontsize=10)
  steps.invert_yaxis()
  steps.set_xlabel("time / raw optax (grey: the A/A control)", fontsize=10)
  steps.set_title("Jitted step (forward, backward, adam update)", fontsize=11)
  compiles.barh(range(len(rows)), [r["compile"][0] for r in rows], 0.7, color="C2")
  compiles.axvline(1.0, color="black", lw=0.8)
  compiles.set_yticks(range(len(rows)), [r["model"] for r in rows], fontsize=10)
  compiles.invert_yaxis()
  compiles.set_xlabel("trace + compile time / raw optax", fontsize=10)
  fig.suptitle(f"optcore.grouped over raw optax per leaf ({_device(report)})", fontsize=11)
  fig.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out)
  plt.close(fig)


def plot_master_weights(report: dict, out: Path) -> None:
  """benchmarks/training_at_scale.py's loss curves: the demo trained with float32 parameters,
  bfloat16 parameters, and bfloat16 parameters with float32 master copies (log scale)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
  styles = {"float32": {"color": "0.3", "lw": 2.5, "alpha": 0.5}}
  for name, losses in report["curves"].items():
    ax.plot(range(1, len(losses) + 1), losses, label=name, **styles.get(name, {"lw": 1.2}))
  ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel("training loss")
  ax.legend(fontsize=8)
  ax.set_title(
    "The demo MLP with bfloat16 parameters: optcore.mixed_precision(master_dtype=float32)",
    fontsize=9,
  )
  fig.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out)
  plt.close(fig)


def plot_low_bit(report: dict, out: Path) -> None:
  """benchmarks/low_bit.py's loss curves: adam with float32, bfloat16, 8-bit and 4-bit state,
  and bfloat16 parameters rounded to nearest and stochastically (10-step means, log scale)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
  styles = {"float32 adam": {"color": "0.3", "lw": 2.5, "alpha": 0.5}}
  for name, curve in report["losses"].items():
    losses = curve[:-1]  # the last entry is the held-out loss after training
    smooth = np.convolve(losses, np.ones(10) / 10, mode="valid")
    ax.plot(range(10, len(losses) + 1), smooth, label=name, **styles.get(name, {"lw": 1.2}))
  ax.set_yscale("log")
  _loss_axes(ax, "training loss (10-step mean)")
  ax.set_title("adam on a small MLP: low-bit state and bfloat16 parameters", fontsize=9)
  _save(fig, out)


def plot_matrix_optimizers(report: dict, out: Path) -> None:
  """benchmarks/matrix_optimizers.py's loss curves: AdamW, Muon, SOAP and Shampoo on a small
  transformer (20-step means), the chain's entropy rate as the floor."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
  for name, run in report["loss"]["runs"].items():
    smooth = np.convolve(run["curve"], np.ones(20) / 20, mode="valid")
    ax.plot(range(20, len(run["curve"]) + 1), smooth, label=name, lw=1.5)
  ax.axhline(report["loss"]["entropy"], color="0.5", ls=":", lw=1, label="entropy rate")
  _loss_axes(ax, "training loss (20-step mean)")
  ax.set_title("A 2-layer transformer on a Markov chain's tokens", fontsize=9)
  _save(fig, out)


def _loss_axes(ax, ylabel: str) -> None:
  ax.set_xlabel("step")
  ax.set_ylabel(ylabel)
  ax.legend(fontsize=8)


def _save(fig, out: Path) -> None:
  import matplotlib.pyplot as plt

  fig.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out)
  plt.close(fig)


def _render(app) -> None:
  generated = Path(app.srcdir) / "_generated"
  plot_step_ratios(load_suite(), generated / "step_ratios.png")
  plot_grouped(json.loads((RESULTS / "grouped.json").read_text()), generated / "grouped.png")
  at_scale = json.loads((RESULTS / "training_at_scale.json").read_text())
  plot_master_weights(at_scale, generated / "master_weights.png")
  plot_low_bit(json.loads((RESULTS / "low_bit.json").read_text()), generated / "low_bit_loss.png")
  matrix = json.loads((RESULTS / "matrix_optimizers.json").read_text())
  plot_matrix_optimizers(matrix, generated / "matrix_optimizers_loss.png")


def setup(app):
  app.connect("builder-inited", _render)
  return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
