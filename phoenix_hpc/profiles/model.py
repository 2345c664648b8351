"""The site profile (``sites/*.yaml``): what a machine offers and how jobs are launched on it. Data only.

Shape of a profile file (see ``sites/perlmutter.yaml`` for a commented one)::

    name: perlmutter
    description: ...
    scheduler:  {account, qos, partition, constraint, limits, qos_limits, partition_limits, allow_node_pinning,
                 request_gpus, request_mem, signal, signal_before_end_s, max_chain, final_write_s,
                 run_root, extra_sbatch}
    node:       {gpus_per_node, gpu_model, gpu_mem_gb, cores_per_node, mem_gb, nics, host_reserved_gb,
                 host_per_rank_gb, mttf_h, mttf_source}
    launcher:   {srun_mpi, gpu_bind, cpus_per_task, cpu_bind, torch_huge_pages, extra_srun, python,
                 coordinator_timeout_s}
    environment: {modules, env}
    failure_domains: {levels, source, rule}

All fields are checked when the profile is loaded (:func:`phoenix_hpc.profiles.load_profile`); relations with a
job config (QOS limits, GPUs per node, failure-domain levels) are checked by :func:`phoenix_hpc.config.resolve.resolve`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from phoenix_hpc.profiles.slurm_time import parse_slurm_time

# strict types (no bool as a number, no number as text, no 2.5 as an int) and no NaN/infinity, as in the job
# config (phoenix_hpc.config.schema)
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

# Characters allowed in values that go on ``#SBATCH`` lines. sbatch parses those lines itself (not bash), so
# they are restricted to a charset that needs no quoting at all instead of being quoted.
SBATCH_SAFE = re.compile(r"^[A-Za-z0-9_.,:@%+=/&|\[\]*!-]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_sbatch_safe(value: str | None, what: str) -> str | None:
    if value is not None and not SBATCH_SAFE.match(value):
        raise ValueError(
            f"{what} {value!r} contains characters not allowed on an #SBATCH line "
            "(allowed: letters, digits and _ . , : @ % + = / & | [ ] * ! -)"
        )
    return value


class Limits(BaseModel):
    """Limits of one QOS or partition. ``None`` means no limit known."""

    model_config = _STRICT
    max_nodes: int | None = Field(None, ge=1, description="most nodes one job may request")
    max_time: str | None = Field(None, description="longest time limit, Slurm format ([D-]HH:MM:SS)")

    @field_validator("max_time")
    @classmethod
    def _time(cls, v):
        if v is not None:
            parse_slurm_time(v)
        return v

    @property
    def max_time_s(self) -> int | None:
        return None if self.max_time is None else parse_slurm_time(self.max_time)


class SchedulerProfile(BaseModel):
    """Scheduler defaults and policy. The defaults apply when the job config leaves a field unset."""

    model_config = _STRICT
    account: str | None = Field(None, description="default account (-A); usually set per job")
    account_expected: bool = Field(False, description="warn at submit when no account (-A) is set")
    qos: str | None = Field(None, description="default QOS (-q)")
    partition: str | None = Field(None, description="default partition (-p)")
    constraint: str | None = Field(None, description="default node feature constraint (-C)")
    limits: Limits = Field(default_factory=Limits, description="limits for every job (e.g. the machine's size)")
    qos_limits: dict[str, Limits] = Field(default_factory=dict, description="limits per QOS name")
    partition_limits: dict[str, Limits] = Field(default_factory=dict, description="limits per partition name")
    allow_node_pinning: bool = Field(True, description="whether -w/--nodelist and -x/--exclude may be used")
    request_gpus: bool = Field(True, description="ask for GPUs with --gpus-per-node (False: whole nodes only)")
    request_mem: bool = Field(False, description="whether --mem may be rendered")
    signal: str = Field("USR1", description="signal sent to the batch shell before the time limit")
    signal_before_end_s: int = Field(120, ge=0, le=65535, description="seconds before the limit (sbatch --signal); must cover the final checkpoint write")
    max_chain: int = Field(10, ge=0, description="most jobs a run may queue after its first to continue itself "
                                               "(resources.chain); 0: chaining is not allowed on this site")
    final_write_s: float = Field(30.0, gt=0, description="measured seconds the final checkpoint takes to write "
                                                         "(the journal's checkpoint.write_s of a planned end); "
                                                         "signal_before_end_s must leave room for it and the "
                                                         "members' stop round")
    run_root: str | None = Field(None, description="where `phoenix submit` puts run directories (and so their "
                                                   "checkpoints) by default; $VARS are expanded (e.g. "
                                                   "$SCRATCH/phoenix/runs); none: ./runs")
    extra_sbatch: list[str] = Field(default_factory=list, description="extra sbatch options, one token each")

    @field_validator("account", "qos", "partition", "constraint")
    @classmethod
    def _safe(cls, v, info):
        return _check_sbatch_safe(v, f"scheduler.{info.field_name}")

    @field_validator("signal")
    @classmethod
    def _sig(cls, v):
        """A signal name both ``sbatch --signal`` and bash's ``trap`` take: a Linux signal's name, with or
        without ``SIG`` (Python's :class:`signal.Signals`, which holds this host's signals), except those no
        handler can catch (KILL, STOP) and the real-time range (RTMIN, RTMAX: offsets, not names)."""
        import signal

        names = sorted(s.name.removeprefix("SIG") for s in signal.Signals if s.name.startswith("SIG")
                       and s.name not in ("SIGKILL", "SIGSTOP", "SIGRTMIN", "SIGRTMAX"))
        if not isinstance(v, str) or v.removeprefix("SIG") not in names:
            raise ValueError(f"scheduler.signal {v!r} is not a signal name (allowed: {', '.join(names)}; "
                             "e.g. USR1)")
        return v.removeprefix("SIG")

    @field_validator("extra_sbatch")
    @classmethod
    def _extra(cls, v):
        for tok in v:
            if not tok.startswith("-") or not SBATCH_SAFE.match(tok):
                raise ValueError(f"scheduler.extra_sbatch entry {tok!r} must be one option token like --exclusive")
        return v


class NodeProfile(BaseModel):
    """Hardware of one compute node."""

    model_config = _STRICT
    gpus_per_node: int = Field(..., ge=1, description="GPUs per node; on CPU-only sites the rank slots per node")
    gpu_model: str | None = Field(
        None, description="e.g. A100-40GB; null: no real CUDA GPUs (CPU-only sites, and the local cluster, "
        "whose gres GPUs are fake): engine megatron is refused there"
    )
    gpu_mem_gb: float | None = Field(
        None, gt=0, description="memory of one GPU in GB; submit checks a megatron job's estimate against it "
        "(null: not checked)"
    )
    cores_per_node: int = Field(..., ge=1, description="physical CPU cores per node")
    mem_gb: int | None = Field(None, ge=1, description="host memory per node in GB; submit checks the host "
                               "memory PHOENIX plans per node against it (null: not checked)")
    nics: int = Field(1, ge=0, description="high-speed network interfaces per node")
    nic_gbps: float | None = Field(
        None, gt=0, description="line rate of one high-speed NIC, Gb/s (e.g. 200 for Slingshot 11, 400 for NDR "
        "InfiniBand); `phoenix model hotswap` moves a lost rank's state over it (null: no link figure, the "
        "projection is refused)")
    host_reserved_gb: float = Field(
        8.0, ge=0, description="host memory per node kept for the OS, Slurm, file-system clients and the page "
        "cache (part of the headroom submit leaves below node.mem_gb)"
    )
    host_per_rank_gb: float = Field(
        6.0, ge=0, description="host memory of each rank's process besides PHOENIX's buffers: Python, torch and "
        "the CUDA context, NCCL/MPI buffers, data-loader workers, pinned staging (part of the headroom)"
    )
    mttf_h: float | None = Field(
        None, gt=0, description="mean time to failure of one node, hours; submit prints the expected node "
        "failures over the time limit and warns when spares are fewer than needed (null: not computed)"
    )
    mttf_source: Literal["published", "assumption"] = Field(
        "assumption", description="where node.mttf_h comes from: published by the site, or an assumption of the "
        "profile (submit tags the numbers so)"
    )


    @model_validator(mode="after")
    def _mem_needs_gpu(self):
        """``gpu_mem_gb`` only with a ``gpu_model``."""
        if self.gpu_mem_gb is not None and self.gpu_model is None:
            raise ValueError(f"node.gpu_mem_gb ({self.gpu_mem_gb}) needs node.gpu_model (null means no real GPUs)")
        return self


class LauncherProfile(BaseModel):
    """How the one srun step over all nodes is started."""

    model_config = _STRICT
    srun_mpi: str = Field(..., description="srun --mpi plugin (cray_shasta, pmix, ...)")
    gpu_bind: str | None = Field(None, description="srun --gpu-bind value; null: not rendered")
    cpus_per_task: int | None = Field(None, ge=1, description="srun/sbatch --cpus-per-task; null: not rendered")
    cpu_bind: str | None = Field(None, description="srun --cpu-bind value; null: not rendered")
    torch_huge_pages: bool = Field(
        False, description="export THP_MEM_ALLOC_ENABLE=1 to the ranks (a value in the submitting environment is "
        "kept; environment.env must not set it then): torch's CPU allocations of >= 2 MiB ask for transparent huge "
        "pages (madvise), so a killed rank's exit, which its detection waits for, grows far less with them; off by "
        "default: on CPU ranks sharing cores it made protected steps slower in an A/B (docs/design.md section 6); "
        "false: not rendered")
    extra_srun: list[str] = Field(default_factory=list, description="extra srun arguments, shell-quoted")
    python: str | None = Field(None, description="python on the compute nodes; null: the one running phoenix submit")
    coordinator_timeout_s: int = Field(120, ge=1, description="seconds to wait for RUN_DIR/coordinator.json")

    @field_validator("srun_mpi", "gpu_bind", "cpu_bind")
    @classmethod
    def _tok(cls, v, info):
        if v is not None and not re.match(r"^[A-Za-z0-9_.,:=-]+$", v):
            raise ValueError(f"launcher.{info.field_name} {v!r} must be a single srun option value")
        return v


#: The variable ``launcher.torch_huge_pages`` renders (torch's c10 ``alloc_cpu``, torch 2.2 and later).
TORCH_THP_VARIABLE = "THP_MEM_ALLOC_ENABLE"


class EnvironmentProfile(BaseModel):
    """Modules to load and variables to export before the srun step (the interconnect set-up)."""

    model_config = _STRICT
    modules: list[str] = Field(default_factory=list, description="module load arguments, in order")
    env: dict[str, str] = Field(default_factory=dict, description="environment variables exported to every rank")

    @field_validator("env")
    @classmethod
    def _names(cls, v):
        bad = [k for k in v if not ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"environment.env names {bad} are not valid shell variable names")
        return v


class DomainRule(BaseModel):
    """Failure domains from the node name: ``regex`` must capture a group ``index`` (an integer); the domain of
    level L is ``index // blocks[L]`` (nodes per domain of that level)."""

    model_config = _STRICT
    regex: str = Field(..., description="regex with a named group 'index', matched against the node name")
    blocks: dict[str, int] = Field(..., description="nodes per domain, per level")

    @field_validator("regex")
    @classmethod
    def _re(cls, v):
        try:
            rx = re.compile(v)
        except re.error as exc:
            raise ValueError(f"failure_domains.rule.regex {v!r} does not compile: {exc}") from None
        if "index" not in rx.groupindex:
            raise ValueError(f"failure_domains.rule.regex {v!r} has no named group (?P<index>...)")
        return v

    @field_validator("blocks")
    @classmethod
    def _blocks(cls, v):
        bad = {k: n for k, n in v.items() if n < 1}
        if bad:
            raise ValueError(f"failure_domains.rule.blocks {bad} must be >= 1")
        return v


