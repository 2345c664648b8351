"""The status of one PHOENIX job as plain dataclasses (what ``phoenix status`` shows and ``--json`` prints).

Times are unix seconds (float) unless a name says otherwise; ``*_s`` fields are durations in seconds;
``bytes_`` are bytes. Grid coordinates are ``[pp, dp, tp]`` lists, grids ``{"tp", "pp", "dp"}`` dicts.
Fields that cannot be known (no Slurm record, no journal yet) are ``None``, never guessed.

Inputs of :func:`phoenix_hpc.status.derive.derive_status` are :class:`SlurmInfo` and :class:`RunFiles`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from phoenix_hpc.control.view_records import (  # noqa: F401 - the journal fold's records, shown as they are
    AgreementRepair, DrainStatus, FaultStatus, InjectionStatus, RecoveryStatus)


@dataclass
class SlurmInfo:
    """What Slurm says about the job, gathered by :mod:`phoenix_hpc.status.collect`.

    ``job``: the ``scontrol show job -o`` record (JobState, NodeList = the *live* node list, BatchHost, ...);
    ``queue``: the job's ``squeue --json`` object; ``nodes``: ``scontrol show node -o`` record per node name;
    ``domains``: failure domains per node (``{node: {"switch": ..., "group": ...}}``, from ``scontrol show
    topology``); ``error``: why some of it is missing (Slurm down, job forgotten after MinJobAge).
    """

    job: dict[str, str] | None = None
    queue: dict[str, Any] | None = None
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)
    domains: dict[str, dict[str, str]] = field(default_factory=dict)
    error: str | None = None
    run_jobs: dict[str, dict[str, str]] = field(default_factory=dict)  # the run's other jobs: scontrol records
    # Slurm answered and knows no such job (it forgets ended jobs after MinJobAge): the job has ended
    no_record: bool = False
    # no Slurm controller could be asked (none configured, e.g. no SLURM_CONF; daemons down): nothing is known
    unreachable: bool = False


@dataclass
class RunFiles:
    """The files of a run directory other than the journal: ``config`` (``config.yaml`` as a dict),
    ``job`` (``job.json`` written by ``phoenix submit``), ``coordinator`` (``coordinator.json``),
    ``fired`` (landing records of injected faults, :func:`phoenix_hpc.faults.trigger.read_fired`),
    ``checkpoints`` (steps of the complete checkpoints on disk, :func:`phoenix_hpc.recovery.ckpt_files.complete_steps`),
    ``rank_steps`` (``(ts, step)`` of every step the ranks logged in ``ranks/rank*.steps.jsonl``; read only for a
    run of several jobs, where it shows how far a job whose coordinator died really got), ``rank_newest`` (the last
    line of each of those logs: the freshest live step)."""

    run_dir: str
    config: dict[str, Any] | None = None
    job: dict[str, Any] | None = None
    coordinator: dict[str, Any] | None = None
    fired: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    rank_steps: list[tuple[float, int]] = field(default_factory=list)
    # ``(ts, step)`` of the last line of each rank's step log: the newest step each rank finished, written
    # after every step (the journal's ``progress`` lags it by up to about a second plus the heartbeats)
    rank_newest: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class JobInfo:
    job_id: str | None
    name: str | None
    run_dir: str
    site: str | None
    state: str  # coordinator's view: pending|starting|running|recovering|fallback|done|failed|stopped|unknown
    slurm_state: str | None  # e.g. RUNNING, COMPLETED; None when Slurm has no record
    slurm_reason: str | None  # Slurm's Reason while PENDING (Resources, Priority, ReqNodeNotAvail, ...), else None
    batch_host: str | None
    node_list: list[str]  # live node list (scontrol NodeList), else the nodes slots registered from
    nodes: int | None  # active nodes requested
    spares: int | None  # spare nodes requested
    gpus_per_node: int | None
    grid: dict[str, int] | None
    k: int | None
    generation: int
    step: int | None  # live step: newest step the active slots finished (>= recoverable_step; see derive)
    steps_total: int | None
    recoverable_step: int | None
    checkpoint_step: int | None
    started_at: float | None
    ended_at: float | None
    end_event: str | None
    end_reason: str | None
    final_hash: str | None
    coordinator: dict[str, Any] | None
    end_signal: str | None = None  # the external signal that ended the job (USR1: time limit, TERM), if any
    jobs: list[str] = field(default_factory=list)  # the run's Slurm jobs, oldest first (phoenix submit --resume)
    end_cause: str | None = None  # what ended the job: finished, time limit, SIGTERM, failure, batch-host loss, coordinator loss
    # adaptive protection interval m (journal ``protect_interval``; runtime/interval.py): every m-th step is
    # protected and a fault loses at most 2m-1 finished steps (m + m' - 1 across a change of m); 1 = every step
    protect_every: int = 1
    # the newest srun step's coordinator asked for an in-job restart (journal ``restart_in_job``): its end, in
    # ``state``, is that step's, not the job's; from the same records as ``state``, so the two never disagree
    in_job_restart: bool = False
    # test-only variables (phoenix_hpc/test_env.py) the coordinator saw set, {name: value} (journal ``test_env``)
    test_env: dict[str, str] = field(default_factory=dict)
    # when (unix s) the newest record that gave ``step`` was written: the step is that old (``now - step_at``)
    step_at: float | None = None
    # no Slurm controller could be asked (SlurmInfo.unreachable): ``slurm_state`` None says nothing then
    slurm_unreachable: bool = False
    # the complete checkpoint this job of the run resumed from (``phoenix submit --resume``; None: step 0)
    resume_step: int | None = None
    # where the training metrics go (config.yaml's logging, status/metrics_sinks.py): {"tensorboard": folder or
    # None, "wandb": {project, entity, name, mode, dir} or None}; None: neither TensorBoard nor W&B is on
    metrics: dict[str, Any] | None = None


@dataclass
class RunJobStatus:
    """One Slurm job of a run (:mod:`phoenix_hpc.status.jobs`): ``chain_index`` 0 for a job ``phoenix
    submit`` submitted, n for the n-th one queued by the chain after it (``after``: the job it follows);
    ``resume_step`` the checkpoint it started from (None: step 0); ``last_step`` / ``committed_step`` the
    newest step it finished / committed; ``end`` its final journal record (or running, queued, none);
    ``cause`` what ended it; ``lost_steps`` / ``committed_lost_steps`` those steps the next job trained
    again."""

    job_id: str
    chain_index: int
    after: str | None
    resume_step: int | None
    last_step: int | None
    slurm_state: str | None
    batch_host: str | None
    end: str
    cause: str | None
    signal: str | None
    lost_steps: int | None
    committed_step: int | None = None
    committed_lost_steps: int | None = None


@dataclass
class NodeStatus:
    name: str
    slurm_state: str | None
    role: str  # active | spare | lost | drained (a planned drain moved its slots off) | idle (in the job, no live slot) | unknown
    domain: str | None  # the failure domain at the most general placement level (e.g. the switch)
    in_job: bool  # still in the job's live node list
    slots: list[int] = field(default_factory=list)  # world ranks


@dataclass
class SlotStatus:
    world_rank: int
    node: str
    pid: int | None
    state: str  # active | standby | joining | quiesced | dead | done
    logical_rank: int | None
    coord: list[int] | None  # [pp, dp, tp]
    generation: int | None  # generation the slot last joined (None for a standby slot)
    note: str = ""  # e.g. "replaced world rank 3", "node down", the reason of a death


@dataclass
class HolderStatus:
    logical_rank: int
    world_rank: int | None
    node: str | None
    domain: str | None
    alive: bool
    step: int | None  # committed replica step, if reported


@dataclass
class ReplicaStatus:
    shard_id: str
    owner_rank: int
    owner_world: int | None
    owner_node: str | None
    owner_domain: str | None
    owner_alive: bool
    holders: list[HolderStatus]
    live_holders: int
    committed_step: int | None  # newest step whose owner copy and all replicas are committed
    bytes_: int | None
    last_commit_at: float | None
    age_s: float | None  # now - last_commit_at
    source: str  # "reported" (commits named the holders) | "planned" (computed placement) | "unknown"
    # holders alive now whose replica the ranks reported as verified (CRC-checked on receipt) and committed,
    # and their failure domains (most general level known; node otherwise); None: no holder's copy reported
    verified_replicas: int | None = None
    verified_domains: list[str] = field(default_factory=list)


@dataclass
class StatusWarning:
    # no_spares | under_replicated | batch_host_down | coordinator_gone | slurm | placement | pending | test_env
    # | journal (records the journal fold skipped, control/view.py)
    code: str
    message: str
    action: str | None = None  # what the user can do (e.g. "phoenix status 1234 --cancel")


@dataclass
class Status:
    now: float
    job: JobInfo
    nodes: list[NodeStatus]
    slots: list[SlotStatus]
    replicas: list[ReplicaStatus]
    spare_slots_left: int | None
    spare_nodes_left: int | None
    recoveries: list[RecoveryStatus]
    faults: list[FaultStatus]
    injections: list[InjectionStatus]
    warnings: list[StatusWarning]
    progress: list[list[float]]  # [ts, live step] points where it changed, in time order
    commits: list[list[float]]  # [ts, recoverable step] points, in time order
    journal_records: int
    # every journal line or record not shown, with the reason (the ``journal`` warning names the first three)
    journal_skipped: list[str] = field(default_factory=list)
    run_jobs: list[RunJobStatus] = field(default_factory=list)  # the run's Slurm jobs, oldest first
    drains: list[DrainStatus] = field(default_factory=list)  # planned drains, oldest first
    # shrinks (docs/design.md section 6): {ts, generation, dp_from, dp_to, recoverable_step, freed, lost, drain}
    shrinks: list[dict[str, Any]] = field(default_factory=list)
    # replica agreement (docs/design.md section 6): {"checked", "disagreed", "last_step"} of the DP peers'
    # parameter digests, "undetectable" (why, with dp = 1), "rejected" (digests refused), "off" (why:
    # resilience.replica_agreement false); {} before any
    agreement: dict[str, Any] = field(default_factory=dict)
    # every difference replica agreement found, oldest first, with the repair from memory that followed (the
    # step and (pp, tp), the members named, the step restored and the steps replayed) or the stop
    repairs: list[AgreementRepair] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict (the ``--json`` output)."""
        return asdict(self)

    @property
    def finished(self) -> bool:
        """Whether the job has ended (journal's terminal event, or Slurm no longer runs it)."""
        from phoenix_hpc.status.derive import TERMINAL_STATES

        return self.job.state in TERMINAL_STATES
