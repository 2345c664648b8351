"""Resolve a job config against a site profile: fill site defaults, derive dp, check every relation (pure).

``resolve(cfg, profile, run_dir=..., default_python=...) -> ResolvedJob`` is a pure function: it reads no files,
no environment and no clock; the caller passes the absolute run directory and the python interpreter of the
submitting process. Checks (all problems are collected and raised together in one :class:`ConfigError`):

- grid: ``tp x pp x dp = nodes x GPUs per node`` (dp derived when omitted);
- batch: ``global_batch_size`` is a multiple of ``micro_batch_size x dp``;
- resilience (mode ``phoenix``): ``k < dp`` (each shard's k holders are DP peers other than the owner);
  ``placement_levels`` are levels of the site's failure-domain model; every shard can get k holders on
  nodes other than its owner's (:func:`phoenix_hpc.topology.generation_placement` at node level over the
  generation-0 layout); a warning when ``spares == 0``;
- scheduler: QOS / partition known to the profile; ``nodes + spares`` within the site, QOS and partition node
  limits; ``time_limit`` a valid Slurm time within the QOS / partition limit; values that go on ``#SBATCH``
  lines use a safe charset; node pinning (``-w``/``-x``) only where the site allows it;
- host memory (resilience mode ``phoenix``, built-in engine and model): the buffers PHOENIX holds per node
  (:func:`phoenix_hpc.config.host_memory.plan_host_memory`, ``2 x snapshot + 2k x optimizer shard`` per rank)
  must fit the site's ``node.mem_gb`` minus the headroom; close to it is a warning;
- node failures (site ``node.mttf_h`` set): the expected node failures over the time limit and the spares
  needed so that none has to shrink the job with probability 0.99
  (:func:`phoenix_hpc.model.spares.plan_spares`); a warning when ``spares`` is fewer;
- engine ``megatron``: refused on a site without real CUDA GPUs (``node.gpu_model`` null); the GPU memory
  per rank (:func:`phoenix_hpc.config.memory.estimate_gpu_memory`) must fit ``node.gpu_mem_gb``; problems
  found by the caller that need megatron-core itself (version, model build; ``extra_problems``) are listed
  with the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phoenix_hpc.config.host_memory import HostMemoryPlan, host_memory_check, plan_host_memory
from phoenix_hpc.config.memory import GB, MemoryEstimate, estimate_gpu_memory, memory_advice
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.errors import ConfigError, ModelError, ReplicationError
from phoenix_hpc.model.spares import SparesPlan, plan_spares, shrink_shape
from phoenix_hpc.profiles.model import SBATCH_SAFE, SiteProfile
from phoenix_hpc.profiles.slurm_time import format_slurm_time, parse_slurm_time
from phoenix_hpc.topology import generation_placement, node_of_rank_blocked
from phoenix_hpc.hostlist import check_hostlist


#: Accounts the shipped examples use as placeholders (examples/perlmutter-7b.yaml): warned about at submit.
PLACEHOLDER_ACCOUNTS = frozenset({"m0000_g"})


#: seconds the coordinator waits for the members' write of a planned end's final checkpoint (phoenix's format)
FINAL_WRITE_TIMEOUT_S = 120.0


def final_write_timeout_s(save_megatron: bool, collective_timeout_s: float) -> float:
    """How long the coordinator's write round of a planned end waits for the members (seconds):
    :data:`FINAL_WRITE_TIMEOUT_S` for the shards of phoenix's format; with
    ``resilience.checkpoint.save_megatron`` the members then also write that step in Megatron-LM's layout
    before answering (:mod:`phoenix_hpc.launch.final_megatron`): ``collective_timeout_s`` more for the
    export's rendezvous and the same again for its engine and write. Pure."""
    if not save_megatron:
        return FINAL_WRITE_TIMEOUT_S
    return 2 * FINAL_WRITE_TIMEOUT_S + float(collective_timeout_s)


