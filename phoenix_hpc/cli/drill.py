"""``phoenix drill CONFIG --site SITE [--faults N] [--seed S]``: a fault drill on a real job.

1. validate CONFIG for the site and plan N faults (:func:`phoenix_hpc.drills.drill.plan_drill`: random
   kinds, steps, phases and target ranks from ``--seed``, within the spare budget);
2. the fault-free reference: reuse ``--reference RUN_DIR`` (a finished run of the same config) or submit
   one and wait for it;
3. submit the drill job; once it trains, inject the faults one at a time through the coordinator
   (``phoenix inject-fault``'s code), each after the previous one's recovery ended;
4. wait for the job to end and report per fault: kind, where it landed, detection time, recovery breakdown,
   steps replayed; and whether the final state hash equals the reference's (docs/design.md section 10);
5. on the local cluster, start the slurmd of every node a ``kill-node`` took down again, so the cluster is
   whole for the next run. A drill job still running when the drill gives up or is interrupted is cancelled.

Faults are drawn from the kinds of :data:`phoenix_hpc.drills.drill.VERIFIED_KINDS` unless
``--kinds`` names others (``corrupt-replica`` comes with a crash of its target at the planned step, the
recovery that then needs the corrupted copy; :mod:`phoenix_hpc.drills.drill`). A fault is sent once, after
the previous fault's recovery ended, for exactly its
planned step and phase; the target slot arms it only if it has not started that step. A fault refused that
way, or armed and missed (its target lost, the job ended), is not sent again: it did not land where planned,
and the drill fails.

With ``resilience.mode: checkpoint-restart`` and ``resilience.checkpoint.restart: in-job`` the drill runs the
in-job baseline (:mod:`phoenix_hpc.drills.in_job`): every fault must end in an in-job restart (a new srun
step in the same allocation from the newest checkpoint), measured over every srun step's records.

Runs go under ``--run-dir`` (default ``runs/drill-<name>-<time>``): ``reference/`` and ``job/``; both are
recorded in the runs index, so ``phoenix status`` shows them. Each run writes only into its own run
directory: the config is submitted with its checkpoint folder, Megatron-LM save folder and TensorBoard folder
moved there (:mod:`phoenix_hpc.drills.folders`; its ``config.yaml`` and the report's ``folders`` name them),
so the drill job never starts from the reference's checkpoints and no run writes into the user's folders
(``load_megatron`` is kept: every run starts from it, reading only). ``--dry-run`` prints the plan only.

Exit codes: 0 every fault landed at its planned step and phase, was recovered with the action its kind calls for, and the
final state equals the reference;
1 the drill ran but one of those failed (the report says which); 2 bad input (config, site, too many faults
for the steps or spares).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Callable

import click

from phoenix_hpc.control import events as E
from phoenix_hpc.cli.params import Seconds
from phoenix_hpc.errors import FaultError, SubmitError
from phoenix_hpc.drills.drill import VERIFIED_KINDS, match_outcome
from phoenix_hpc.drills.in_job import IN_JOB_KINDS
from phoenix_hpc.faults.kinds import KINDS

POLL_S = 0.25  # seconds between polls of the job's journal


def _submit(config: Path, cfg, site: str, run_dir: Path, extra: tuple[str, ...] = ()) -> tuple[str, dict]:
    """Submit one run of the drill through ``phoenix submit`` (same validation, files and script; ``extra``:
    more options, e.g. ``--chain 1``): ``cfg`` (loaded from ``config``) with the folders it writes moved into
    ``run_dir`` (:func:`phoenix_hpc.drills.folders.isolated_config`; ``RUN_DIR/config.yaml`` keeps them).
    Returns the job id and the run's folders.

    Raises:
        ConfigError: what ``phoenix submit`` refuses in the config, naming ``config``.
    """
    import tempfile

    from phoenix_hpc.cli.submit import submit
    from phoenix_hpc.drills.folders import config_yaml, isolated_config
    from phoenix_hpc.errors import ConfigError
    from phoenix_hpc.status.runs import record_run

    run_cfg, folders = isolated_config(cfg, run_dir)
    buf = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="phoenix-drill-") as tmp:
        derived = Path(tmp) / f"{run_dir.name}.yaml"
        derived.write_text(config_yaml(run_cfg))
        try:
            with contextlib.redirect_stdout(buf):
                submit.main(args=[str(derived), "--site", site, "--run-dir", str(run_dir), "--json", *extra],
                            standalone_mode=False)
        except ConfigError as exc:  # the problems are the config's own (only the run's folders were changed)
            if exc.source != str(derived):
                raise
            raise ConfigError(exc.problems, source=f"{config} (as the drill submits it for {run_dir}, with its "
                                                   "own folders there)") from None
    try:
        job_id = str(json.loads(buf.getvalue())["job_id"])
    except (ValueError, KeyError) as exc:
        raise SubmitError(f"phoenix submit printed no job id: {buf.getvalue()[:200]!r} ({exc})") from None
    record_run(run_dir, job_id)
    return job_id, folders


class _Collector:
    """The job's status for the drill's polling: the run files and journal are read on every call, Slurm's view
    (``scontrol``) at most every ``slurm_every_s`` seconds (a poll must be cheap: after a recovery ends, the
    next fault must be sent before the job has run past its step)."""

    def __init__(self, run_dir: Path, slurm_every_s: float = 3.0):
        from phoenix_hpc.slurm.client import SlurmClient

        self.run_dir, self.client, self.slurm_every_s = run_dir, SlurmClient(), slurm_every_s
        self._slurm, self._slurm_t, self._job_id = None, -1e9, None

    def __call__(self):
        from phoenix_hpc.status.collect import gather_slurm, read_run_files
        from phoenix_hpc.status.derive import derive_status

        from phoenix_hpc.control.journal import line_namer, read_journal_numbered

        run = read_run_files(self.run_dir)
        read = read_journal_numbered(self.run_dir)
        records, skipped = read.records, read.skipped
        job_id = str(run.job["job_id"]) if run.job and run.job.get("job_id") is not None else None
        if self._slurm is None or job_id != self._job_id or time.monotonic() - self._slurm_t >= self.slurm_every_s:
            nodes = sorted({str(r["node"]) for r in records if r.get("event") == E.Registered.NAME and r.get("node")})
            self._slurm, self._slurm_t, self._job_id = gather_slurm(self.client, job_id, nodes), time.monotonic(), job_id
        return derive_status(records, self._slurm, time.time(), run, journal_skipped=skipped, where=line_namer(read))


def _collector(run_dir: Path) -> _Collector:
    return _Collector(run_dir)


def _pending_reason(st) -> str:
    """``", reason <Slurm's Reason>"`` for a job Slurm holds PENDING (e.g. a node left down), else ``""``."""
    return f", reason {st.job.slurm_reason}" if st.job.slurm_reason else ""


def _wait(collect, until: Callable, timeout_s: float, on_poll: Callable, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        st = collect()
        on_poll(st)
        if until(st):
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout_s:g}s (job {st.job.job_id}: state {st.job.state}, "
                               f"Slurm {st.job.slurm_state or '-'}{_pending_reason(st)}, step {st.job.step})")
        time.sleep(POLL_S)


@click.command("drill")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--site", required=True, metavar="NAME|PATH", help="site profile (e.g. local)")
@click.option("--faults", "n_faults", type=int, default=3, show_default=True, help="number of faults to inject")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random plan")
@click.option("--kinds", default=None,
              help=f"comma-separated kinds to draw from (of {', '.join(KINDS)}; link-down and gpu-error only when "
                   f"named) [default: {','.join(VERIFIED_KINDS)}; with checkpoint.restart in-job: "
                   f"{','.join(IN_JOB_KINDS)}, the only kinds that mode accepts]")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder for the drill's runs (default runs/drill-<name>-<time>)")
@click.option("--reference", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory of a finished fault-free run of the same config to compare with")
@click.option("--timeout-s", type=Seconds(min=10), default=3600.0, show_default=True,
              help="limit for each wait (job start, each recovery, job end)")
@click.option("--kill-batch-host-at", "batch_host_at", type=int, default=None, metavar="STEP",
              help="after the drawn faults, kill the batch host (the node of the batch script and the coordinator) "
                   "at this step; the run continues through the chain (submitted with --chain 1 when the config "
                   "has none); local cluster only; --faults 0 drills this alone")
@click.option("--dry-run", is_flag=True, help="print the fault plan; submit nothing")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def drill(config, site, n_faults, seed, kinds, run_dir, reference, timeout_s, dry_run, as_json, batch_host_at):
    """Submit a job, inject N random faults, and check it recovers to the fault-free result."""
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.config.resolve import resolve
    from phoenix_hpc.drills.drill import plan_drill
    from phoenix_hpc.profiles import load_profile

    cfg = load_job_config(config)
    profile = load_profile(site)
    from phoenix_hpc.drills.in_job import drill_mode

    rz = cfg.resilience
    in_job = drill_mode(rz.enabled, rz.mode, rz.checkpoint.restart) == "in-job"
    if kinds is None:
        kinds = ",".join(IN_JOB_KINDS if in_job else VERIFIED_KINDS)
    elif "" in (names := [k.strip() for k in kinds.split(",")]) and any(names):  # none at all: plan_drill says so
        raise FaultError(f"--kinds: an empty name (two commas in a row, or one at an end) in {kinds!r}; give a "
                         f"comma-separated list of {', '.join(KINDS)}")
    if in_job and batch_host_at is not None:
        raise FaultError("--kill-batch-host-at: not with resilience.checkpoint.restart = in-job (the batch host's "
                         "loss ends the allocation, not an srun step); drill it with resilience.mode = phoenix")
    base = Path(run_dir or Path("runs") / f"drill-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}").absolute()
    job = resolve(cfg, profile, run_dir=str(base / "job"), default_python=sys.executable)
    plan = [] if (n_faults == 0 and batch_host_at is not None) else plan_drill(
        n_faults, seed, steps=cfg.training.steps, world=job.world_size, gpus_per_node=job.gpus_per_node,
        spare_nodes=job.spares, kinds=[k.strip() for k in kinds.split(",") if k.strip()], k=cfg.resilience.k,
        in_job=in_job, checkpoint_every=_checkpoint_every(cfg), dp=job.dp,
        protect_every_max=cfg.resilience.protect_every_max, replica_agreement=cfg.resilience.replica_agreement)
    extra: tuple[str, ...] = ()
    if batch_host_at is not None:
        from phoenix_hpc.drills.drill import check_batch_host_step

        if profile.name != "local":
            raise FaultError(f"--kill-batch-host-at: only on the local cluster (site local), not site {profile.name!r}: "
                             "the drill kills the node's slurmd and processes itself")
        check_batch_host_step(batch_host_at, cfg.training.steps, plan)
        if cfg.resources.chain < 1:
            extra = ("--chain", "1")
            resolve(cfg.model_copy(update={"resources": cfg.resources.model_copy(update={"chain": 1})}), profile,
                    run_dir=str(base / "job"), default_python=sys.executable)  # the site allows a chain (exit 2)
    if dry_run:
        rows = [{"index": f.index, "kind": f.kind, "phase": f.phase, "at_step": f.at_step,
                 "planned_logical_rank": f.rank, "note": f.note}
                for f in plan]
        if as_json:
            click.echo(json.dumps({"plan": rows, "kill_batch_host_at": batch_host_at,
                                   "mode": "in-job" if in_job else "phoenix"}, indent=2))
        else:
            if in_job:
                click.echo("in-job checkpoint-restart drill: each fault must end the srun step and restart it in "
                           "the allocation from the newest checkpoint, without one spare node")
            for r in rows:
                click.echo(f"fault {r['index'] + 1}: {r['kind']} at step {r['at_step']}, phase {r['phase']}, "
                           f"logical rank {r['planned_logical_rank']}" + (f" ({r['note']})" if r["note"] else ""))
            if batch_host_at is not None:
                click.echo(f"then: kill the batch host at step {batch_host_at}; the chain continues the run")
        return
    if not as_json:
        for f in plan:
            if f.note:
                click.echo(f"fault {f.index + 1}: {f.note}", err=True)
    report = _run(config, site, cfg, base, plan, reference, timeout_s, as_json, batch_host_at, extra, in_job)
    _print_report(report, as_json)
    if not report["passed"]:
        sys.exit(1)


def _given_folders(run_dir: Path) -> dict | None:
    """The folders (:func:`phoenix_hpc.drills.folders.run_folders`) of a run the drill did not submit
    (``--reference``), from its ``config.yaml``; None when that cannot be read (the report only)."""
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.drills.folders import run_folders

    try:
        return run_folders(load_job_config(run_dir / "config.yaml"), run_dir)
    except Exception:  # noqa: BLE001 -- informative only: the reference's final hash decides
        return None


def _checkpoint_every(cfg) -> int | None:
    """``resilience.checkpoint.interval_steps`` when the job writes persistent checkpoints
    (:func:`phoenix_hpc.launch.persist.enabled`), else None."""
    from phoenix_hpc.launch.persist import enabled

    return cfg.resilience.checkpoint.interval_steps if enabled(cfg) else None


def _run(config, site, cfg, base: Path, plan, reference, timeout_s, as_json, batch_host_at=None,
         extra: tuple[str, ...] = (), in_job: bool = False) -> dict:
    from phoenix_hpc.cli.output import LineProgress, make_console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from phoenix_hpc.drills.drill import DrillOutcome, landed_ts, quiesce_by_generation
    from phoenix_hpc.status.runs import check_run_dir

    steps = cfg.training.steps
    console = make_console(stderr=True)
    outcomes = [DrillOutcome(f) for f in plan]
    report: dict = {"config": str(config), "site": site, "base": str(base), "faults": [], "passed": False,
                    "nodes_killed": [], "nodes_revived": [], "mode": "in-job" if in_job else "phoenix"}
    job_id = ref_job_id = None
    st = ref = st_faults = None

    def over(s) -> bool:  # the drill job ended (in-job: not an in-job restart between two srun steps)
        if not in_job:
            return s.finished
        from phoenix_hpc.drills.in_job import run_over

        return run_over(s.finished, s.job.slurm_state, s.job.in_job_restart)
    lines = None if as_json or console.is_terminal else LineProgress(lambda t: click.echo(t, err=True))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=as_json or lines is not None) as progress:
        task = progress.add_task("reference", total=steps)

        def show(desc):
            def update(s):
                progress.update(task, description=desc, completed=s.job.step or 0)
                if lines is not None:  # not a terminal: a line per stage, and every few seconds of progress
                    lines.update(desc, s.job.step, s.job.steps_total)
            return update

        try:
            # --- the fault-free reference -------------------------------------------------------------
            if reference is not None:
                ref_dir = check_run_dir(reference)
                ref_folders = _given_folders(ref_dir)
            else:
                ref_dir = base / "reference"
                ref_job_id, ref_folders = _submit(config, cfg, site, ref_dir)
            ref = _wait(_collector(ref_dir), lambda s: s.finished, timeout_s, show("fault-free reference run"),
                        "reference run")
            report["reference"] = {"run_dir": str(ref_dir), "job_id": ref.job.job_id, "state": ref.job.state,
                                   "final_hash": ref.job.final_hash, "folders": ref_folders}
            if ref.job.state != "done" or not ref.job.final_hash:
                raise FaultError(f"--reference: {ref_dir} did not finish cleanly (state {ref.job.state}); "
                                 "a drill needs a fault-free final hash to compare with")

            # --- the drill job ------------------------------------------------------------------------
            job_dir = base / "job"
            job_id, job_folders = _submit(config, cfg, site, job_dir, extra)
            report["job"] = {"run_dir": str(job_dir), "job_id": job_id, "folders": job_folders}
            collect = _collector(job_dir)
            progress.reset(task, total=steps, description="waiting for the job to train")
            def trains(s):
                return over(s) or (s.job.state == "running" and s.job.coordinator is not None and bool(s.slots)
                                      and s.job.slurm_state in (None, "RUNNING"))

            st = _wait(collect, trains, timeout_s, show("starting"), "job start")
            for out in outcomes:
                if over(st):
                    out.error = f"job ended ({st.job.state}, Slurm {st.job.slurm_state or '-'}) before this fault"
                    continue
                st, stop = _drill_fault(out, st, collect, job_dir, report, timeout_s, show, len(outcomes),
                                        over, in_job)
                if stop:
                    break
            if batch_host_at is not None and not st.finished:
                st_faults = st = _wait(collect, lambda s: s.finished or (s.job.step or 0) >= batch_host_at,
                                       timeout_s, show(f"batch host at step {batch_host_at}"), "the batch host's step")
                if not st.finished:
                    _kill_batch_host(st, report)
            try:
                st = _wait(collect, _run_over if batch_host_at is not None else over, timeout_s,
                           show("finishing"), "job end")
            except TimeoutError as exc:
                report["error"] = str(exc)
        except KeyboardInterrupt:
            report["error"] = "interrupted"
            raise
        except TimeoutError as exc:
            report["error"] = str(exc)
        finally:
            if job_id is not None and (st is None or not over(st)):
                _cancel(job_id)
            if ref_job_id is not None and (ref is None or not ref.finished):
                _cancel(ref_job_id)
            report["nodes_revived"] = _revive(site, report["nodes_killed"])
    if st is not None and "batch_host" in report:
        from phoenix_hpc.drills.drill import batch_host_outcome

        bh = report["batch_host"]
        report["batch_host"] = batch_host_outcome(st.run_jobs, bh["job_id"], bh["node"], bh["killed_at_step"])
    st_end = st
    if batch_host_at is not None and st_faults is not None:
        st = st_faults  # the drawn faults are matched in the first job's records
    if st is not None:
        # each fault's recovery started after it landed and before the next one landed
        match = _in_job_matcher(base / "job") if in_job else (lambda out, before_ts: match_outcome(out, st, before_ts))
        if in_job:  # every landing is known before the first match
            for out in outcomes:
                match(out, None)
        ts = [landed_ts(o) for o in outcomes]
        for i, out in enumerate(outcomes):
            later = [t for t in ts[i + 1:] if t is not None]
            match(out, min(later) if later else None)
        with contextlib.suppress(Exception):  # the quiesce column is informative only
            from phoenix_hpc.status.collect import read_records

            quiesce = quiesce_by_generation(read_records(base / "job")[0])
            for out in outcomes:
                out.quiesce_s = quiesce.get(out.generation) if out.generation is not None else None
    st = st_end
    report["faults"] = [o.to_json() for o in outcomes]
    report["final_state"] = st.job.state if st is not None else None
    report["final_hash"] = st.job.final_hash if st is not None else None
    ref_hash = report.get("reference", {}).get("final_hash")
    report["hash_equal"] = bool(report["final_hash"]) and report["final_hash"] == ref_hash
    report["passed"] = (report["hash_equal"] and report["final_state"] == "done" and "error" not in report
                        and all(o.passed for o in outcomes)
                        and (batch_host_at is None or report.get("batch_host", {}).get("passed", False)))
    return report


def _in_job_matcher(job_dir: Path):
    """``match(outcome, before_ts)`` of an in-job drill (:func:`phoenix_hpc.drills.in_job.match_in_job`) over
    the job's whole journal, landing records and ``in_job_restarts.jsonl`` as they are now."""
    from phoenix_hpc.control.in_job import read_restarts
    from phoenix_hpc.control.journal import read_journal
    from phoenix_hpc.drills.in_job import match_in_job
    from phoenix_hpc.faults.trigger import read_fired

    records, fired, restarts = read_journal(job_dir), read_fired(job_dir), read_restarts(job_dir)
    return lambda out, before_ts: match_in_job(out, records, fired, restarts, before_ts)


