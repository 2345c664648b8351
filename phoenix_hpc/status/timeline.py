"""A job's recovery timeline as a PNG: training step over wall-clock time, faults as markers, recovery phases
as coloured spans (the kind of figure a paper shows for a hot swap).

Drawn with matplotlib's object API on an Agg canvas (no pyplot, no global state, no display needed).

Elements (labels are stable, tests look for them):

- line ``live step`` (``Status.progress``: the coordinator's ``progress`` records and the other lower bounds
  :mod:`phoenix_hpc.status.derive` lists; never below the committed step) and line ``committed step``
  (``Status.commits``: the recoverable step over time), as steps held until the job's end (or ``now``);
- markers ``fault`` (red x) at each fault, ``injected`` (black triangle) where an injected fault landed,
  at the step the fault interrupted, or else at the live step at that time; a fault before any known step
  is a vertical dotted line (it has no place on the step axis);
- for each finished recovery, consecutive spans from the fault time ``finished - total_s``: ``detect``,
  ``quiesce``, ``reconfigure``, ``params``, ``optimizer``, then ``other`` (whatever the phases do not account
  for) and ``replay`` ending at ``finished``. Durations come from the ``recovery_done`` record and the
  journal (quiesce, see :mod:`phoenix_hpc.status.derive`). A recovery
  still in progress is a hatched ``in progress`` span; an aborted one a grey ``aborted`` span.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from phoenix_hpc.status.model import Status
from phoenix_hpc.status.render import PHASES

PHASE_COLOURS = {
    "detect": "#d62728",
    "reconfigure": "#ff7f0e",
    "params": "#2ca02c",
    "optimizer": "#1f77b4",
    "quiesce": "#8c564b",
    "other": "#bbbbbb",
    "replay": "#9467bd",
    "in progress": "#e7ba52",
    "aborted": "#7f7f7f",
}


def _t0(st: Status) -> float:
    cands = [st.job.started_at] + [p[0] for p in st.progress[:1]] + [f.ts for f in st.faults[:1]] + \
            [r.started_at for r in st.recoveries[:1]]
    cands = [c for c in cands if c is not None]
    return min(cands) if cands else st.now


def recovery_spans(st: Status) -> list[tuple[str, float, float]]:
    """``(label, start, end)`` spans in seconds since the job start for every recovery (see module doc)."""
    t0 = _t0(st)
    out: list[tuple[str, float, float]] = []
    for r in st.recoveries:
        if r.state == "done" and r.total_s is not None and r.finished_at is not None:
            end = r.finished_at - t0
            t = end - float(r.total_s)
            for ph in PHASES[:-1]:  # every phase but the replay, drawn after them
                d = float((r.quiesce_s if ph == "quiesce" else r.phases.get(ph)) or 0.0)
                if d > 0:
                    out.append((ph, t, t + d))
                    t += d
            replay = float(r.phases.get("replay", 0.0))
            if end - replay - t > 1e-6:
                out.append(("other", t, end - replay))
            if replay > 0:
                out.append(("replay", end - replay, end))
        elif r.state == "in_progress":
            out.append(("in progress", r.started_at - t0, st.now - t0))
        else:
            end = r.finished_at if r.finished_at is not None else r.started_at
            out.append(("aborted" if r.state == "aborted" else r.state, r.started_at - t0, max(end, r.started_at) - t0))
    return out


def _step_at(points: list[list[float]], t: float) -> float | None:
    """The last known step at time ``t`` (absolute), for placing a marker that has no step."""
    best = None
    for ts, s in points:
        if ts <= t:
            best = s
    return best


def _held(xs: list[float], ys: list[float], x_end: float) -> tuple[list[float], list[float]]:
    """The step series extended to ``x_end`` with its last value (a step line otherwise stops at its last
    change)."""
    if xs and x_end > xs[-1]:
        return xs + [x_end], ys + [ys[-1]]
    return xs, ys


def _place(points: list[tuple[float, int | None]], ref: list[list[float]]) -> tuple[list[tuple[float, float]],
                                                                                  list[float]]:
    """Markers ``(ts, step or None)`` as ``(placed (ts, y), unplaced ts)``: y is the step itself, else the
    last known step of ``ref`` at ``ts``; a marker with neither is unplaced (drawn as a vertical line)."""
    placed, unplaced = [], []
    for ts, step in points:
        y = float(step) if step is not None else _step_at(ref, ts)
        if y is None:
            unplaced.append(ts)
        else:
            placed.append((ts, y))
    return placed, unplaced


def build_figure(st: Status, width_in: float = 10.0, height_in: float = 4.5) -> Figure:
    """The timeline of ``st`` as a matplotlib Figure (Agg canvas attached)."""
    fig = Figure(figsize=(width_in, height_in), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    t0 = _t0(st)
    t_end = st.job.ended_at if st.job.ended_at is not None else st.now
    if st.progress:
        xs, ys = _held([p[0] - t0 for p in st.progress], [p[1] for p in st.progress], t_end - t0)
        ax.step(xs, ys, where="post", color="black", linewidth=1.6, label="live step")
    if st.commits:
        xs, ys = _held([p[0] - t0 for p in st.commits], [p[1] for p in st.commits], t_end - t0)
        ax.step(xs, ys, where="post", color="#1f77b4", linestyle="--", linewidth=1.2, label="committed step")
    seen: set[str] = set()
    for label, a, b in recovery_spans(st):
        kw = {"hatch": "//", "alpha": 0.35} if label == "in progress" else {"alpha": 0.35}
        ax.axvspan(a, max(b, a + 1e-3), color=PHASE_COLOURS.get(label, "#cccccc"),
                   label=label if label not in seen else None, **kw)
        seen.add(label)
    ref = st.progress or st.commits
    faults = [(f.ts, f.step) for f in st.faults]
    fired = [(float(f["ts"]), f.get("step")) for inj in st.injections for f in inj.fired]
    for pts, label, kw in ((faults, "fault", {"marker": "x", "s": 70, "color": "#d62728", "zorder": 5}),
                           (fired, "injected", {"marker": "v", "s": 60, "color": "black", "zorder": 6})):
        placed, unplaced = _place(pts, ref)
        if placed:
            ax.scatter([t - t0 for t, _ in placed], [y for _, y in placed], label=label, **kw)
        for i, t in enumerate(unplaced):
            ax.axvline(t - t0, color=kw["color"], linestyle=":", linewidth=1.2,
                       label=label if not placed and i == 0 else None)
    j = st.job
    ax.set_xlabel("wall-clock time since job start (s)")
    ax.set_ylabel("training step")
    ax.set_title(f"PHOENIX job {j.job_id or '-'} {j.name or ''}: {len(st.recoveries)} recovery(ies), "
                 f"state {j.state}".strip())
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", fontsize=8, ncol=2)
    if not (st.progress or st.commits or st.recoveries or st.faults):
        ax.text(0.5, 0.5, "no progress journalled yet", transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    return fig


def save_timeline(st: Status, path: str | os.PathLike) -> Path:
    """Draw the timeline of ``st`` and write it as PNG to ``path`` atomically (temporary file in the same
    folder, then rename: a reader never sees a half-written image). Returns the path.

    Raises:
        OSError: the folder does not exist or is not writable.
    """
    p = Path(path)
    fig = build_figure(st)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".png", dir=p.parent or Path("."))
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
