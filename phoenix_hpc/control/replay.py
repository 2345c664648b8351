"""Rebuilding a restarted coordinator's state from the journal (pure functions over journal records).

A coordinator that crashed (SIGKILL, OOM kill, an uncaught error) is restarted by the batch script
(:mod:`phoenix_hpc.control.supervise`). The new process knows nothing but ``RUN_DIR/journal.jsonl``; the
slots, which kept training, reconnect and re-register afterwards (``register`` with ``rejoin``). What the
journal gives, for the current job only (the records after the last ``coordinator_started`` that is not a
restart: a resumed or chained run appends to the same journal):

- ``registered``: each slot's world rank, pid, node, role and logical rank;
- ``job_running``: the grid, the rank map and that the job was running;
- ``slots_dead``: slots declared dead (they stay fenced);
- ``recovery_start`` / ``recovery_plan`` / ``recovery_restored`` / ``recovery_done`` / ``recovery_aborted``:
  the generation, the rank map after a hot swap (spares that joined take their logical rank), and whether a
  recovery was in progress when the coordinator died;
- ``commit`` and ``checkpoint``: the newest recoverable step and persistent checkpoint;
- ``rejoined`` (written by a restarted coordinator): a slot's step and generation as it re-registered.

What the journal does not give (commit reports' per-shard steps, replica placement, heartbeats) the slots
send again: every slot resends its newest commit report (own shard and replicas held) right after it
re-registered (:mod:`phoenix_hpc.control.client`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

JOB_END_EVENTS = frozenset({"job_done", "clean_stop", "fallback", "coordinator_stopped"})


@dataclass
class SlotRecord:
    """A slot as the journal knows it: ``state`` is ``active``, ``standby``, ``joining``, ``quiesced`` or
    ``dead``."""

    world_rank: int
    pid: int
    node: str
    role: str
    logical_rank: int | None
    state: str
    generation: int = 0
    step: int = 0
    domain: dict[str, str] | None = None  # its node's failure domains (registration's placement inputs)


@dataclass
class Rebuilt:
    """The coordinator's state as replayed from the journal (see the module docstring).

    ``recovery``: the recovery in progress when the journal ends (``{"generation", "survivors", "dead",
    "phase"}``), or None. ``restarts``: how many restarts the journal already records for this job."""

    generation: int = 0
    grid: tuple[int, int, int] | None = None
    running: bool = False
    ended: str | None = None
    slots: dict[int, SlotRecord] = field(default_factory=dict)
    rank_map: dict[int, int] = field(default_factory=dict)  # logical -> world
    rank_maps: dict[int, dict[int, int]] = field(default_factory=dict)  # generation -> its rank map
    grid_since: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # generation -> grid (shrinks)
    placement_inputs: dict[str, Any] | None = None  # {"k", "levels"}: the first registration that gave them
    recoverable_step: int | None = None
    checkpoint_step: int | None = None
    recovery: dict[str, Any] | None = None
    restarts: int = 0


def replay(records: Iterable[dict[str, Any]]) -> Rebuilt:
    """The state of the current job after ``records`` (journal records, oldest first, as
    :func:`phoenix_hpc.control.journal.iter_journal` yields them). Unknown events are ignored. Pure.

    Returns:
        :class:`Rebuilt`.
    """
    r = Rebuilt()
    for rec in records:
        ev = rec.get("event")
        if ev == "coordinator_started":
            if rec.get("restart"):
                r.restarts += 1
            else:
                r = Rebuilt()  # the first start of a job: what came before belongs to an earlier job
        elif ev == "registered":
            w = int(rec["world_rank"])
            lr = rec.get("logical_rank")
            role = str(rec.get("role", "active"))
            pi = rec.get("placement_inputs") or {}
            r.slots[w] = SlotRecord(w, int(rec["pid"]), str(rec.get("node", "")), role,
                                    None if lr is None else int(lr), role,
                                    domain=dict(pi["domain"]) if pi.get("domain") else None)
            if pi and r.placement_inputs is None:
                r.placement_inputs = {"k": int(pi["k"]), "levels": list(pi["levels"])}
            if lr is not None:
                r.rank_map[int(lr)] = w
        elif ev == "job_running":
            r.running = True
            if rec.get("grid"):
                r.grid = tuple(int(x) for x in rec["grid"])  # type: ignore[assignment]
            if rec.get("rank_map"):
                r.rank_map = {int(lr): int(w) for lr, w in rec["rank_map"]}
            r.rank_maps[0] = dict(r.rank_map)
        elif ev == "slots_dead":
            for w in rec.get("slots", []):
                if int(w) in r.slots:
                    r.slots[int(w)].state = "dead"
        elif ev == "recovery_start":
            r.generation = int(rec["generation"])
            r.recovery = {"generation": r.generation, "survivors": [int(w) for w in rec.get("survivors", [])],
                          "dead": [int(w) for w in rec.get("dead", [])], "phase": "quiesce"}
            for w in r.recovery["survivors"]:
                if w in r.slots and r.slots[w].state == "active":
                    r.slots[w].state = "quiesced"
        elif ev == "recovery_plan":
            if rec.get("rank_map"):
                r.rank_map = {int(lr): int(w) for lr, w in rec["rank_map"]}
                r.rank_maps[int(rec.get("generation", r.generation))] = dict(r.rank_map)
            for j in rec.get("joins", []):
                s = r.slots.get(int(j["world_rank"]))
                if s is not None and s.state == "standby":
                    s.state, s.role, s.logical_rank = "joining", "active", int(j["logical_rank"])
            if rec.get("shrink") and rec.get("grid"):  # a shrink: the grid changes from this generation on
                g = rec["grid"]
                r.grid = (int(g["tp"]), int(g["pp"]), int(g["dp"]))
                r.grid_since[int(rec.get("generation", r.generation))] = r.grid
                old = rec["shrink"].get("old_grid") or {}
                if old:
                    r.grid_since.setdefault(0, (int(old["tp"]), int(old["pp"]), int(old["dp"])))
                for lr, w in rec.get("rank_map") or []:  # the kept slots are renumbered
                    if int(w) in r.slots:
                        r.slots[int(w)].logical_rank = int(lr)
            if r.recovery is not None:
                r.recovery["phase"] = "restore"
        elif ev == "shrink":  # the leavers of the removed replicas went back to standby
            for w in rec.get("freed", []):
                s = r.slots.get(int(w))
                if s is not None:
                    s.state, s.role, s.logical_rank = "standby", "standby", None
        elif ev == "recovery_restored":
            g = int(rec["generation"])
            for w in r.rank_map.values():
                s = r.slots.get(w)
                if s is not None and s.state in ("quiesced", "joining", "active"):
                    s.state, s.generation = "active", g
                    s.step = int(rec.get("recoverable_step") or s.step)
            if r.recovery is not None:
                r.recovery["phase"] = "replay"
        elif ev in ("recovery_done", "recovery_aborted"):
            r.recovery = None if ev == "recovery_done" else {**(r.recovery or {}), "phase": "aborted"}
            if ev == "recovery_done":
                r.recoverable_step = _max(r.recoverable_step, rec.get("recoverable_step"))
        elif ev == "commit":
            r.recoverable_step = _max(r.recoverable_step, rec.get("recoverable_step"))
        elif ev == "checkpoint":
            r.checkpoint_step = _max(r.checkpoint_step, rec.get("step"))
        elif ev == "rejoined":
            s = r.slots.get(int(rec["world_rank"]))
            if s is not None:
                s.step = int(rec.get("step") or 0)
        elif ev in JOB_END_EVENTS:
            r.ended = ev
    return r


def _max(a: int | None, b: Any) -> int | None:
    if b is None:
        return a
    return int(b) if a is None else max(a, int(b))


def rejoin_verdict(slot: SlotRecord | None, pid: int, role: str, logical_rank: int | None,
                   generation: int | None, job_generation: int) -> str | None:
    """Whether a re-registering slot (``register`` with ``rejoin``) is taken back: None when it is, else the
    reason it is refused. A slot is taken back only as the same process (pid) the journal knows, not
    declared dead, holding the logical rank the journal gives it, at a generation not newer than the job's.
    Pure."""
    if slot is None:
        return "the journal has no registration of this world rank in this job"
    if slot.state == "dead":
        return "it was declared dead; a fenced slot cannot rejoin"
    if slot.pid != pid:
        return f"registered pid is {slot.pid}, this is pid {pid}"
    if role == "active" and slot.logical_rank is not None and logical_rank is not None \
            and int(logical_rank) != slot.logical_rank:
        return f"it holds logical rank {logical_rank}, the journal says {slot.logical_rank}"
    if generation is not None and int(generation) > job_generation:
        return f"its generation {generation} is newer than the job's ({job_generation})"
    return None