def _run_over(s) -> bool:
    """A chained run is over: its newest job (the one ``job.json`` names, which the chain's next job
    takes over when it starts) ended, and no job of the chain is still queued after it."""
    last = s.run_jobs[-1] if s.run_jobs else None
    return s.job.state == "done" or (s.finished and (last is None or (last.job_id == s.job.job_id and last.end not in (
        "queued", "running", "not started"))))


def _kill_batch_host(st, report: dict) -> None:
    """Kill the job's batch host on the local cluster (its slurmd, slurmstepd and their processes: the batch
    script, the coordinator, the node's slots), as a node that fails would vanish."""
    from phoenix_hpc.slurm.cluster import kill_node, load_cluster

    host = st.job.batch_host
    if not host:
        raise FaultError("--kill-batch-host-at: Slurm names no batch host for the job")
    report["nodes_killed"].append(host)
    report["batch_host"] = {"node": host, "job_id": st.job.job_id, "killed_at_step": st.job.step}
    kill_node(load_cluster(), host)


def _drill_fault(out, st, collect, job_dir: Path, report: dict, timeout_s: float, show, n: int,
                 over: Callable = lambda s: s.finished, in_job: bool = False):
    """Send one planned fault at its planned step, wait until it landed, then until the recovery it causes
    has ended. Returns ``(status, give_up)``.

    The fault is sent once, for exactly its planned step and phase: a request the target refuses (it had
    already started the step) or one that missed it (the target was lost, the job ended) is not sent again
    later; the fault fails and so does the drill (it did not land where planned). ``give_up``: a wait timed
    out (the drill stops sending faults).
    """
    from phoenix_hpc.errors import FaultMissed
    from phoenix_hpc.drills.drill import CORRUPT_COMPANION, resolve_target
    from phoenix_hpc.drills.inject import build_request, inject, job_over_probe
    from phoenix_hpc.slurm.client import SlurmClient

    f = out.fault
    label = f"fault {f.index + 1}/{n}: {f.kind} @ {f.phase}"
    progress = show(label)
    progress(st)
    try:
        out.rank, out.target_world_rank, out.target_node = resolve_target(f, st)
        kind = f.kind
        if kind == "corrupt-replica":  # corrupt a holder's copy of the shard, landing in the recovery that the
            # target's crash causes at the planned step (drills/drill.py)
            cor = build_request(st, kind, rank=out.rank, at_step=f.at_step, phase="recovery")
            out.corrupt_request_id = cor.request_id
            inject(job_dir, st, cor, wait=False, job_over=job_over_probe(job_dir, SlurmClient()))
            kind = CORRUPT_COMPANION
        req = build_request(st, kind, rank=out.rank, at_step=f.at_step, phase=f.phase)
        if req.kind == "kill-node":
            report["nodes_killed"].append(req.node)
        out.at_step, out.request_id = req.at_step, req.request_id
        inject(job_dir, st, req, land_timeout_s=timeout_s, job_over=job_over_probe(job_dir, SlurmClient()))
    except FaultMissed as exc:
        out.error = f"missed: {exc}"
        return collect(), False
    except FaultError as exc:
        out.request_id = None
        out.error = f"not injected: {exc}"
        return collect(), False
    except Exception as exc:  # noqa: BLE001 - ControlError, OSError: report it, go on with the drill
        out.error = f"not injected: {exc}"
        return collect(), False

    def settled(s, out=out):
        if in_job:  # the restart it caused, over every srun step's records
            _in_job_matcher(job_dir)(out, None)
        else:
            match_outcome(out, s)
        return over(s) or out.recovery_state in ("done", "fallback", "aborted")

    try:
        st = _wait(collect, settled, timeout_s, progress, label)
    except TimeoutError as exc:
        out.error = str(exc)
        return st, True
    return st, False