def warning_lead_s(signal_before_end_s: int, final_write_s: float, collective_timeout_s: float,
                   heartbeat_timeout_s: float, save_megatron: bool = False) -> int:
    """Seconds before the time limit at which the job asks Slurm for its warning signal: the site's
    ``signal_before_end_s``, raised when a planned end could need more. A planned end (docs/design.md
    section 7) first waits for the members' ``stopping`` answers (at most ``collective_timeout_s +
    heartbeat_timeout_s``, the coordinator's round deadline), then for the write; the measured write time
    ``final_write_s`` is doubled for the file system's variance. Slurm may send the signal up to 60 s
    *earlier* than asked (sbatch(1), ``--signal``), never later. Pure.

    With ``save_megatron`` (``resilience.checkpoint.save_megatron``) the final checkpoint is written twice,
    the second time in Megatron-LM's layout after a rendezvous of the members
    (:mod:`phoenix_hpc.launch.final_megatron`): ``collective_timeout_s + 2 x final_write_s`` more (the
    Megatron-LM write taken as long as phoenix's: the same tensors).

    Example: 30 + 10 + 2 x 30 = 100 s needed, site 120 s -> 120; with ``save_megatron`` 100 + 30 + 60 = 190."""
    need = collective_timeout_s + heartbeat_timeout_s + 2.0 * final_write_s
    if save_megatron:
        need += collective_timeout_s + 2.0 * final_write_s
    return max(int(signal_before_end_s), int(-(-need // 1)))


@dataclass(frozen=True)
class ResolvedJob:
    """A job config made concrete for one site.

    ``config`` is the job config with every defaulted field filled in (dp, GPUs per node, account, QOS,
    partition, constraint, absolute run_dir) and is what ``phoenix submit`` writes to ``RUN_DIR/config.yaml``.
    """

    config: JobConfig
    site: str
    tp: int
    pp: int
    dp: int
    nodes: int  # active nodes
    spares: int  # spare nodes (standby slots), same job
    gpus_per_node: int  # rank slots per node (srun --ntasks-per-node)
    time_limit_s: int
    python: str  # interpreter on the compute nodes
    nodelist: str | None = None  # sbatch -w (only where the site allows pinning)
    exclude: str | None = None  # sbatch -x (only where the site allows pinning)
    warnings: tuple[str, ...] = field(default_factory=tuple)
    memory: MemoryEstimate | None = None  # GPU memory per rank (engine megatron on a site with gpu_mem_gb)
    host_memory: HostMemoryPlan | None = None  # PHOENIX's host buffers per node (mode phoenix, built-in model)
    spares_plan: SparesPlan | None = None  # node failures over the time limit (site node.mttf_h set)
    mttf_source: str | None = None  # "published" or "assumption" (the site profile's node.mttf_source)
    warning_lead_s: int = 120  # sbatch --signal=B:SIG@s: seconds before the time limit (warning_lead_s())

    @property
    def run_dir(self) -> str:
        return self.config.run_dir  # always set (absolute) after resolve

    @property
    def total_nodes(self) -> int:
        """Nodes requested from Slurm: active + spare."""
        return self.nodes + self.spares

    @property
    def world_size(self) -> int:
        """Active logical ranks: tp x pp x dp."""
        return self.tp * self.pp * self.dp

    @property
    def time_limit(self) -> str:
        return format_slurm_time(self.time_limit_s)


def _grid(cfg: JobConfig, gpn: int, problems: list[str]) -> int | None:
    tp, pp, nodes = cfg.parallelism.tp, cfg.parallelism.pp, cfg.resources.nodes
    slots = nodes * gpn
    if cfg.parallelism.dp is None:
        if slots % (tp * pp):
            problems.append(
                f"parallelism: tp({tp}) x pp({pp}) = {tp * pp} does not divide {nodes} nodes x {gpn} GPUs = {slots}; "
                "dp cannot be derived (change tp, pp or resources.nodes)"
            )
            return None
        return slots // (tp * pp)
    dp = cfg.parallelism.dp
    if tp * pp * dp != slots:
        problems.append(
            f"parallelism: tp({tp}) x pp({pp}) x dp({dp}) = {tp * pp * dp} does not match "
            f"{nodes} nodes x {gpn} GPUs = {slots}"
        )
        return None
    return dp


def _placement_problems(cfg: JobConfig, gpn: int, dp: int) -> list[str]:
    """Node-level feasibility of replica placement at generation 0 (ranks fill nodes in order, ``gpn`` per
    node, as a block-distributed srun gives): every shard needs k holders on nodes other than its owner's.
    Levels above ``node`` depend on which nodes Slurm picks and are checked when the job starts."""
    nodes = [f"node{i}" for i in range(cfg.resources.nodes)]
    try:
        generation_placement((cfg.parallelism.tp, cfg.parallelism.pp, dp), cfg.resilience.k,
                             node_of_rank_blocked(nodes, gpn))
    except ReplicationError as exc:
        return [f"resilience.k: {exc}"]
    return []


def _limit_checks(label: str, limits, total_nodes: int, nodes: int, spares: int, time_s: int | None,
                  time_text: str, problems: list[str]) -> None:
    if limits.max_nodes is not None and total_nodes > limits.max_nodes:
        problems.append(
            f"resources.spares: nodes({nodes}) + spares({spares}) = {total_nodes} exceeds the {label} limit of "
            f"{limits.max_nodes} nodes"
        )
    if time_s is not None and limits.max_time_s is not None and time_s > limits.max_time_s:
        problems.append(
            f"resources.time_limit: {time_text!r} exceeds the {label} limit of {limits.max_time}"
        )



def warmup_warning(warmup_steps: int, steps: int, schedule: str) -> str | None:
    """A warning when the warm-up does not end before the last step: the learning rate then rises for the whole
    run (to ``steps / warmup_steps`` of ``training.lr``) and the ``lr_schedule`` decay never starts
    (:func:`phoenix_hpc.engines.schedule.lr_at`); None otherwise. Pure."""
    if warmup_steps <= 0 or warmup_steps < steps:
        return None
    return (f"training.warmup_steps ({warmup_steps}) is not less than training.steps ({steps}): the learning rate "
            f"rises for the whole run, to {steps / warmup_steps:.3g} x training.lr at the last step, and the "
            f"{schedule} decay to training.min_lr never starts; lower warmup_steps (or raise steps) if that is not "
            "meant")

def sample_warmup_warning(training) -> str | None:
    """:func:`warmup_warning` for a run counted in samples (``training.train_samples``): a warning when the
    warm-up of ``lr_warmup_samples`` does not end before the samples the run trains (``steps x
    global_batch_size``), so the learning rate rises for the whole run (possible with an ``lr_decay_samples``
    beyond ``train_samples``); None otherwise, and for a run counted in steps. Pure."""
    t = training
    if t.train_samples is None or not t.lr_warmup_samples:
        return None
    trained = t.steps * t.global_batch_size
    if t.lr_warmup_samples < trained:
        return None
    return (f"training.lr_warmup_samples ({t.lr_warmup_samples}) is not less than the {trained} samples the run "
            f"trains (training.steps {t.steps} x global_batch_size {t.global_batch_size}): the learning rate rises "
            f"for the whole run, to {trained / t.lr_warmup_samples:.3g} x training.lr at the last step, and the "
            f"{t.lr_schedule} decay to training.min_lr never starts; lower lr_warmup_samples (or raise train_samples) "
            "if that is not meant")


def resolve(
    cfg: JobConfig,
    profile: SiteProfile,
    *,
    run_dir: str,
    default_python: str,
    python: str | None = None,
    nodelist: str | None = None,
    exclude: str | None = None,
    extra_problems: tuple[str, ...] | list[str] = (),
) -> ResolvedJob:
    """Resolve ``cfg`` for ``profile``.

    Args:
        run_dir: absolute run directory (the caller picks it: ``cfg.run_dir`` or a default).
        default_python: interpreter to use when neither ``python`` nor ``profile.launcher.python`` is set
            (``phoenix submit`` passes ``sys.executable``, i.e. the project's venv).
        python: explicit interpreter override (``phoenix submit --python``).
        nodelist / exclude: Slurm hostlists for ``-w`` / ``-x``.
        extra_problems: problems the caller found (``phoenix submit``: the megatron-core checks of
            :func:`phoenix_hpc.engines.megatron_spec.submit_problems`), reported with these.

    Raises:
        ConfigError: every violated relation, one line each, naming the field, the value and what is allowed.
    """
    problems: list[str] = list(extra_problems)
    warnings: list[str] = []
    res, sch = cfg.resources, profile.scheduler

    gpn = res.gpus_per_node or profile.node.gpus_per_node
    if res.gpus_per_node and profile.node.gpu_model and res.gpus_per_node > profile.node.gpus_per_node:
        problems.append(
            f"resources.gpus_per_node: {res.gpus_per_node} exceeds the {profile.node.gpus_per_node} GPUs of a "
            f"{profile.name} node"
        )
    dp = _grid(cfg, gpn, problems)

    if dp is not None:
        mb, gb = cfg.training.micro_batch_size, cfg.training.global_batch_size
        if gb % (mb * dp):
            problems.append(
                f"training.global_batch_size: {gb} must be a multiple of micro_batch_size({mb}) x dp({dp}) = {mb * dp}"
            )

    rz = cfg.resilience
    if rz.enabled and rz.mode == "phoenix":
        if dp is not None and rz.k >= dp:
            problems.append(
                f"resilience.k: {rz.k} must be < dp ({dp}): each shard's k replicas live on DP peers other than "
                f"its owner (allowed: 1..{dp - 1})" if dp > 1 else
                f"resilience.k: {rz.k} needs dp >= 2 (dp is 1: no DP peer can hold a replica); "
                "set resilience.enabled: false or mode: checkpoint-restart, or use more data-parallel ranks"
            )
        unknown = [lv for lv in rz.placement_levels if lv not in profile.failure_domains.levels]
        if unknown:
            problems.append(
                f"resilience.placement_levels: {unknown} are not failure-domain levels of site {profile.name} "
                f"(allowed: {profile.failure_domains.levels})"
            )
        if dp is not None and 1 <= rz.k < dp and not unknown:
            problems += _placement_problems(cfg, gpn, dp)
            if len(rz.placement_levels) > 1 and profile.failure_domains.source == "none":
                warnings.append(
                    f"resilience.placement_levels {rz.placement_levels}: site {profile.name} has no failure-domain "
                    "source (failure_domains.source: none), so replicas can only be spread over nodes"
                )
    warmup = (warmup_warning(cfg.training.warmup_steps, cfg.training.steps, cfg.training.lr_schedule)
              or sample_warmup_warning(cfg.training))
    warnings += [warmup] if warmup else []
    if rz.enabled and res.spares == 0:
        warnings.append(
            "resources.spares is 0 with resilience enabled: a node loss cannot be hot-swapped and falls back to "
            "the persistent checkpoint"
        )

    account = res.account if res.account is not None else sch.account
    if account is None and sch.account_expected:
        warnings.append(f"resources.account is not set: site {profile.name} expects -A (your project; see the "
                        "site profile); sbatch falls back to your default account, if Slurm has one for you")
    if account in PLACEHOLDER_ACCOUNTS:
        warnings.append(f"resources.account: {account!r} is the example's placeholder, not a project: set your "
                        f"project on site {profile.name} (sbatch refuses an account that does not exist)")
    qos = res.qos if res.qos is not None else sch.qos
    partition = res.partition if res.partition is not None else sch.partition
    constraint = res.constraint if res.constraint is not None else sch.constraint
    for fname, val in (("account", account), ("qos", qos), ("partition", partition), ("constraint", constraint)):
        if val is not None and not SBATCH_SAFE.match(val):
            problems.append(
                f"resources.{fname}: {val!r} contains characters Slurm does not accept here "
                "(allowed: letters, digits and _ . , : @ % + = / & | [ ] * ! -)"
            )
    if qos is not None and sch.qos_limits and qos not in sch.qos_limits:
        problems.append(
            f"resources.qos: {qos!r} is not a QOS of site {profile.name} (allowed: {sorted(sch.qos_limits)}; "
            "add it to the site profile's scheduler.qos_limits)"
        )
    if partition is not None and sch.partition_limits and partition not in sch.partition_limits:
        problems.append(
            f"resources.partition: {partition!r} is not a partition of site {profile.name} "
            f"(allowed: {sorted(sch.partition_limits)}; add it to the site profile's scheduler.partition_limits)"
        )

    time_s: int | None
    try:
        time_s = parse_slurm_time(res.time_limit)
    except ValueError as exc:
        problems.append(f"resources.time_limit: {exc}")
        time_s = None
    lead = warning_lead_s(sch.signal_before_end_s, sch.final_write_s, cfg.resilience.collective_timeout_s,
                          cfg.resilience.heartbeat_timeout_s, save_megatron=bool(cfg.resilience.checkpoint.save_megatron))
    if time_s is not None and time_s <= lead:
        problems.append(
            f"resources.time_limit: {res.time_limit!r} must be longer than the warning signal lead ({lead} s: "
            f"the site's scheduler.signal_before_end_s {sch.signal_before_end_s} s, or what the final checkpoint "
            "needs, whichever is longer)"
        )
    if res.chain > sch.max_chain:
        problems.append(f"resources.chain: {res.chain} is more than site {profile.name} allows (scheduler.max_chain "
                        f"{sch.max_chain}); allowed: 0 to {sch.max_chain}")

    total = res.nodes + res.spares
    _limit_checks(f"site {profile.name}", sch.limits, total, res.nodes, res.spares, time_s, res.time_limit, problems)
    if qos in sch.qos_limits:
        _limit_checks(f"QOS {qos!r}", sch.qos_limits[qos], total, res.nodes, res.spares, time_s, res.time_limit,
                      problems)
    if partition in sch.partition_limits:
        _limit_checks(f"partition {partition!r}", sch.partition_limits[partition], total, res.nodes, res.spares,
                      time_s, res.time_limit, problems)

    for fname, val in (("nodelist", nodelist), ("exclude", exclude)):
        if val is None:
            continue
        if not sch.allow_node_pinning:
            problems.append(
                f"{fname}: site {profile.name} does not allow requesting or excluding specific nodes at submission"
            )
        else:
            try:
                check_hostlist(val, f"--{fname}")
            except ConfigError as exc:
                problems += exc.problems

    memory = None
    if cfg.engine == "megatron":
        memory = _megatron_memory(cfg, profile, dp, problems, warnings)
    host = None
    if rz.enabled and rz.mode == "phoenix" and dp is not None and cfg.model.factory is None \
            and cfg.engine in ("torch", "megatron"):
        host = plan_host_memory(cfg, dp, gpn, profile.node)
        problem, warning = host_memory_check(host, cfg, dp, profile.name)
        problems += [problem] if problem else []
        warnings += [warning] if warning else []
    spares_plan = None
    if profile.node.mttf_h is not None and dp is not None and time_s is not None:
        spares_plan = _spares_plan(cfg, profile, dp, gpn, time_s, warnings)

    interpreter = python or profile.launcher.python or default_python
    if not interpreter or "\0" in interpreter:
        problems.append(f"launcher.python: {interpreter!r} is not a usable interpreter path")

    if problems:
        raise ConfigError(problems, source=f"job {cfg.name!r} on site {profile.name}")

    filled = cfg.model_copy(
        update={
            "run_dir": run_dir,
            "parallelism": cfg.parallelism.model_copy(update={"dp": dp}),
            "resources": res.model_copy(
                update={
                    "gpus_per_node": gpn,
                    "account": account,
                    "qos": qos,
                    "partition": partition,
                    "constraint": constraint,
                }
            ),
        }
    )
    return ResolvedJob(
        config=filled,
        site=profile.name,
        tp=cfg.parallelism.tp,
        pp=cfg.parallelism.pp,
        dp=dp,
        nodes=res.nodes,
        spares=res.spares,
        gpus_per_node=gpn,
        time_limit_s=time_s,
        python=interpreter,
        nodelist=nodelist,
        exclude=exclude,
        warnings=tuple(warnings),
        memory=memory,
        host_memory=host,
        spares_plan=spares_plan,
        mttf_source=profile.node.mttf_source if spares_plan is not None else None,
        warning_lead_s=lead,
    )


#: probability that no node failure has to shrink the job, which ``spares`` should reach (a warning if not)
SPARES_TARGET = 0.99


def _spares_plan(cfg: JobConfig, profile: SiteProfile, dp: int, gpn: int, time_s: int,
                 warnings: list[str]) -> SparesPlan | None:
    """The expected node failures of the active nodes over the time limit (site ``node.mttf_h``), and a
    warning when ``resources.spares`` is below the spares needed for :data:`SPARES_TARGET`."""
    node, res = profile.node, cfg.resources
    try:
        plan = plan_spares(res.nodes, node.mttf_h, time_s / 3600, SPARES_TARGET, dp=dp,
                           shape=shrink_shape(cfg.parallelism.tp, cfg.parallelism.pp, dp, gpn), spares=res.spares)
    except ModelError:  # a grid that does not fill whole nodes: the grid check reports it
        return None
    if res.spares < plan.spares_needed:
        tag = "" if node.mttf_source == "published" else " [assumption of the site profile]"
        warnings.append(
            f"resources.spares: {res.spares} is fewer than the {plan.spares_needed} needed for P(no shrink) >= "
            f"{SPARES_TARGET:g}: {plan.expected_failures:.2f} node failures expected over the time limit "
            f"({res.nodes} nodes x {time_s / 3600:g} h / node MTTF {node.mttf_h:g} h{tag}); with {res.spares} "
            f"spare(s) P(no shrink) = {plan.p_no_shrink:.3f}, and a node loss beyond the spares cannot be "
            f"hot-swapped (a shrink costs {plan.lost_per_shrink:.1%} of the throughput); more resources.spares, "
            f"or `phoenix model spares` to plan them"
        )
    return plan


def _megatron_memory(cfg: JobConfig, profile: SiteProfile, dp: int | None, problems: list[str],
                     warnings: list[str]) -> MemoryEstimate | None:
    """Engine ``megatron``: real CUDA GPUs on the site, and the estimated GPU memory per rank within
    ``node.gpu_mem_gb`` (with ``model.provider``: estimated from the model fields, and a warning says so)."""
    node = profile.node
    if node.gpu_model is None:
        problems.append(
            f"engine: 'megatron' needs real CUDA GPUs, and site {profile.name} has none (node.gpu_model is null"
            f"{'; its GPUs are fake gres' if profile.name == 'local' else ''}) (allowed here: torch)"
        )
        return None
    if dp is None:
        return None
    est = estimate_gpu_memory(cfg, dp)
    if cfg.model.provider is not None:
        warnings.append(f"GPU memory per rank estimated for the GPTModel of the model fields ({est.summary()}): "
                        f"model.provider {cfg.model.provider!r} builds its own model, which the estimate cannot see")
    if node.gpu_mem_gb is None:
        warnings.append(f"GPU memory per rank not checked: site {profile.name} sets no node.gpu_mem_gb "
                        f"(estimate {est.summary()})")
    elif est.total > node.gpu_mem_gb * GB:
        problems.append(
            f"GPU memory: a rank needs about {est.summary()}, more than the {node.gpu_mem_gb:g} GB of one "
            f"{node.gpu_model} (site {profile.name}, node.gpu_mem_gb); change {memory_advice(cfg)}"
        )
    return est
