"""The recovery timeline PNG: produced atomically, non-empty, with the expected elements."""

from __future__ import annotations

import pytest

from phoenix_hpc.status.derive import derive_status
from phoenix_hpc.status.timeline import build_figure, recovery_spans, save_timeline
from tests.unit.test_status_derive import done_records, node_loss_records, run_files, running_slurm, start_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def finished_status():
    recs = start_records() + node_loss_records() + done_records()
    recs.append({"ts": 9.0, "event": "fault", "world_rank": 2, "node": "nid00002", "generation": 0, "step": 7,
                 "phase": "optimizer_step", "kind": "node_loss", "exc_type": "", "message": "x"})
    recs.sort(key=lambda r: r["ts"])
    fired = [{"ts": 8.9, "request_id": "r1", "world_rank": 2, "kind": "node_loss", "at_step": 7, "step": 7,
              "phase": "optimizer_step"}]
    return derive_status(recs, running_slurm(), now=30.0, run=run_files(fired=fired))


def test_png_written_and_non_empty(tmp_path, finished_status):
    out = save_timeline(finished_status, tmp_path / "timeline.png")
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.png"]  # no temporary file left


def test_recovery_spans_follow_the_journal_breakdown(finished_status):
    spans = recovery_spans(finished_status)
    # recovery_done at t=15 with total 5.0: fault at t=10; phases laid out from there; replay ends at 15
    assert [s[0] for s in spans] == ["detect", "quiesce", "reconfigure", "params", "optimizer", "replay"]
    assert spans[0][1] == pytest.approx(10.0) and spans[0][2] == pytest.approx(11.25)
    assert spans[1] == ("quiesce", pytest.approx(11.25), pytest.approx(12.25))  # recovery_start -> plan: 1.0 s
    assert spans[-1] == ("replay", pytest.approx(13.0), pytest.approx(15.0))


def test_figure_has_expected_elements(finished_status):
    fig = build_figure(finished_status)
    (ax,) = fig.axes
    labels = set(ax.get_legend_handles_labels()[1])
    assert {"live step", "committed step", "fault", "injected", "detect", "reconfigure", "params", "optimizer",
            "replay"} <= labels
    assert ax.get_xlabel().startswith("wall-clock time") and ax.get_ylabel() == "training step"
    live = next(line for line in ax.get_lines() if line.get_label() == "live step")
    assert max(live.get_ydata()) == 20  # job_done step


def test_in_progress_recovery_and_empty_job(tmp_path):
    recs = start_records() + node_loss_records()[:4]
    st = derive_status(recs, running_slurm(), now=14.0, run=run_files())
    assert [s[0] for s in recovery_spans(st)] == ["in progress"]
    assert save_timeline(st, tmp_path / "a.png").stat().st_size > 0
    empty = derive_status([], None, now=1.0, run=run_files())
    assert save_timeline(empty, tmp_path / "b.png").read_bytes()[:8] == PNG_MAGIC


def test_unwritable_folder_raises_and_leaves_nothing(tmp_path, finished_status):
    with pytest.raises(OSError):
        save_timeline(finished_status, tmp_path / "missing" / "t.png")


def _fault(ts, step=None):
    return {"ts": ts, "event": "fault", "world_rank": 1, "node": "nid00001", "generation": 0, "step": step,
            "phase": None, "kind": "exception", "exc_type": "", "message": "x"}


def test_fault_without_step_sits_at_the_live_step_or_is_a_vertical_line():
    # the fault at t=0.5 precedes any known step: a vertical line, no point at step 0; the one at t=2.5
    # has no step either: placed at the live step then (commit at t=2 says step 1 is done)
    recs = sorted(start_records() + [_fault(0.5), _fault(2.5)], key=lambda r: r["ts"])
    st = derive_status(recs, running_slurm(), now=4.0, run=run_files())
    fig = build_figure(st)
    (ax,) = fig.axes
    (pts,) = [c for c in ax.collections if c.get_label() == "fault"]
    assert pts.get_offsets().tolist() == [[pytest.approx(2.5), 1.0]]
    t0 = st.job.started_at
    vlines = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [0.5 - t0, 0.5 - t0]]
    assert len(vlines) == 1 and vlines[0].get_linestyle() == ":"


def test_live_step_line_of_a_running_job_is_held_until_now():
    st = derive_status(start_records(), running_slurm(), now=30.0, run=run_files())
    (ax,) = build_figure(st).axes
    live = next(line for line in ax.get_lines() if line.get_label() == "live step")
    assert live.get_xdata()[-1] == pytest.approx(30.0) and live.get_ydata()[-1] == 6