def _cancel(job_id: str) -> None:
    """scancel a drill job left running (interrupted or given up)."""
    from phoenix_hpc.slurm.client import SlurmClient

    with contextlib.suppress(Exception):
        SlurmClient().cancel(job_id)


def _revive(site: str, nodes: list[str]) -> list[str]:
    """Local cluster: start the slurmd of the nodes the drill killed again, so the cluster is whole for the
    next run (:func:`phoenix_hpc.slurm.cluster.revive_node`). Returns the nodes revived."""
    if site != "local" or not nodes:
        return []
    from phoenix_hpc.errors import ClusterError
    from phoenix_hpc.slurm import procs
    from phoenix_hpc.slurm.cluster import load_cluster, revive_node

    try:
        cluster = load_cluster()
    except ClusterError:
        return []
    done = []
    for node in dict.fromkeys(nodes):
        key = f"slurmd:{node}"
        if node in cluster.nodes and key in cluster.daemons and not procs.is_alive(cluster.daemons[key]):
            with contextlib.suppress(Exception):
                cluster = revive_node(cluster, node)
                done.append(node)
    return done


def _print_report(report: dict, as_json: bool) -> None:
    """The per-fault table, the hashes and the verdict (``--json``: the report dict as JSON)."""
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    from phoenix_hpc.cli.output import make_console
    from phoenix_hpc.status.text import REPLAYED_MEANS
    from rich.table import Table

    t = Table(title=f"Drill of {report['config']} on {report['site']} (job {report.get('job', {}).get('job_id')})",
              title_justify="left")
    in_job = report.get("mode") == "in-job"
    phase_cols = ("teardown", "relaunch", "replay") if in_job else ("reconfigure", "params", "optimizer", "replay")
    for c in ("#", "kind", "target", "step/phase", "landed", "action", "detect",
              *(() if in_job else ("quiesce",)), *phase_cols, "total", "replayed", "result"):
        t.add_column(c)

    def s(v):
        return "-" if v is None else f"{v:.2f}s"

    for f in report["faults"]:
        landed = ", ".join(f"w{x['world_rank']}:{x['step']}/{x['phase']}" for x in f["landed"]) or "-"
        target = (f"rank {f['target_logical_rank']}" + (f" (w{f['target_world_rank']}@{f['target_node']})"
                                          if f["target_node"] else ""))
        if f["passed"]:
            result = "[green]ok[/green]"
        elif f["error"]:
            result = f"[red]{f['error']}[/red]"
        elif not f["landed_as_requested"]:
            result = "[red]not landed as requested[/red]"
        elif f["action"] != f["expected_action"]:
            result = f"[red]{f['action'] or 'no recovery'}, expected {f['expected_action']}[/red]"
        else:
            result = f"[red]{f['recovery_state'] or 'not recovered'}[/red]"
        t.add_row(str(f["index"] + 1), f["kind"], target, f"{f['at_step'] or f['planned_step']}/{f['phase']}",
                  landed, f["action"] or "-", s(f["detect_s"]), *(() if in_job else (s(f["quiesce_s"]),)),
                  *(s(f["phases"].get(p)) for p in phase_cols),
                  s(f["total_s"]), "-" if f["steps_replayed"] is None else str(f["steps_replayed"]), result)
    c = make_console()
    c.print(t)
    for f in report["faults"]:
        if f.get("plan_note"):
            c.print(f"fault {f['index'] + 1} as planned: {f['plan_note']}")
    if in_job:
        c.print("in-job restart: detect fault -> first record of it; teardown -> the srun step ended and the next "
                "nodes chosen; relaunch -> the new step's coordinator started; replay -> the new step's ranks "
                "restored the checkpoint and are back at the fault's step; total: fault -> back at that step")
    else:
        c.print("quiesce: recovery start -> plan, survivors leaving the step they were in (bounded by the "
                "collective timeout); reconfigure/params/optimizer: the slowest member's time each; total: fault -> "
                "replay done")
    c.print(REPLAYED_MEANS)
    bh = report.get("batch_host")
    if bh:
        c.print(f"batch host {bh['node']} of job {bh['job_id']} killed at step {bh['killed_at_step']}: "
                f"ended by {bh.get('cause') or '?'} (Slurm {bh.get('slurm_state') or '?'}); job {bh.get('next_job_id') or '-'} "
                f"of the chain resumed from "
                + (f"checkpoint {bh['resume_step']}" if bh.get("resume_step") is not None else "step 0")
                + f" and ended {bh.get('next_end') or '-'}; steps lost {bh.get('lost_steps')}"
                + (f" (committed {bh['committed_lost_steps']})" if bh.get("committed_lost_steps") is not None else ""))
    if report.get("nodes_revived"):
        c.print(f"nodes killed by the drill and revived afterwards: {', '.join(report['nodes_revived'])}")
    if report.get("error"):
        c.print(f"[red]error: {report['error']}[/red]")
    ref_hash = report.get("reference", {}).get("final_hash")
    c.print(f"reference (fault-free) final hash: {ref_hash or '-'}")
    c.print(f"drill job final hash:             {report.get('final_hash') or '-'} (job state {report['final_state']})")
    if report["hash_equal"]:
        c.print("final state: [green]identical to the fault-free reference[/green]")
    elif not report.get("final_hash") or not ref_hash:
        c.print("final state: [red]not compared: " + ("the drill job" if ref_hash else "the reference run")
                + " did not finish[/red]")
    else:
        c.print("final state: [red]DIFFERENT from the fault-free reference[/red]")
    if report.get("base"):
        c.print(f"run directory: {report['base']} (the runs: {report.get('reference', {}).get('run_dir') or '-'} "
                f"and {report.get('job', {}).get('run_dir') or '-'}; `phoenix status RUN_DIR` shows each)")
    for run in ("reference", "job"):
        folders = report.get(run, {}).get("folders")
        if folders:
            c.print(f"{run} run's folders: " + ", ".join(
                f"{k} {v}" + (" (only read)" if k == "load_megatron" else "") for k, v in folders.items() if v))
    c.print("[green]drill passed[/green]" if report["passed"] else "[red]drill failed[/red]")