class FailureDomainProfile(BaseModel):
    """The failure-domain model (docs/design.md section 5): levels from most specific (``node``) to least
    specific, and where a node's domains come from: ``slurm_topology`` (``scontrol show topology``,
    topology/tree), ``topology_addr`` (``SLURM_TOPOLOGY_ADDR`` in each task, e.g. ``spine.leaf0.nid00001``),
    or ``rule``."""

    model_config = _STRICT
    levels: list[str] = Field(default_factory=lambda: ["node"], description="domain levels, node first")
    source: Literal["slurm_topology", "topology_addr", "rule", "none"] = "none"
    rule: DomainRule | None = None

    @model_validator(mode="after")
    def _check(self):
        if not self.levels or self.levels[0] != "node":
            raise ValueError(f"failure_domains.levels {self.levels} must start with 'node'")
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"failure_domains.levels {self.levels} has duplicates")
        if self.source == "rule":
            if self.rule is None:
                raise ValueError("failure_domains.source 'rule' needs failure_domains.rule")
            missing = [lv for lv in self.levels[1:] if lv not in self.rule.blocks]
            if missing:
                raise ValueError(f"failure_domains.rule.blocks lacks levels {missing}")
        return self


class SiteProfile(BaseModel):
    """A whole site profile. Build with :func:`phoenix_hpc.profiles.load_profile`; frozen."""

    model_config = _STRICT
    name: str = Field(..., min_length=1, description="site name (the file's stem for built-in sites)")
    description: str = ""
    scheduler: SchedulerProfile = Field(default_factory=SchedulerProfile)
    node: NodeProfile
    launcher: LauncherProfile
    environment: EnvironmentProfile = Field(default_factory=EnvironmentProfile)
    failure_domains: FailureDomainProfile = Field(default_factory=FailureDomainProfile)

    @model_validator(mode="after")
    def _one_place_for_huge_pages(self):
        """``launcher.torch_huge_pages`` renders ``THP_MEM_ALLOC_ENABLE``; the same variable in
        ``environment.env`` (rendered after it) would override the field without a word, so it is refused
        there while the field is true (with the field false the site may set it)."""
        if self.launcher.torch_huge_pages and TORCH_THP_VARIABLE in self.environment.env:
            raise ValueError(
                f"environment.env.{TORCH_THP_VARIABLE} ({self.environment.env[TORCH_THP_VARIABLE]!r}) is set while "
                f"launcher.torch_huge_pages is true, which renders that variable; allowed: one of them (set "
                f"launcher.torch_huge_pages: false to set the variable in environment.env)")
        return self
