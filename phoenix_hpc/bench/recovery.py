"""Sections 2 (hot swap against checkpoint-restart) and 3 (hot-swap scaling) of the benchmarks.

Every trial is a real ``phoenix submit`` job on the local cluster, and the fault is the same in every
trial: once the job's logical rank 0 has finished step ``fault_step``, the node of the job's last active
slot is killed with :func:`phoenix_hpc.slurm.cluster.kill_node` (its slurmd, step daemons and tasks get
SIGKILL) and revived after the trial.

PHOENIX (``mode: phoenix``, one spare node): the phases come from the coordinator's journal,
``recovery_done {total_s, phases{detect, reconfigure, params, optimizer, replay}, steps_replayed}``
(total: fault -> the members are past the replayed steps), except ``detect``, which is measured from the kill
as for the baselines (:func:`true_detect`; the journal's own starts at the dead slot's last heartbeat).

Checkpoint-restart (``mode: checkpoint-restart``, a DCP checkpoint every K steps, no spare), phases in
wall-clock seconds:

* ``detect``: fault -> the first journal record of it (``slots_dead``/``fault``/``decision``), the same
  heartbeat detection PHOENIX uses;
* ``teardown``: ``scancel`` of the job -> Slurm shows it ended;
* ``relaunch``: ``phoenix submit`` of the same config -> every active rank of the new job registered with
  its coordinator (queueing, batch script, coordinator, srun, Python and MPI start);
* ``init``: -> every rank starts loading (process groups, engine);
* ``load``: the DCP load of the newest checkpoint (slowest rank);
* ``replay``: the steps from the checkpoint to the fault step, *really replayed* by the new job: the sum
  of its measured step times (slowest rank per step).

The fault step is drawn at random (seeded) in ``[K + 1, 2K]``, so the steps lost are uniform on ``1..K``:
the checkpoint of step K is complete when the fault comes (a fault right after step K can find it still
being written, and then no checkpoint exists at all for the in-process restart, which fails).
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.bench import jobs
from phoenix_hpc.bench import stats as S
from phoenix_hpc.errors import BenchError


@dataclass(frozen=True)
class Trial:
    """One fault trial: ``mode`` phoenix or checkpoint-restart, ``nodes`` active nodes (one slot each),
    model ``size``, pipeline depth ``pp``, checkpoint interval ``K`` (checkpoint-restart only)."""

    name: str
    mode: str
    nodes: int
    size: str
    pp: int
    fault_step: int
    interval_steps: int | None = None
    scheme: str = ""  # phoenix_hpc.bench.baselines.SCHEMES; "" = by mode (hot swap / requeue)


def draw_fault_step(rng: random.Random, interval_steps: int) -> int:
    """A fault step uniform in ``[K + 1, 2K]``: rank 0 has finished step K + 1 or later, so every rank
    has written its shard of the checkpoint of step K (a rank saves after finishing a step, before the next
    step's collectives), and the steps lost since that checkpoint are uniform on ``1..K``."""
    return interval_steps + 1 + rng.randrange(interval_steps)


def drawn_lost_steps(interval_steps: int) -> float:
    """Mean steps lost (and replayed) with :func:`draw_fault_step`'s draw: ``(K + 1) / 2``. The cost model's
    ``E[R] = (K - 1) / 2`` (:func:`phoenix_hpc.bench.stats.expected_replay_steps`, a fault at a uniformly
    random time) stays what the computed costs use."""
    return (interval_steps + 1) / 2


def _read_steps(run_dir: Path, rank: int) -> list[dict]:
    f = run_dir / "ranks" / f"rank{rank}.steps.jsonl"
    if not f.exists():
        return []
    out = []
    for line in f.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line being written
    return out


def _journal(run_dir: Path) -> list[dict]:
    from phoenix_hpc.control.journal import read_journal

    p = run_dir / "journal.jsonl"
    return read_journal(p) if p.exists() else []


def _wait(what: str, cond, timeout_s: float, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def _active_nodes(run_dir: Path) -> dict[int, str]:
    return {r["logical_rank"]: r["node"] for r in _journal(run_dir)
            if r["event"] == E.Registered.NAME and r.get("role") == "active" and r.get("logical_rank") is not None}


def _config(t: Trial, work: Path, data_path: str, steps: int, spares: int) -> dict:
    res: dict[str, Any] = {"mode": t.mode}
    if t.interval_steps is not None:
        res["checkpoint"] = {"interval_steps": t.interval_steps, "path": str(work / t.name / "checkpoints")}
    if t.scheme == "in-job":
        res["checkpoint"]["restart"] = "in-job"
    if t.scheme == "in-process":
        res["recovery_source"] = "checkpoint"
    dp = t.nodes // t.pp
    return jobs.job_config(name=f"bench-{t.name}", size=t.size, pp=t.pp, nodes=t.nodes, spares=spares,
                           steps=steps, data_path=data_path, global_batch=2 * dp, micro_batch=2, resilience=res)


def _start_and_kill(t: Trial, cfg: dict, run_dir: Path, ctx) -> dict:
    """Submit, wait until rank 0 finished ``t.fault_step``, kill the last active node. Returns the job, the
    fault's times and the killed slot's memory just before the kill."""
    from phoenix_hpc.slurm.cluster import kill_node, node_kill_targets
    from phoenix_hpc.slurm.procs import resident_mib

    cfg_path = jobs.write_yaml(run_dir.parent / f"{run_dir.name}.yaml", cfg)
    sub = jobs.phoenix_submit(cfg_path, run_dir, ctx.env)
    _wait(f"{t.name}: step {t.fault_step}",
          lambda: any(s["step"] >= t.fault_step for s in _read_steps(run_dir, 0)), timeout_s=240)
    nodes = _active_nodes(run_dir)
    victim = nodes[max(nodes)]
    targets = node_kill_targets(ctx.cluster, victim)  # the /proc scan before the clock: the fault is the kill
    slot = _slot_proc(run_dir, max(nodes))
    rss_mib, huge_mib = resident_mib(slot.pid) if slot is not None else (None, None)  # before the clock too
    gone: list[float] = []
    watcher = threading.Thread(target=_watch_exit, args=(slot, gone), daemon=True)
    watcher.start()
    t_fault = time.time()
    kill_node(ctx.cluster, victim, targets=targets)
    ctx.killed.append(victim)
    watcher.join(timeout=30)
    return {"job_id": sub["job_id"], "submitted_at": sub["submitted_at"], "t_fault": t_fault, "node": victim,
            "step_at_kill": max(s["step"] for s in _read_steps(run_dir, 0)),
            # the killed slot's process gone (exit finished: address space freed, sockets closed), seconds
            # after the kill, polled every 2 ms; None when it could not be watched
            "slot_exit_s": round(gone[0] - t_fault, 3) if gone else None,
            # what the killed slot's exit frees: its resident memory just before the kill, and the part of it in
            # transparent huge pages (launcher.torch_huge_pages), MiB; None when it could not be read
            "slot_rss_mib": rss_mib, "slot_huge_mib": huge_mib}


def _slot_proc(run_dir: Path, logical_rank: int):
    """The :class:`~phoenix_hpc.slurm.procs.ProcId` of an active slot's process (its ``registered`` pid),
    None when it is not running."""
    from phoenix_hpc.slurm.procs import proc_id

    pids = [r["pid"] for r in _journal(run_dir) if r["event"] == E.Registered.NAME and r.get("role") == "active"
            and r.get("logical_rank") == logical_rank]
    return proc_id(pids[-1]) if pids else None


def _watch_exit(proc, out: list[float], timeout_s: float = 20.0) -> None:
    """Append the time the exit of ``proc`` is complete (:func:`phoenix_hpc.slurm.procs.exit_complete`: its
    last thread gone, which is when the kernel closes its sockets), polled every 2 ms for up to
    ``timeout_s``; nothing when ``proc`` is None or the exit did not complete in time."""
    from phoenix_hpc.slurm.procs import exit_complete

    if proc is None:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if exit_complete(proc):
            out.append(time.time())
            return
        time.sleep(0.002)


def run_hotswap(t: Trial, ctx) -> dict:
    """One PHOENIX hot-swap trial; returns the journal's ``recovery_done`` fields plus trial facts.
    Raises BenchError when no recovery completes within the timeout (the job is cancelled)."""
    run_dir = ctx.work / "recovery" / t.name
    cfg = _config(t, ctx.work, ctx.data_path, steps=t.fault_step + (5 if t.scheme else 25), spares=1)
    info = _start_and_kill(t, cfg, run_dir, ctx)
    try:
        done = _wait(f"{t.name}: recovery_done in the journal",
                     lambda: [r for r in _journal(run_dir) if r["event"] == E.RecoveryDone.NAME
                              or (r["event"] == E.Decision.NAME and r.get("action") in ("fallback", "clean_stop"))],
                     timeout_s=150)
    finally:
        try:
            ctx.client.cancel(info["job_id"])
        except Exception:  # noqa: BLE001 - the trial's result matters more than a late cancel
            pass
        ctx.revive()  # overlaps with Slurm ending the job
        try:
            jobs.wait_job_end(ctx.client, info["job_id"], timeout_s=60)
        except Exception:  # noqa: BLE001
            pass
    rec = done[0]
    if rec["event"] != E.RecoveryDone.NAME:
        raise BenchError(f"{t.name}: no hot swap, the journal says {json.dumps(rec)[:300]}")
    steps = [s["step_time_ms"] for s in _read_steps(run_dir, 0)]
    journal = _journal(run_dir)
    marks = journal_marks(journal, rec["ts"])
    phases, total = true_detect(rec, journal, info["t_fault"])
    return {"marks": marks,"name": t.name, "nodes": t.nodes, "spares": 1, "size": t.size, "params": jobs.model_params(t.size),
            "pp": t.pp, "fault_step": t.fault_step, **info, "total_s": total, "phases": phases,
            "coordinator_detect_s": rec["phases"]["detect"],
            "steps_replayed": rec.get("steps_replayed"), "recoverable_step": rec.get("recoverable_step"),
            "action": rec.get("action"),
            "step_ms_median": statistics.median(steps) if steps else None}


def true_detect(done: dict, journal: list[dict], t_fault: float) -> tuple[dict, float]:
    """The hot swap's phases and total measured from the kill (pure): ``detect`` = the kill -> the first
    journal record of the fault (``slots_dead``/``fault``/``decision``), as for the baselines; the other
    phases as ``recovery_done`` has them; the total = that detect + the journal's total without its own
    detect. The coordinator cannot know when a node died: its ``detect`` starts at the dead slot's last
    heartbeat (``control/membership.py``), up to a heartbeat interval before the kill, and is kept apart as
    ``coordinator_detect_s``.

    Raises BenchError when the journal has no record of the fault at or after ``t_fault``."""
    seen = fault_records(journal, t_fault)
    if not seen:
        raise BenchError(f"no journal record of the fault at or after {t_fault}")
    detect = min(r["ts"] for r in seen) - t_fault
    phases = {**done["phases"], "detect": round(detect, 3)}
    return phases, round(done["total_s"] - done["phases"]["detect"] + detect, 3)


def fault_records(journal: list[dict], t_fault: float) -> list[dict]:
    """The journal records that show the coordinator learned of a fault (``slots_dead``, ``fault``,
    ``decision``) at or after ``t_fault`` (the kill, epoch seconds), in journal order (pure). The first one's
    ``ts`` minus ``t_fault`` is the detection time of every benchmark trial."""
    return [r for r in journal if r["ts"] >= t_fault and r["event"] in (E.SlotsDead.NAME, E.Fault.NAME, E.Decision.NAME)]


def journal_marks(journal: list[dict], t_done: float) -> dict:
    """Seconds from ``recovery_start`` of the last recovery to its ``recovery_plan``, ``recovery_restored``
    and ``recovery_done`` (pure), and whether a survivor reported a collective timeout in between (a
    survivor blocked in a collective with the dead rank delays the quiesce until
    ``resilience.collective_timeout_s``)."""
    starts = [r for r in journal if r["event"] == E.RecoveryStart.NAME and r["ts"] <= t_done]
    if not starts:
        return {}
    t0 = starts[-1]["ts"]

    def first(ev):
        xs = [r["ts"] for r in journal if r["event"] == ev and t0 <= r["ts"] <= t_done]
        return round(min(xs) - t0, 3) if xs else None

    timeouts = [r for r in journal if r["event"] == E.Fault.NAME and r.get("kind") == "collective_timeout"
                and t0 <= r["ts"] <= t_done]
    return {"quiesce_s": first(E.RecoveryPlanned.NAME), "to_restored_s": first(E.RecoveryRestored.NAME),
            "to_done_s": first(E.RecoveryDone.NAME), "collective_timeout_in_quiesce": bool(timeouts)}


def run_baseline(t: Trial, ctx) -> dict:
    """One checkpoint-restart trial: fault, scancel, relaunch from the newest checkpoint, replay to the
    fault step. Returns each phase in seconds. Raises BenchError when the relaunched job does not restore
    (e.g. this build does not write checkpoints) or fails."""
    run1 = ctx.work / "recovery" / f"{t.name}-a"
    run2 = ctx.work / "recovery" / f"{t.name}-b"
    cfg = _config(t, ctx.work, ctx.data_path, steps=t.fault_step + 25, spares=1 if t.scheme else 0)
    info = _start_and_kill(t, cfg, run1, ctx)
    try:
        seen = _wait(f"{t.name}: detection in the journal",
                     lambda: fault_records(_journal(run1), info["t_fault"]), timeout_s=60)
        t_detect = min(r["ts"] for r in seen)
        t_cancel = time.time()
        ctx.client.cancel(info["job_id"])
        _, t_ended = jobs.wait_job_end(ctx.client, info["job_id"], timeout_s=60, poll_s=0.05)
    finally:
        ctx.revive()
    fault_step = info["step_at_kill"]
    ck_root = Path(cfg["resilience"]["checkpoint"]["path"])
    from phoenix_hpc.recovery.checkpoint import latest_step

    ck_step = latest_step(ck_root)
    if ck_step is None:
        raise BenchError(f"{t.name}: the first job wrote no checkpoint under {ck_root} "
                         "(is launch/persist wired into the rank loop?)")
    cfg2 = dict(cfg)
    cfg2["training"] = {**cfg["training"], "steps": fault_step}
    cfg2_path = jobs.write_yaml(run2.parent / f"{run2.name}.yaml", cfg2)
    sub = jobs.phoenix_submit(cfg2_path, run2, ctx.env)
    state, t_end2 = jobs.wait_job_end(ctx.client, sub["job_id"], timeout_s=300)
    n = t.nodes
    reg = [r["ts"] for r in _journal(run2) if r["event"] == E.Registered.NAME and r.get("role") == "active"]
    restores = []
    for r in range(n):
        f = run2 / "ranks" / f"rank{r}.persist.jsonl"
        recs = [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []
        restores += [x for x in recs if x["event"] == "restore"]
    if len(reg) < n or len(restores) < n or any(x["step"] != ck_step for x in restores):
        raise BenchError(f"{t.name}: the relaunched job (state {state}) did not restore step {ck_step} on all "
                         f"{n} ranks (registered {len(reg)}, restores {[x['step'] for x in restores]}); see {run2}")
    per_rank = [[s["step_time_ms"] for s in _read_steps(run2, r)] for r in range(n)]
    replay_ms = S.job_step_times(per_rank)
    phases = {
        "detect": t_detect - info["t_fault"],
        "teardown": t_ended - t_cancel,
        "relaunch": max(reg) - sub["submitted_at"],
        "init": max(x["t_start"] for x in restores) - max(reg),
        "load": max(x["t_end"] - x["t_start"] for x in restores),
        "replay": sum(replay_ms) / 1e3,
    }
    phases = {k: round(v, 3) for k, v in phases.items()}
    return {"name": t.name, "K": t.interval_steps, "nodes": n, "size": t.size, "pp": t.pp,
            "fault_step": fault_step, "checkpoint_step": ck_step, "steps_replayed": len(replay_ms),
            "replay_step_ms_median": statistics.median(replay_ms) if replay_ms else None,
            "expected_replay_steps": drawn_lost_steps(t.interval_steps),
            "phases": phases, "total_s": round(sum(phases.values()), 3),
            "jobs": [info["job_id"], sub["job_id"]], "second_job_state": state,
            "replay_measured": "real: the relaunched job replayed these steps; time = sum of its step times"}


def run_in_process(t: Trial, ctx) -> dict:
    """One in-process restart trial (``mode: phoenix``, ``recovery_source: checkpoint``, checkpoint every K
    steps, one spare): the journal's ``recovery_done`` of a ``checkpoint_restart`` plan, in the six phases
    of :func:`phoenix_hpc.bench.baselines.journal_phases`. Raises BenchError when the recovery did not go
    through the checkpoint."""
    from phoenix_hpc.bench.baselines import journal_phases

    h = run_hotswap(t, ctx)
    if (h.get("action") or "checkpoint_restart") != "checkpoint_restart":
        raise BenchError(f"{t.name}: the recovery was a {h.get('action')}, not a restart from the checkpoint")
    ck = h.get("recoverable_step")
    return {**h, "K": t.interval_steps, "checkpoint_step": ck, "journal_phases": h["phases"],
            "phases": journal_phases(h["total_s"], h["phases"]),
            "expected_replay_steps": drawn_lost_steps(t.interval_steps)}


def hot_swap_six_phases(h: dict) -> dict:
    """A hot-swap trial of :func:`run_hotswap` with its phases also in the six of the comparison."""
    from phoenix_hpc.bench.baselines import journal_phases

    if "total_s" not in h:
        return h
    return {**h, "journal_phases": h["phases"], "phases": journal_phases(h["total_s"], h["phases"])}


def _restores(run_dir: Path, n: int) -> list[dict]:
    out = []
    for r in range(n):
        f = run_dir / "ranks" / f"rank{r}.persist.jsonl"
        recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []
        out += [dict(x, rank=r) for x in recs if x["event"] == "restore"]
    return out


def replayed_after_restore(steps: list[dict], fault_step: int) -> list[dict]:
    """The records of a rank's ``steps.jsonl`` trained again after an in-job restart (pure): those after the
    first place where the step number does not grow (the new step starts again from the checkpoint), up to
    ``fault_step``."""
    for i in range(1, len(steps)):
        if steps[i]["step"] <= steps[i - 1]["step"]:
            return [s for s in steps[i:] if s["step"] <= fault_step]
    return []


def run_in_job(t: Trial, ctx) -> dict:
    """One in-job restart trial (``mode: checkpoint-restart``, ``checkpoint.restart: in-job``, one spare
    node): the fault, then the batch script ends the srun step and starts a new one in the same
    allocation, whose ranks restore the newest checkpoint and replay to the fault step. Phases (seconds):
    detect (fault -> first journal record), teardown (-> the old step ended and the next nodes chosen:
    ``in_job_restarts.jsonl``), relaunch (-> every active rank of the new step registered with the new
    coordinator), init (-> the ranks start loading), load (DCP load, slowest rank), replay (the new step's
    measured step times up to the fault step, slowest rank per step). Raises BenchError when the job did
    not restart in the same allocation in a new step or did not finish."""
    from phoenix_hpc.control.in_job import read_restarts

    run_dir = ctx.work / "recovery" / t.name
    cfg = _config(t, ctx.work, ctx.data_path, steps=t.fault_step + 5, spares=1)
    info = _start_and_kill(t, cfg, run_dir, ctx)
    try:
        state, _ = jobs.wait_job_end(ctx.client, info["job_id"], timeout_s=240)
    finally:
        ctx.revive()
    n = t.nodes
    jr = _journal(run_dir)
    seen = fault_records(jr, info["t_fault"])
    restarts = read_restarts(run_dir)
    if not seen or not restarts:
        raise BenchError(f"{t.name}: no in-job restart (job state {state}, detection records {len(seen)}, "
                         f"restarts {len(restarts)}); see {run_dir}")
    t_detect = min(r["ts"] for r in seen)
    t_step_end = restarts[0]["ts"]
    reg = [r["ts"] for r in jr if r["event"] == E.Registered.NAME and r.get("role") == "active" and r["ts"] > t_step_end]
    restores = [x for x in _restores(run_dir, n) if x["t_start"] > t_step_end]
    fault_step = info["step_at_kill"]
    ck = restarts[0].get("checkpoint_step")
    steps_ids = sorted({(x.get("slurm_job_id"), x.get("slurm_step_id")) for x in restores})
    if len(reg) < n or len(restores) < n or any(x["step"] != ck for x in restores):
        raise BenchError(f"{t.name}: the new step did not restore step {ck} on all {n} ranks (registered "
                         f"{len(reg)}, restores {[x['step'] for x in restores]}); see {run_dir}")
    per_rank = [[s["step_time_ms"] for s in replayed_after_restore(_read_steps(run_dir, r), fault_step)]
                for r in range(n)]
    replay_ms = S.job_step_times(per_rank)
    phases = {
        "detect": t_detect - info["t_fault"],
        "teardown": t_step_end - t_detect,
        "relaunch": max(reg) - t_step_end,
        "init": max(x["t_start"] for x in restores) - max(reg),
        "load": max(x["t_end"] - x["t_start"] for x in restores),
        "replay": sum(replay_ms) / 1e3,
    }
    phases = {k: round(v, 3) for k, v in phases.items()}
    return {"name": t.name, "scheme": "in-job", "K": t.interval_steps, "nodes": n, "size": t.size, "pp": t.pp,
            "fault_step": fault_step, "checkpoint_step": ck, "steps_replayed": len(replay_ms),
            "replay_step_ms_median": statistics.median(replay_ms) if replay_ms else None,
            "expected_replay_steps": drawn_lost_steps(t.interval_steps),
            "phases": phases, "total_s": round(sum(phases.values()), 3), "job_id": info["job_id"],
            "job_state": state, "restore_steps": [list(x) for x in steps_ids],
            "dead_nodes": restarts[0].get("dead_nodes"), "node_killed": info["node"]}
