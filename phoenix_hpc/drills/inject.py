"""Build, validate and send a fault-injection request (``phoenix inject-fault``, ``phoenix drill``), then follow
it until it landed or was missed.

Flow: :func:`build_request` checks a user's request against the job's current
:class:`~phoenix_hpc.status.model.Status` (pure; every refusal is a :class:`FaultError` and nothing is
sent); :func:`send_request` hands it to the job's coordinator through the control protocol (an ``inject``
message on the coordinator's operator channel, signed with the job secret, :mod:`phoenix_hpc.control.protocol`); the
coordinator resolves the target to world ranks and forwards the instruction, and each target slot arms it
only if it has not started the step yet, or refuses it (:func:`phoenix_hpc.faults.trigger.arm_decision`).
The coordinator answers once every target answered (:mod:`phoenix_hpc.control.injects`): accepted means
*armed by the targets themselves*, not judged from the coordinator's lagging view of the job. Each
target's :class:`~phoenix_hpc.faults.trigger.FaultTrigger` then fires at the step and phase.
:func:`wait_outcome` follows an armed request until every target landed (its landing record) or was missed
(the coordinator's ``inject_missed``: the target was lost, or the job ended, before the step).

``kill-node`` on the local test cluster (site ``local``): once the node's slots landed at the step and phase,
:func:`finish_kill_node` waits until their PIDs are gone and, only while the job still runs, kills the
node's slurmd and step daemons by the PIDs the cluster recorded (:func:`phoenix_hpc.slurm.cluster.kill_node`),
marking the node DOWN, so Slurm sees the node loss as well. A node that holds only standby slots has no
steps: there a kill-node without a phase and step kills the node at once, and a fault for a phase of a
recovery (``recovery``, ``restore``) is armed on its slots and lands as one of them takes over a rank; a
step phase there is refused. Nothing is done to a node after its job ended, and no process is ever found by a
name pattern.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from phoenix_hpc.control import events as E
from phoenix_hpc.errors import ControlError, FaultError, FaultMissed
from phoenix_hpc.faults.kinds import PHASE_WIRE, check_at_step, check_phase, kind_spec, parse_coord
from phoenix_hpc.faults.trigger import RECOVERY_PHASES
from phoenix_hpc.slurm.procs import pid_alive  # noqa: F401 - wait_pids_gone's default, re-exported
from phoenix_hpc.status.model import Status
from phoenix_hpc.topology import Grid

LIVE = ("active", "standby", "joining", "quiesced")
STEP_MARGIN = 3  # default --at-step: the step the target is in when it gets the request + this


@dataclass(frozen=True)
class InjectRequest:
    """A validated request. ``target`` is the wire target (``{"logical_rank": r}``, ``{"node": name}`` or
    ``{"coord": [pp, dp, tp]}``); ``slots`` the world ranks it names now; ``node`` the node for kill-node;
    ``immediate``: a kill-node of a node without active slots (killed at once, no step)."""

    kind: str
    phase: str
    at_step: int
    target: dict[str, Any]
    slots: tuple[int, ...]
    pids: tuple[int, ...]
    node: str | None = None
    immediate: bool = False
    steps_ahead: int | None = None  # set: at_step is a lower bound; the coordinator picks its live step + this
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def body(self) -> dict[str, Any]:
        """The ``inject`` message body of the control protocol (wire kind and phase names)."""
        body = {"type": "inject", "kind": kind_spec(self.kind).wire, "phase": PHASE_WIRE[self.phase],
                "at_step": int(self.at_step), "target": dict(self.target), "request_id": self.request_id}
        if self.steps_ahead is not None:
            body["steps_ahead"] = int(self.steps_ahead)
        return body


def _grid(st: Status) -> Grid | None:
    g = st.job.grid
    return Grid.of(g) if g else None


def resolve_target(st: Status, *, rank: int | None, node: str | None, coord: str | None,
                   node_gone: str = "lost or released") -> tuple[list, dict[str, Any], list]:
    """The live slots that ``--rank`` / ``--node`` / ``--coord`` (exactly one) name in the job of ``st``,
    the target as sent to the coordinator (``{"logical_rank": r}``, ``{"coord": [pp, dp, tp]}`` or
    ``{"node": name}``), and the job's live slots. Shared by fault injection and planned drains. Pure.

    Raises:
        FaultError: not exactly one target; a rank or coordinate outside the job or held by no live slot; a
            node that is not the job's or has no live slot (``node_gone`` says what such a node may be).
    """
    given = [n for n, v in (("--rank", rank), ("--node", node), ("--coord", coord)) if v is not None]
    if len(given) != 1:
        raise FaultError("target: give exactly one of --rank R, --node NODE, --coord pp,dp,tp"
                         + (f" (got {', '.join(given)})" if given else ""))
    grid = _grid(st)
    n = grid[0] * grid[1] * grid[2] if grid else len([s for s in st.slots if s.logical_rank is not None])
    live = [s for s in st.slots if s.state in LIVE]
    by_logical = {s.logical_rank: s for s in live if s.logical_rank is not None and s.state != "standby"}
    if rank is not None:
        if not 0 <= rank < n:
            raise FaultError(f"--rank: {rank} is outside the job; logical ranks are 0..{n - 1}")
        if rank not in by_logical:
            raise FaultError(f"--rank: no live slot holds logical rank {rank} now; nothing was sent")
        return [by_logical[rank]], {"logical_rank": int(rank)}, live
    if coord is not None:
        pp, dp, tp = parse_coord(coord, grid)
        if grid is None:
            raise FaultError("--coord: the job's grid is not known yet; use --rank or --node")
        r = (pp * grid[2] + dp) * grid[0] + tp
        if r not in by_logical:
            raise FaultError(f"--coord: no live slot holds ({pp},{dp},{tp}) (logical rank {r}) now; nothing was sent")
        return [by_logical[r]], {"coord": [pp, dp, tp]}, live
    job = st.job
    names = sorted({s.node for s in st.slots} | set(job.node_list))
    if node not in names:
        raise FaultError(f"--node: {node!r} is not a node of job {job.job_id or job.run_dir}; its nodes: "
                         f"{', '.join(names)}")
    targets = [s for s in live if s.node == node]
    if not targets:
        raise FaultError(f"--node: {node} has no live slot ({node_gone}); nothing was sent")
    return targets, {"node": node}, live


def build_request(st: Status, kind: str, *, rank: int | None = None, node: str | None = None,
                  coord: str | None = None, at_step: int | None = None, phase: str | None = None) -> InjectRequest:
    """Validate a request against the job's status and resolve its target.

    Args:
        st: the job's current status.
        kind: user kind name (:data:`phoenix_hpc.faults.kinds.KINDS`).
        rank / node / coord: exactly one target: a logical rank, a node name, or ``"pp,dp,tp"``.
        at_step: the iteration to fail in. None: :data:`STEP_MARGIN` steps after the target's live step, which
            the coordinator resolves when the request arrives (the journal's step can lag the job by many
            steps, and a command takes seconds to start); the accepted reply carries the step chosen.
        phase: user phase name (default ``forward``).

    Raises:
        FaultError: unknown kind or phase, a phase the kind does not support, not exactly one target, a
            target outside the job or without a live slot, a step already done or beyond the last step,
            a job that is finished or not running yet.
    """
    spec = kind_spec(kind)
    p = check_phase(kind, phase)
    # what is wrong with the request itself is said first, whatever state the job is in
    if rank is not None and rank < 0:
        raise FaultError(f"--rank: {rank} is not allowed; logical ranks start at 0")
    if coord is not None:
        parse_coord(coord)
    check_at_step(at_step)
    job = st.job
    if st.finished or job.state == "ended":
        raise FaultError(f"job {job.job_id or job.run_dir} is {job.state}"
                         f"{' (Slurm: ' + job.slurm_state + ')' if job.slurm_state else ''}: "
                         "nothing to inject into; nothing was sent")
    if job.slurm_state is not None and job.slurm_state not in ("RUNNING", "COMPLETING", "CONFIGURING"):
        raise FaultError(f"job {job.job_id} is {job.slurm_state} in Slurm, not RUNNING: nothing was sent")
    if not st.slots or job.coordinator is None or job.state in ("pending", "starting"):
        raise FaultError(f"job {job.job_id or job.run_dir} has not started training yet (state {job.state}); "
                         "inject once `phoenix status` shows it running; nothing was sent")
    targets, target, live = resolve_target(st, rank=rank, node=node, coord=coord)

    kill_node = spec.name == "kill-node"
    the_node = targets[0].node if kill_node else None
    if kill_node:
        targets = [s for s in live if s.node == the_node]
        target = {"node": the_node}
    active = [s for s in targets if s.state != "standby"]
    in_recovery = PHASE_WIRE[p] in RECOVERY_PHASES  # lands as a standby slot takes over a rank, too
    immediate = kill_node and not active and not in_recovery
    spare_phases = " or ".join(ph for ph in spec.phases if PHASE_WIRE[ph] in RECOVERY_PHASES)
    if immediate and (phase is not None or at_step is not None):
        given = " and ".join(x for x, v in (("--phase", phase), ("--at-step", at_step)) if v is not None)
        raise FaultError(f"{given}: {the_node} holds only standby slots, which run no steps, so a kill-node there "
                         "happens at once and cannot be at a step or phase; leave both out, or use --phase "
                         f"{spare_phases} to lose the spare as it takes over a rank; nothing was sent")
    if not active and not immediate and not in_recovery:
        where = (f"only with --phase {spare_phases} (as a spare takes over a rank)" if spare_phases else
                 f"in no phase: {kind} has no phase of a recovery")
        raise FaultError(f"target: {node} holds only standby slots, which run no steps; a {kind} fault lands there "
                         f"{where}; nothing was sent")
    step = at_step
    if step is None:
        step = (job.step or 0) + STEP_MARGIN
    # a standby slot has started no step: it arms any step for a phase of a recovery, and the fault lands in the
    # first recovery that begins at or after it in which the slot takes over a rank (a past step: the next one)
    judged = at_step is not None and not (in_recovery and not active)
    check_at_step(step, live_step=job.step if judged else None, total_steps=job.steps_total,
                  as_of_s=None if job.step_at is None else max(0.0, st.now - job.step_at))
    return InjectRequest(kind=spec.name, phase=p, at_step=int(step), target=target,
                         steps_ahead=STEP_MARGIN if at_step is None else None,
                         slots=tuple(s.world_rank for s in targets),
                         pids=tuple(int(s.pid) for s in targets if s.pid is not None), node=the_node,
                         immediate=immediate)


def send_request(run_dir: Path, req: InjectRequest, timeout_s: float = 30.0) -> dict[str, Any]:
    """Send ``req`` to the job's coordinator through its operator channel (:mod:`phoenix_hpc.control.operator`:
    standard library only, so the command does not spend seconds importing torch while the job runs on) and
    wait for its answer, which comes once every target slot armed the fault (it had not started the step)
    or one refused it (:mod:`phoenix_hpc.control.injects`). Returns the ``accepted`` reply (``{"type":
    "accepted", "targets": [world ranks], "request_id", "at_step", "armed_steps": [[world rank, step]]}``).

    Raises:
        FaultError: the coordinator or a target refused the request (the reason is in the message: nothing
            is armed anywhere).
        ControlError: no ``coordinator.json`` naming an operator port, an unreadable job secret, or the
            coordinator cannot be reached or does not answer within ``timeout_s``.
    """
    from phoenix_hpc.control import protocol as P
    from phoenix_hpc.control.operator import operator_request

    info = P.read_coordinator_file(run_dir)
    if not info or not info.get("operator_port"):
        raise ControlError(f"{run_dir}/{P.COORDINATOR_FILE} names no coordinator operator port; nothing was sent")
    secret = P.read_secret(run_dir)
    body = {**req.body(), "confirm_within_s": max(1.0, timeout_s - CONFIRM_MARGIN_S)}
    return _accepted(operator_request(str(info["host"]), int(info["operator_port"]), body, secret, timeout_s))


CONFIRM_MARGIN_S = 3.0  # the targets' confirmation must come this much before the command stops waiting


def _accepted(reply: dict[str, Any]) -> dict[str, Any]:
    if reply.get("type") != "accepted":
        raise FaultError(f"the coordinator refused the injection: {reply.get('reason', reply)}; nothing was injected")
    return reply


def is_exact(landed: dict[str, Any], at_step: int, phase_wire: str) -> bool:
    """Whether a landing record is where the request asked: its step (for a phase of a recovery,
    ``recovery`` or ``restore``, the first recovery at or after it) and phase. Pure."""
    from phoenix_hpc.faults.trigger import landed_exactly

    return landed_exactly(landed.get("step"), landed.get("phase"), at_step, phase_wire)


def outcome_of(request_id: str, armed: dict[int, int], phase_wire: str, fired: list[dict[str, Any]],
               records: list[dict[str, Any]]) -> dict[str, Any]:
    """Where an armed request stands, from the landing records (``faults/fired-*.json``) and the journal's
    ``inject_missed`` records. Pure.

    Returns ``{"landed": {w: record}, "missed": {w: reason}, "pending": [w], "exact": bool}`` (``exact``:
    every target landed at its armed step and the requested phase)."""
    landed = {int(f["world_rank"]): f for f in fired if f.get("request_id") == request_id
              and f.get("world_rank") is not None}
    missed = {int(r["world_rank"]): str(r.get("reason", "")) for r in records
              if r.get("event") == E.InjectMissed.NAME and r.get("request_id") == request_id
              and int(r["world_rank"]) not in landed}
    pending = sorted(w for w in armed if w not in landed and w not in missed)
    exact = not missed and not pending and all(is_exact(landed[w], armed[w], phase_wire) for w in armed)
    return {"landed": {w: landed[w] for w in sorted(landed) if w in armed}, "missed": missed, "pending": pending,
            "exact": exact}


def wait_outcome(run_dir: Path, request_id: str, armed: dict[int, int], phase_wire: str, *,
                 job_over: Callable[[], str | None], poll_s: float = 0.2, grace_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                 ) -> dict[str, Any]:
    """Wait until every target of an armed request has landed or was missed (see :func:`outcome_of`).

    ``job_over()`` returns why the job is over (None while it runs); once it does, the coordinator's own
    ``inject_missed`` records get ``grace_s`` to appear, then the targets still pending are missed with
    that reason (e.g. a coordinator that ended without journalling)."""
    from phoenix_hpc.control.journal import read_journal
    from phoenix_hpc.faults.trigger import read_fired

    over_at = None
    while True:
        out = outcome_of(request_id, armed, phase_wire, read_fired(run_dir), read_journal(run_dir))
        if not out["pending"]:
            return out
        why = job_over()
        if why is not None:
            over_at = clock() if over_at is None else over_at
            if clock() - over_at >= grace_s:
                for w in out["pending"]:
                    out["missed"][w] = f"{why} before step {armed[w]}"
                out["pending"] = []
                return out
        sleep(poll_s)


def wait_pids_gone(pids: tuple[int, ...], timeout_s: float, poll_s: float = 0.2,
                   alive: Callable[[int], bool] = pid_alive, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep,
                   give_up: Callable[[], bool] | None = None) -> list[int]:
    """Wait until none of ``pids`` is alive; return those still alive after ``timeout_s`` or once
    ``give_up()`` returns true (checked every poll)."""
    deadline = clock() + timeout_s
    while True:
        left = [p for p in pids if alive(p)]
        if not left or clock() >= deadline or (give_up is not None and give_up()):
            return left
        sleep(poll_s)


def local_cluster_for(st: Status, node: str):
    """The local test cluster running ``node`` for a job of site ``local`` (None otherwise)."""
    if st.job.site != "local":
        return None
    from phoenix_hpc.errors import ClusterError
    from phoenix_hpc.slurm.cluster import load_cluster

    try:
        cluster = load_cluster()
    except ClusterError:
        return None
    return cluster if node in cluster.nodes else None


def finish_kill_node(cluster, req: InjectRequest, timeout_s: float,
                     job_over: Callable[[], str | None] | None = None) -> dict[str, Any]:
    """Local cluster: after the node's slots died at their step (or at once for ``immediate``), kill the
    node's slurmd and step daemons by their recorded PIDs and mark the node DOWN; only while the job runs.

    Returns ``{"node", "slots_gone", "killed_pids", "waited_s"}``.

    Raises:
        FaultError: the slots did not die within ``timeout_s``, or the job is over (``job_over()`` says why):
            nothing is done to a node after its job ended; the node is left up.
    """
    from phoenix_hpc.slurm.cluster import kill_node

    t0 = time.monotonic()
    if not req.immediate:
        left = wait_pids_gone(req.pids, timeout_s)
        if left:
            raise FaultError(f"kill-node: slots of {req.node} (pids {left}) still run {time.monotonic() - t0:.1f}s "
                             f"after the fault landed; its slurmd is left running")
    why = job_over() if job_over is not None else None
    if why is not None:
        raise FaultError(f"kill-node: {why}; nothing was done to node {req.node} (its slurmd is left running)")
    killed = kill_node(cluster, req.node, mark_down_reason=f"phoenix inject-fault kill-node {req.request_id}")
    return {"node": req.node, "slots_gone": list(req.slots), "killed_pids": killed,
            "waited_s": round(time.monotonic() - t0, 3)}


def job_over_probe(run_dir: Path, slurm=None) -> Callable[[], str | None]:
    """A ``job_over()`` for :func:`wait_outcome` and :func:`finish_kill_node`: the reason the job is over
    (its journal records the end, or Slurm no longer runs it), or None while it runs. Slurm is asked at
    most once per 2 s."""
    from phoenix_hpc.control.journal import read_journal

    ends = {E.JobDone.NAME: "the job finished", E.CleanStop.NAME: "the job stopped", E.Fallback.NAME: "the job stopped",
            E.CoordinatorStopped.NAME: "the job was stopped", E.CoordinatorExit.NAME: "the job's coordinator exited"}
    last = {"t": float("-inf"), "why": None}

    def probe() -> str | None:
        from phoenix_hpc.drills.in_job import restarting, run_over
        from phoenix_hpc.status.derive import current_job_records

        records = current_job_records(read_journal(run_dir))  # a resumed run: only its newest job's end counts
        if not restarting(records):  # an in-job restart ends the srun step and its coordinator, not the job
            why = next((ends[r["event"]] for r in records if r.get("event") in ends), None)
            if why is not None:
                return why
        if slurm is not None and time.monotonic() - last["t"] >= 2.0:
            last["t"] = time.monotonic()
            from phoenix_hpc.status.collect import collect_status

            try:
                st = collect_status(run_dir, slurm)
            except Exception:  # noqa: BLE001 -- an unreadable status proves nothing
                return last["why"]
            last["why"] = (f"the job ended (Slurm: {st.job.slurm_state or st.job.state})"
                           if run_over(st.finished or st.job.state == "ended", st.job.slurm_state,
                                       st.job.in_job_restart)
                           else None)
        return last["why"]

    return probe


def inject(run_dir: Path, st: Status, req: InjectRequest, timeout_s: float = 30.0,
           land_timeout_s: float = 600.0, wait: bool = True,
           job_over: Callable[[], str | None] | None = None) -> dict[str, Any]:
    """Carry out a validated request: send it (unless it is an immediate local kill-node), and with ``wait``
    wait until it landed or was missed; for kill-node on the local cluster, kill the node's daemons once its
    slots are gone (only while the job runs). Returns a summary dict ``{"request_id", "kind", "phase",
    "at_step", "armed_steps", "target", "targets", "state", "landed", "missed", "node_kill"}``; ``state``
    is ``armed`` (``wait=False``), ``landed`` (every target at its step and phase) or ``immediate``.

    Raises:
        FaultError, ControlError: see :func:`send_request` and :func:`finish_kill_node`; an immediate
            kill-node outside the local cluster; ``wait=False`` with a local kill-node (the node can only be
            killed after its slots fired).
        FaultMissed: the request was armed but a target was lost or the job ended first, or it landed
            elsewhere than requested (exit code 1; ``outcome`` holds the summary).
    """
    out: dict[str, Any] = {"request_id": req.request_id, "kind": req.kind, "phase": req.phase,
                           "at_step": req.at_step, "armed_steps": None, "target": req.target,
                           "targets": list(req.slots), "state": None, "landed": [], "missed": [],
                           "node_kill": None}
    job_over = job_over or job_over_probe(run_dir)
    cluster = local_cluster_for(st, req.node) if req.kind == "kill-node" else None
    if req.immediate:
        if cluster is None:
            raise FaultError(f"kill-node: {req.node} holds only standby slots; killing such a node needs the local "
                             "test cluster (site local); nothing was sent")
        out["at_step"], out["state"] = None, "immediate"
        out["node_kill"] = finish_kill_node(cluster, req, timeout_s, job_over)
        return out
    if cluster is not None and not wait:
        raise FaultError("--no-wait: a kill-node on the local cluster kills the node's slurmd after its slots "
                         "fired, so the command waits for that; nothing was sent")
    reply = send_request(run_dir, req, timeout_s)
    out["targets"] = list(reply.get("targets", req.slots))
    armed = {int(w): int(s) for w, s in reply.get("armed_steps") or [(w, reply.get("at_step", req.at_step))
                                                                      for w in out["targets"]]}
    out["armed_steps"] = {str(w): s for w, s in sorted(armed.items())}
    out["at_step"] = max(armed.values()) if armed else reply.get("at_step", req.at_step)
    out["state"] = "armed"
    if not wait:
        return out
    res = wait_outcome(run_dir, req.request_id, armed, PHASE_WIRE[req.phase], job_over=job_over)
    out["landed"] = [{"world_rank": w, "step": f.get("step"), "phase": f.get("phase")}
                     for w, f in res["landed"].items()]
    out["missed"] = [{"world_rank": w, "at_step": armed[w], "reason": why} for w, why in sorted(res["missed"].items())]
    if not res["exact"]:
        out["state"] = "missed"
        what = "; ".join([f"world rank {m['world_rank']}: {m['reason']}" for m in out["missed"]]
                         + [f"world rank {x['world_rank']} landed at step {x['step']}, {x['phase']} instead of step "
                            f"{armed[x['world_rank']]}, {PHASE_WIRE[req.phase]}" for x in out["landed"]
                            if not is_exact(x, armed[x["world_rank"]], PHASE_WIRE[req.phase])])
        raise FaultMissed(f"the {req.kind} fault {req.request_id} was armed but did not land as requested: {what}",
                          out)
    out["state"] = "landed"
    if cluster is not None:
        out["node_kill"] = finish_kill_node(cluster, req, land_timeout_s, job_over)
    return out
