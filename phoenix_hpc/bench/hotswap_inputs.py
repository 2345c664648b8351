"""The job a hot-swap projection scales, the sizes it may take, and the figures the benchmarks measured (in
bench/ because it reads a job config's memory estimate and the benchmarks' records; the formulas are
:mod:`phoenix_hpc.model.hotswap`).

Pure except :func:`read_record` (reads one JSON file). The example job is scaled by data parallelism: tp,
pp, the micro-batch and the batch per DP replica stay as configured, ``dp = N / (tp x pp)``, so the global
batch grows with dp and the step time stays the configured one (weak scaling; the gradient all-reduce's
growth with dp is not counted).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from phoenix_hpc.errors import ModelError

#: The sizes projected when ``--gpus`` is not given.
DEFAULT_GPUS = (1024, 4096, 16384, 100_000)
#: Where the benchmarks record their figures (the repository's BENCHMARKS.json).
DEFAULT_RECORD = Path(__file__).resolve().parents[2] / "BENCHMARKS.json"


def gpu_step(tp: int, pp: int, gpus_per_node: int) -> int:
    """The granularity of a size: whole model replicas (``tp x pp``) on whole nodes: ``lcm(tp pp, gpn)``."""
    return math.lcm(tp * pp, gpus_per_node)


def min_gpus(tp: int, pp: int, gpus_per_node: int, k: int) -> int:
    """The smallest size of the example: ``dp >= k + 1`` (each optimizer shard's k replicas live on DP peers
    other than its owner, docs/design.md section 5), rounded up to :func:`gpu_step`."""
    step = gpu_step(tp, pp, gpus_per_node)
    need = tp * pp * (k + 1)
    return -(-need // step) * step


def site_max_nodes(profile, qos: str | None, partition: str | None) -> tuple[int | None, str]:
    """The most nodes one job may have on ``profile`` with ``qos`` / ``partition``: the smallest of the
    machine's limit and that QOS's and partition's (as ``phoenix submit`` checks them), and which limit it is;
    ``(None, reason)`` when the profile gives none."""
    sch = profile.scheduler
    limits = [(sch.limits.max_nodes, f"site {profile.name} (scheduler.limits.max_nodes)")]
    if qos in sch.qos_limits:
        limits.append((sch.qos_limits[qos].max_nodes, f"QOS {qos!r} (scheduler.qos_limits)"))
    if partition in sch.partition_limits:
        limits.append((sch.partition_limits[partition].max_nodes,
                       f"partition {partition!r} (scheduler.partition_limits)"))
    known = [(n, what) for n, what in limits if n is not None]
    if not known:
        return None, f"site {profile.name} sets no node limit"
    return min(known)


def max_gpus(max_nodes: int | None, spares: int, tp: int, pp: int, gpus_per_node: int) -> int | None:
    """The largest size the site can allocate with the job's ``spares`` spare nodes: ``(max_nodes - spares) x
    gpn`` rounded down to :func:`gpu_step`; None without a limit."""
    if max_nodes is None:
        return None
    step = gpu_step(tp, pp, gpus_per_node)
    return max(0, (max_nodes - spares) * gpus_per_node) // step * step


def nearest_sizes(gpus: int, lowest: int, highest: int | None, step: int) -> list[int]:
    """The allowed sizes nearest to ``gpus``: multiples of ``step`` from ``lowest`` to ``highest`` (None: no
    upper bound; both bounds are multiples of ``step``, as :func:`min_gpus` and :func:`max_gpus` give them),
    the one at the least distance from ``gpus``, both when two are equally near (smaller first); ``[]`` when
    none is allowed (``highest < lowest``: the site cannot hold the job's smallest size)."""
    if highest is not None and highest < lowest:
        return []
    c = max(gpus, lowest) if highest is None else min(max(gpus, lowest), highest)
    down = c // step * step
    near = {n for n in (down, down + step) if n >= lowest and (highest is None or n <= highest)}
    best = min(abs(n - gpus) for n in near)
    return sorted(n for n in near if abs(n - gpus) == best)


def no_size_fits(lowest: int, highest: int, limit_what: str) -> str:
    """Why no size is allowed when the site allocates ``highest`` GPUs, fewer than the smallest size ``lowest``
    (``limit_what`` names the limit), and what to do."""
    return (f"{limit_what} allocates at most {highest} GPUs to this job (its spare nodes included), below its "
            f"smallest size of {lowest} GPUs (dp >= resilience.k + 1 on whole nodes): no size fits; give "
            "--beyond-site to project a larger machine of the same nodes and links")


def check_gpus(gpus: int, lowest: int, highest: int | None, step: int, limit_what: str,
               beyond_site: bool) -> None:
    """Refuse a size the projection cannot take: below ``lowest``, not a multiple of ``step``, or above
    ``highest`` (what the site allocates) unless ``beyond_site``. The message names the allowed sizes and
    the nearest of them (:func:`nearest_sizes`), or says that none is allowed.

    Raises:
        ModelError: naming ``--gpus``, the value and what is allowed."""
    top = None if beyond_site else highest
    if top is not None and top < lowest:
        raise ModelError(f"--gpus: {gpus!r} is not allowed; {no_size_fits(lowest, top, limit_what)}")
    sizes = (f"sizes are multiples of {step} GPUs (whole tp x pp model replicas on whole nodes) from {lowest}"
             + (f" to {top}" if top is not None else ""))
    bad = isinstance(gpus, bool) or not isinstance(gpus, int)
    nearest = "" if bad else f"; the nearest allowed: {' or '.join(map(str, nearest_sizes(gpus, lowest, top, step)))}"
    if bad or gpus < lowest:
        raise ModelError(f"--gpus: {gpus!r} is not allowed; the example's smallest size is {lowest} GPUs (dp >= "
                         f"resilience.k + 1 on whole nodes): {sizes}{nearest}")
    larger = ("; or give --beyond-site to project a larger machine of the same nodes and links"
              if top is not None and gpus > top else "")
    if gpus % step:
        raise ModelError(f"--gpus: {gpus} is not allowed; {sizes}{nearest}{larger}")
    if larger:
        raise ModelError(f"--gpus: {gpus} is not allowed; {limit_what} allocates at most {top} GPUs to this "
                         f"job (its spare nodes included): {sizes}{nearest}{larger}")


def scaled_state_bytes(cfg, dp_config: int, gpus: int) -> tuple[int, float, object]:
    """``(dp, state bytes, estimate)`` of the job config ``cfg`` (data-parallel size ``dp_config`` as resolved on
    its site) scaled to ``gpus`` GPUs (module docstring):
    the lost rank's weights and optimizer shard, ``weights + optimizer`` of
    :func:`phoenix_hpc.config.memory.estimate_gpu_memory` for the stage it picks (the one needing the most
    GPU memory), with the global batch scaled to keep the batch per DP replica."""
    from phoenix_hpc.config.memory import estimate_gpu_memory

    p, t = cfg.parallelism, cfg.training
    dp = gpus // (p.tp * p.pp)
    per_replica = max(t.micro_batch_size, t.global_batch_size // dp_config)
    scaled = cfg.model_copy(update={
        "parallelism": p.model_copy(update={"dp": dp}),
        "training": t.model_copy(update={"global_batch_size": per_replica * dp})})
    est = estimate_gpu_memory(scaled, dp)
    return dp, est.weights + est.optimizer, est


def microbatches(cfg, dp_config: int) -> int:
    """Micro-batches per step and DP replica of job config ``cfg`` (data-parallel size ``dp_config`` as
    resolved on its site): ``global_batch_size / (dp x micro_batch_size)``, at least 1; the scaled job keeps it
    (its batch per DP replica is kept, :func:`scaled_state_bytes`)."""
    t = cfg.training
    return max(1, max(t.micro_batch_size, t.global_batch_size // dp_config) // t.micro_batch_size)


def read_record(path: Path) -> tuple[dict | None, str]:
    """The benchmarks' record (``BENCHMARKS.json``) and a phrase naming it (its date and commit, and those of
    its ``control_plane`` section, which is measured apart); ``(None, reason)`` when the file does not exist.

    Raises:
        ModelError: the file exists but is not a JSON object (naming the file)."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except FileNotFoundError:
        return None, f"{p.name} not found"
    except (OSError, ValueError) as exc:
        raise ModelError(f"--benchmarks: {str(p)!r} is not allowed; it cannot be read as JSON ({exc})") from None
    if not isinstance(d, dict):
        raise ModelError(f"--benchmarks: {str(p)!r} is not allowed; expected a JSON object (a BENCHMARKS.json)")
    cp = d.get("control_plane")
    own = (f"; its control_plane section of {cp.get('date', '?')}, commit {cp.get('commit', '?')}"
           if isinstance(cp, dict) else "")
    return d, f"{p.name} of {d.get('date', '?')}, commit {d.get('commit', '?')}{own}"


#: The derived figure ``detect_silence_s - heartbeat_timeout_s`` of a control-plane run
#: (:func:`control_plane_points`).
SILENCE_BACKLOG = "silence_backlog_s"
#: The derived figure ``detect_to_quiesce_s + quiesce_s + plan_delivered_s`` of a control-plane run: the
#: coordinator's part of a recovery from the detection to the plan in every member's queue (the recovery
#: opened, every survivor's ``quiesced`` received, the plan made, pushed). ``quiesce_s`` runs from
#: ``recovery_start`` to ``recovery_plan``, which the coordinator journals after making the plan, so it holds
#: ``plan_s``; ``plan_delivered_s`` runs from ``recovery_plan`` to ``recovery_plan_sent``
#: (``phoenix_hpc/bench/control_plane.py``, ``phoenix_hpc/control/recovery_machine.py``).
CONTROL_ROUND = "control_round_s"
_CONTROL_ROUND_PARTS = ("detect_to_quiesce_s", "quiesce_s", "plan_delivered_s")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def control_plane_points(record: dict | None, key: str) -> tuple[list[tuple[int, float]] | None, str]:
    """The control-plane benchmark's ``(ranks, value)`` of figure ``key`` (``detect_exit_s``,
    ``plan_deliver_s`` = ``plan_s + plan_delivered_s``, :data:`SILENCE_BACKLOG` = ``detect_silence_s -
    heartbeat_timeout_s``, :data:`CONTROL_ROUND` = ``detect_to_quiesce_s + quiesce_s + plan_delivered_s``,
    ...), from ``record["control_plane"]["runs"]`` (or ``record["runs"]`` when ``record`` is the benchmark's
    own JSON), runs marked unusable (``error``), runs without an integer ``ranks`` >= 1 and figures that are
    not finite numbers left out; ``(None, reason)`` when the record has no control-plane runs."""
    from phoenix_hpc.bench.control_plane_report import derived

    rec = record or {}
    cp = rec.get("control_plane")
    if cp is None and isinstance(rec.get("runs"), list):  # the benchmark's own JSON (its --json FILE)
        cp = rec
    if not isinstance(cp, dict) or not isinstance(cp.get("runs"), list):
        return None, ("control-plane record missing (BENCHMARKS.json has no control_plane section; "
                      "scripts/bench-control-plane --update-benchmarks . writes it)")
    pts = []
    for r in cp["runs"]:
        if not isinstance(r, dict) or r.get("error"):
            continue
        n = r.get("ranks")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            continue
        run = {k: v for k, v in r.items() if _number(v)}  # a figure that is not a number is not used
        if key == SILENCE_BACKLOG:  # how much later than its timeout a silent slot was declared dead
            ds, to = run.get("detect_silence_s"), run.get("heartbeat_timeout_s")
            v = ds - to if ds is not None and to is not None else None
        elif key == CONTROL_ROUND:
            got = [run.get(k) for k in _CONTROL_ROUND_PARTS]
            v = sum(got) if all(x is not None for x in got) else None
        else:
            v = derived(run).get(key)
        if _number(v):
            pts.append((n, float(v)))
    return pts, f"control-plane benchmark of {cp.get('date', '?')} (BENCHMARKS.json control_plane)"


#: The group kinds a hot swap makes again besides the world: tp, pp and dp (``launch/groups.py``).
GROUP_KINDS = 3


@dataclass(frozen=True)
class Measured:
    """What the projection reads from the benchmarks' record: the control-plane runs of the detection, of the
    coordinator's round from the detection to the plan pushed (:data:`CONTROL_ROUND`) and of the silent slot's
    backlog beyond the timeout (None: no control-plane runs; the phrase
    says why), the local ``detect_s``, and a phrase naming the record."""

    exit_points: list[tuple[int, float]] | None
    exit_record: str
    plan_points: list[tuple[int, float]] | None
    plan_record: str
    backlog_points: list[tuple[int, float]] | None
    local_detect_s: object
    record: str

    @classmethod
    def of(cls, record: dict | None, record_name: str) -> "Measured":
        """Read from ``record`` (a BENCHMARKS.json's content, or None) named ``record_name``."""
        exit_pts, exit_rec = control_plane_points(record, "detect_exit_s")
        plan_pts, plan_rec = control_plane_points(record, CONTROL_ROUND)
        backlog_pts, _ = control_plane_points(record, SILENCE_BACKLOG)
        return cls(exit_pts, exit_rec, plan_pts, plan_rec, backlog_pts, (record or {}).get("detect_s"), record_name)


def project(job, node, gpus: int, step_s: float, measured: Measured, site_max_gpus: int | None) -> dict:
    """The projection at ``gpus`` GPUs of resolved ``job`` (:class:`phoenix_hpc.config.resolve.ResolvedJob`) on a
    site whose nodes are ``node`` (the profile's ``node``): every part (:mod:`phoenix_hpc.model.hotswap`), the
    totals of each rebuild design with detection by process exit and by heartbeat, and the scaled job's
    figures; plain dicts (JSON). Pure given its arguments."""
    from phoenix_hpc.model import hotswap as hs

    cfg, gpn, rz = job.config, job.gpus_per_node, job.config.resilience
    dp, state, est = scaled_state_bytes(cfg, job.dp, gpus)
    world = gpus + job.spares * gpn
    det = hs.detection_exit(measured.exit_points, gpus, measured.exit_record, measured.local_detect_s,
                            measured.record)
    backlog = (hs.control_plane_at(measured.backlog_points, gpus, "a silent slot declared dead after its timeout",
                                   measured.exit_record)
               if measured.backlog_points is not None else hs.missing(measured.exit_record))
    hb = hs.detect_heartbeat(rz.heartbeat_timeout_s, rz.heartbeat_interval_s, backlog)
    plan = (hs.control_plane_at(measured.plan_points, gpus, "the coordinator's round, detection -> recovery "
                                "opened -> every survivor's quiesced -> plan made -> pushed to every member "
                                "(detect_to_quiesce_s + quiesce_s + plan_delivered_s; quiesce_s holds plan_s)",
                                measured.plan_record)
            if measured.plan_points is not None else
            hs.missing(f"the coordinator's quiesce round, plan and push: {measured.plan_record}"))
    common = {"plan_push": plan, "quiesce": hs.quiesce(step_s, microbatches(cfg, job.dp))}
    detail = (f" (weights {est.weights / 1e9:.3g} + optimizer shard {est.optimizer / 1e9:.3g} GB at dp {dp}, "
              f"pipeline stage {est.stage}: config.memory estimate)")
    tail = {"transfer": hs.transfer(state, gpn, node.nics, node.nic_gbps, detail),
            "replay": hs.replay(step_s)}
    rebuilds = {"today": hs.rebuild_today(gpus), "today_lazy": hs.rebuild_today(gpus, lazy=True),
                "shrink": hs.rebuild_shrink(world, GROUP_KINDS)}
    totals = {name: {"exit": hs.total({"detection": det, **common, "rebuild": rb, **tail}).to_dict(),
                     "heartbeat": hs.total({"detection": hb, **common, "rebuild": rb, **tail}).to_dict()}
              for name, rb in rebuilds.items()}
    parts = {"detection_exit": det, "detection_heartbeat": hb, **common,
             **{f"rebuild_{name}": rb for name, rb in rebuilds.items()}, **tail}
    return {"gpus": gpus, "dp": dp, "nodes": gpus // gpn, "spare_nodes": job.spares, "world_with_spares": world,
            "beyond_site": site_max_gpus is not None and gpus > site_max_gpus, "state_bytes_per_rank": state,
            "parts": {k: e.to_dict() for k, e in parts.items()}, "totals": totals}
