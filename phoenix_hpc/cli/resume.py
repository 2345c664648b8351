"""``phoenix submit --resume RUN_DIR``: what may be resumed, and from which checkpoint.

A resumed run is the same logical run: the same run directory, its resolved ``config.yaml`` (unless a
config file overrides it), its checkpoint root, in a new Slurm job that starts from the newest complete
checkpoint (``launch/persist.py`` loads it at start-up). ``job.json`` keeps the list of the run's jobs.

:func:`check_resume` refuses (``SubmitError``, exit code 2, nothing submitted) a directory that is not a
run directory, a run whose newest job the runs index records for another Slurm cluster
(:func:`cluster_problem`), a run that finished (``job_done``), a run whose job Slurm still shows pending or running (a job whose coordinator has ended is given
:data:`END_WAIT_S` to leave Slurm first),
a run without a complete checkpoint, a newest complete checkpoint that fails its checks (a shard file
missing, of another size or failing its SHA-256; a DCP ``.metadata`` that cannot be read or names a data
file missing or too short), a config file that changes the run's model (``engine`` or a ``model`` field: the
checkpoint's tensors would not fit), a checkpoint that records another model than the config's, a config
whose grid cannot load it (another tp or pp; another dp for an engine that cannot re-partition its
optimizer, :mod:`phoenix_hpc.recovery.ckpt_compat`), and a checkpoint already at or past ``training.steps``
(``--steps`` when given; :func:`phoenix_hpc.recovery.continuation.nothing_left`, the rule a fresh submit uses).
A checkpoint written at another dp (a run that shrank) is re-partitioned by the ranks as they load it.
Every check runs before anything of the run directory is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from phoenix_hpc.control import events as E
from phoenix_hpc.control.run_jobs import job_entries
from phoenix_hpc.slurm.client import ACTIVE_JOB_STATES
from phoenix_hpc.errors import ConfigError, SlurmError, SubmitError

_ACTIVE = ACTIVE_JOB_STATES


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run starts: ``run_dir`` (absolute), the ``config`` to run, the checkpoint ``root``
    and ``step``, the ``previous`` job ids of the run, and the site it ran on."""

    run_dir: Path
    config: object
    root: Path
    step: int
    previous: list[str]
    site: str | None


