"""PNG figures for ``phoenix model``: eta against MTTF, loss risk against k, lost-time histograms, scaling fit.

matplotlib is imported inside each function and figures are built with ``matplotlib.figure.Figure`` (no
pyplot global state, no backend selection at import). Every figure is written to a temporary file beside the
target and renamed into place, so a failed save never leaves a half-written file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from phoenix_hpc.errors import ModelError


def check_target(path: str | Path) -> Path:
    """Return ``path`` if a PNG can be written there. Raises ModelError if it does not end in .png or its
    directory does not exist."""
    p = Path(path)
    if p.suffix.lower() != ".png":
        raise ModelError(f"--plot: {str(path)!r} is not allowed; expected a file name ending in .png")
    if not p.parent.resolve().is_dir():
        raise ModelError(f"--plot: {str(path)!r} is not allowed; directory {str(p.parent)!r} does not exist")
    return p


def _save(fig, path: str | Path) -> Path:
    p = check_target(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".png", dir=str(p.parent.resolve()))
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return p


def _figure():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    return fig, fig.add_subplot(1, 1, 1)


def efficiency_vs_mttf(path, mttf_s: float, curves: list[tuple[str, Callable[[float], float]]],
                       marks: list[tuple[str, float, int]] = ()) -> Path:
    """Training efficiency eta against MTTF from ``mttf_s``/30 to 30 x ``mttf_s``: one line per ``(label,
    eta_of_mttf)`` of ``curves`` (each a function of the MTTF in seconds, e.g. Eq. 4 with a scheme's disruption
    per fault, which for PHOENIX grows with the MTTF by its per-step tax), a dotted line at ``mttf_s`` and a
    dashed one per ``(label, mttf, curve)`` of ``marks`` inside the range (the crossovers), in the colour of
    curve number ``curve``."""
    m = np.geomspace(mttf_s / 30, mttf_s * 30, 200)
    fig, ax = _figure()
    lines = [ax.plot(m / 60, [eta(float(x)) for x in m], label=label)[0] for label, eta in curves]
    ax.axvline(mttf_s / 60, color="grey", ls=":", label=f"MTTF = {mttf_s / 60:.1f} min")
    for label, x, curve in marks:
        if m[0] <= x <= m[-1]:
            ax.axvline(x / 60, color=lines[curve].get_color(), ls="--", lw=0.8, label=f"{label} ({x / 60:.1f} min)")
    ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.set_xlabel("system MTTF (min)")
    ax.set_ylabel("training efficiency eta")
    ax.set_title("Efficiency against MTTF (Eq. 4)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def loss_risk_vs_k(path, rows: list[tuple[str, list[int], list[float]]], steps: int) -> Path:
    """Run-level loss bound against k; ``rows`` holds (label, ks, risks) per failure model."""
    fig, ax = _figure()
    for label, ks, risks in rows:
        ax.plot(ks, np.maximum(risks, 1e-300), marker="o", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("replication factor k")
    ax.set_ylabel(f"P(shard loss) over {steps} steps (union bound)")
    ax.set_title("Replica-loss risk against k (Eq. 6)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def lost_time_histogram(path, ckpt_lost_s: np.ndarray, phoenix_lost_s: np.ndarray) -> Path:
    """Histogram of the per-trial lost time (hours) of both schemes."""
    fig, ax = _figure()
    both = np.concatenate([ckpt_lost_s, phoenix_lost_s]) / 3600
    pos = both[both > 0]
    log = pos.size == both.size and pos.size > 0 and pos.max() > pos.min()
    bins = np.geomspace(pos.min(), pos.max(), 80) if log else 80
    ax.hist(ckpt_lost_s / 3600, bins=bins, alpha=0.7, label="checkpoint-restart")
    ax.hist(phoenix_lost_s / 3600, bins=bins, alpha=0.7, label="PHOENIX")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("lost time per campaign (h)")
    ax.set_ylabel("trials")
    ax.set_title("Monte Carlo: lost time per campaign")
    ax.legend()
    return _save(fig, path)


def scaling_fit(path, gpus, seconds, result) -> Path:
    """Measurements, every fitted law and its extrapolation (best law with its prediction band)."""
    from phoenix_hpc.model.fit import _f

    fig, ax = _figure()
    ax.scatter(gpus, seconds, color="black", zorder=3, label="measured")
    hi = max([max(gpus)] + [p.gpus for p in result.laws[0].predictions])
    n = np.geomspace(min(gpus), hi, 200)
    for lf in result.laws:
        style = "-" if lf.law == result.best else "--"
        ax.plot(n, _f(lf.law, n, *lf.params.values()), style, label=f"{lf.law} (w={lf.weight:.2f})")
    best = result.laws[0]
    xs = [p.gpus for p in best.predictions]
    ax.errorbar(xs, [p.seconds for p in best.predictions],
                yerr=[[p.seconds - p.low for p in best.predictions], [p.high - p.seconds for p in best.predictions]],
                fmt="o", color="red", capsize=4, label=f"{best.law}: 95 % prediction")
    ax.set_xscale("log")
    ax.set_xlabel("GPUs")
    ax.set_yscale("log")
    ax.set_ylabel("recovery time (s)")
    ax.set_title("Recovery time against cluster size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)