def _job_json(run_dir: Path) -> dict:
    try:
        d = json.loads((run_dir / "job.json").read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


#: How long ``--resume`` waits for a job whose coordinator has ended to leave Slurm (seconds): the slots
#: exit and the batch script stops within the step grace of the generated script (30 s) plus Slurm's
#: job completion.
END_WAIT_S = 90.0


def _job_state(slurm, job_id: str) -> str | None:
    try:
        return (slurm.show_job(job_id) or {}).get("JobState")
    except SlurmError:
        return None  # Slurm no longer knows the job: it ended long ago


def coordinator_ended(records: list[dict], job_id: str | None = None) -> bool:
    """True when the journal's last coordinator record is ``coordinator_exit``: the job is ending (its slots
    exit and its batch script stops), although Slurm may still show it running for some seconds.

    ``job_id``: judge that job only: False while its coordinator has not started (a resumed or chained job
    that is queued or starting; the journal's last ``coordinator_exit`` is then an earlier job's)."""
    if job_id is not None:
        starts = [i for i, r in enumerate(records) if r.get("event") == E.CoordinatorStarted.NAME
                  and str(r.get("job_id")) == str(job_id)]
        if not starts:
            return False
        records = records[starts[0]:]
    marks = [r.get("event") for r in records if r.get("event") in (E.CoordinatorStarted.NAME, E.CoordinatorExit.NAME)]
    return bool(marks) and marks[-1] == E.CoordinatorExit.NAME


def wait_for_end(slurm, job_id: str, state: str | None, wait_s: float = END_WAIT_S, poll_s: float = 1.0,
                 clock=None, sleep=None) -> str | None:
    """Wait up to ``wait_s`` seconds for job ``job_id`` (whose coordinator has ended) to leave Slurm's
    active states; the last state seen (None: Slurm no longer knows it). Prints one line while it waits."""
    import sys
    import time

    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    print(f"--resume: job {job_id} has ended its training and is finishing ({state}); waiting up to "
          f"{wait_s:.0f} s for Slurm to end it", file=sys.stderr, flush=True)
    deadline = clock() + wait_s
    while state in _ACTIVE and clock() < deadline:
        sleep(poll_s)
        state = _job_state(slurm, job_id)
    return state


def _recorded(rd: Path) -> list[dict]:
    """The runs index's entries of run directory ``rd`` (:func:`phoenix_hpc.status.runs.known_runs`), newest
    first; none when the index cannot be read."""
    from phoenix_hpc.errors import StatusError
    from phoenix_hpc.status.runs import known_runs

    try:
        return [e for e in known_runs() if Path(e["run_dir"]) == rd]
    except (StatusError, OSError):
        return []


def cluster_problem(rd: Path, recorded: list[dict], identity: dict) -> str | None:
    """Why run directory ``rd`` cannot be resumed on the Slurm cluster ``identity``
    (:func:`phoenix_hpc.slurm.identity.cluster_identity`): its newest job was recorded for another cluster
    (``recorded``: its runs-index entries, newest first; one without a cluster says nothing). Its job ids are
    another cluster's (ids restart at 1 on every cluster), and its checkpoint path and data were set for that
    one. Pure; None when nothing says so."""
    from phoenix_hpc.status.runs import same_cluster

    known = [e for e in recorded if e.get("slurm_conf")]
    if not known or same_cluster(known[0], identity) is not False:
        return None
    e = known[0]
    return (f"--resume: {rd} is a run of another Slurm cluster: its job {e['job_id']} was submitted to cluster "
            f"{e.get('cluster')!r} (slurm.conf {e['slurm_conf']}), this command talks to cluster "
            f"{identity.get('cluster')!r} (slurm.conf {identity.get('slurm_conf')}); resume it with SLURM_CONF "
            "pointing at its own cluster; nothing was written or submitted")


def check_resume(run_dir: str | Path, config_override: Path | None = None, slurm=None,
                 steps: int | None = None) -> ResumePoint:
    """Check that ``run_dir`` can be resumed; return where it resumes.

    Args:
        run_dir: the run directory to resume.
        config_override: a job config file to run instead of the run's ``config.yaml`` (same grid).
        slurm: a :class:`phoenix_hpc.slurm.client.SlurmClient` to ask whether the run's job still runs
            (None: not asked).
        steps: ``phoenix submit --steps``, which replaces the config's ``training.steps`` (None: not given);
            a checkpoint at or past the steps to train is refused
            (:func:`phoenix_hpc.recovery.continuation.nothing_left`).

    Raises:
        SubmitError: the run cannot be resumed; the message names the reason.
        ConfigError: ``config_override`` is not a valid config.
    """
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.control.journal import read_journal
    from phoenix_hpc.recovery.ckpt_files import checkpoint_root
    from phoenix_hpc.recovery.ckpt_files import check_checkpoint, complete_steps
    from phoenix_hpc.slurm.identity import cluster_identity
    from phoenix_hpc.status.runs import is_run_dir

    rd = Path(run_dir).absolute()
    if not is_run_dir(rd):
        raise SubmitError(f"--resume: {str(run_dir)!r} is not a run directory (expected config.yaml and job.json, "
                          "as written by `phoenix submit`)")
    try:
        records = read_journal(rd)
    except (OSError, ValueError):
        records = []
    done = [r for r in records if r.get("event") == E.JobDone.NAME]
    if done:
        raise SubmitError(f"--resume: the run in {rd} finished (job_done at step {done[-1].get('step')}); "
                          "there is nothing to resume")
    why = cluster_problem(rd, _recorded(rd), cluster_identity())
    if why:
        raise SubmitError(why)
    job = _job_json(rd)
    jobs = [str(e["job_id"]) for e in job_entries(job)]
    if slurm is not None and jobs:
        state = _job_state(slurm, jobs[-1])
        if state in _ACTIVE and coordinator_ended(records, jobs[-1]):
            state = wait_for_end(slurm, jobs[-1], state)
        if state in _ACTIVE:
            queued = [j for j in job.get("jobs", []) if isinstance(j, dict) and str(j.get("job_id")) == jobs[-1]
                      and j.get("after")]
            if queued and state == "PENDING":
                raise SubmitError(f"--resume: job {jobs[-1]}, queued by the chain (resources.chain) to continue this "
                                  f"run, is still PENDING: it starts by itself when job {queued[0]['after']} ends "
                                  f"before the last step; to resume by hand instead, scancel {jobs[-1]} first")
            if not any(r.get("event") == E.CoordinatorStarted.NAME and str(r.get("job_id")) == jobs[-1] for r in records):
                resumed = [j for j in job.get("jobs", []) if isinstance(j, dict) and str(j.get("job_id")) == jobs[-1]
                           and j.get("resume_step") is not None]
                what = (f"the resume of this run from step {resumed[0]['resume_step']}" if resumed
                        else "this run's job")
                raise SubmitError(f"--resume: job {jobs[-1]}, {what}, is {state} and has not started training yet "
                                  f"(its coordinator has not started): it continues the run by itself; to resume "
                                  f"again instead, scancel {jobs[-1]} first")
            raise SubmitError(f"--resume: job {jobs[-1]} of this run is still {state}; stop it first "
                              f"(scancel --signal=TERM {jobs[-1]} writes a final checkpoint)")
    cfg = load_job_config(config_override or rd / "config.yaml")
    if config_override is not None:
        _refuse_model_change(rd, cfg, config_override)
    root = checkpoint_root(cfg, rd)
    complete = complete_steps(root)
    if not complete:
        partial = sorted(p.name for p in root.glob("step_*")) if root.is_dir() else []
        raise SubmitError(f"--resume: no complete checkpoint under {root}"
                          + (f" (incomplete: {', '.join(partial)})" if partial else "")
                          + "; submit the config again to start the training over")
    step = complete[-1]
    p = cfg.parallelism
    grid = (p.tp, p.pp, p.dp) if p.dp else None
    problems = check_checkpoint(root, step, grid, engine=cfg.engine) + _layout_problems(root, step, cfg, grid)
    if problems:
        raise SubmitError("--resume: the newest complete checkpoint cannot be loaded: " + "; ".join(problems))
    from phoenix_hpc.recovery.continuation import nothing_left

    why = nothing_left(root, step, cfg.training.steps if steps is None else steps, resuming=True)
    if why:
        raise SubmitError(why)
    return ResumePoint(rd, cfg, root, step, jobs, job.get("site"))


def _refuse_model_change(rd: Path, cfg, config_override: Path) -> None:
    """Refuse a config passed with ``--resume`` whose ``engine`` or ``model`` differs from the run's
    (``RUN_DIR/config.yaml``, the config its checkpoints were written with).

    Raises:
        SubmitError: naming every changed field, its value in the file given and the run's.
    """
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.recovery.ckpt_compat import describe_changes, model_changes, model_record

    try:
        run_cfg = load_job_config(rd / "config.yaml")
    except ConfigError as exc:
        raise SubmitError(f"--resume: the run's {rd / 'config.yaml'} cannot be read to compare the model: "
                          f"{exc}") from None
    changes = model_changes(model_record(run_cfg), model_record(cfg))
    if changes:
        raise SubmitError(f"--resume: {config_override} changes the run's model, which its checkpoints cannot "
                          f"take: {describe_changes(changes, str(rd / 'config.yaml'), str(config_override))}; a "
                          "resumed run keeps its engine and model section (grid, steps and timings may change); "
                          "nothing was written or submitted")


def _layout_problems(root: Path, step: int, cfg, grid) -> list[str]:
    """What the checkpoint of ``step`` says of itself that keeps ``cfg`` from loading it: the model it records
    (``complete.json``'s ``engine`` and ``model``) differs from the config's, or (a DCP checkpoint) its
    ``.metadata`` is unreadable, a data file is missing or short, or its grid (from its envelope keys, for a
    marker that does not record it) cannot be loaded at ``grid``."""
    from phoenix_hpc.recovery.ckpt_compat import describe_changes, grid_problem, model_changes, model_record
    from phoenix_hpc.recovery.ckpt_files import COMPLETE, read_marker, step_dir

    marker = read_marker(root, step) or {}
    d = step_dir(root, step)
    problems = []
    if "model" in marker:
        changes = model_changes({"engine": marker.get("engine"), "model": marker["model"]}, model_record(cfg),
                                recorded_only=True)
        if changes:
            problems.append(f"checkpoint of step {step} was written by another model ({d / COMPLETE}): "
                            + describe_changes(changes, "the checkpoint", "the config"))
    if marker.get("kind") == "dcp" and (d / ".metadata").exists():
        from phoenix_hpc.recovery.checkpoint import dcp_layout

        ck_grid, found = dcp_layout(d)
        problems += [f"checkpoint of step {step}: {x}" for x in found]
        if not marker.get("grid"):
            why = grid_problem(step, ck_grid, grid, cfg.engine)
            if why:
                problems.append(why)
    return problems
