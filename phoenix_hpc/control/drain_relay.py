"""Planned drains through the coordinator (``drain``): the request is checked, every active slot is armed
to pause at the commit fence of one iteration, and once all paused, the drained slots leave and spares take
their logical ranks by the hot-swap path with zero steps replayed. The pure rules and the lifecycle are in
:mod:`phoenix_hpc.control.drains`.

:class:`DrainRelayMixin` is part of :class:`phoenix_hpc.control.coordinator.Coordinator`.
"""

from __future__ import annotations

import uuid

from phoenix_hpc.control import events as E
from phoenix_hpc.control.classify import Action, Decision
from phoenix_hpc.control.drains import (
    STEPS_AHEAD, PendingDrain, drain_refusal, drain_verdict, retry_step, target_nodes_of)
from phoenix_hpc.control.injects import confirm_within
from phoenix_hpc.control.states import LIVE_SLOT_STATES, JobState, SlotState
from phoenix_hpc.control.targets import resolve_target
from phoenix_hpc.recovery.shrink import shrink_refusal


class DrainRelayMixin:
    """Planned drain requests for the coordinator (one at a time, ``self.drain``)."""

    def _on_drain(self, body: dict) -> None:
        targets, why = resolve_target(body.get("target"), self.slots, self.rank_map, self.grid)
        if not targets:
            return self._reject(f"drain: {why}", body)
        nodes = target_nodes_of(self.slots, targets)
        standby_off = sum(1 for s in self.slots.values() if s.state is SlotState.STANDBY and s.node not in nodes)
        pending = self.drain is not None and self.drain.state in ("confirming", "armed", "moving")
        shrink = None
        if body.get("shrink"):
            w2l = {w: r for r, w in self.rank_map.items()}
            shrink = ("" if self.t.shrink_capable else "the job's engine cannot shrink (engine torch can; "
                      "resilience.spares_exhausted: stop or another engine)")
            if not shrink and self.grid:
                shrink = shrink_refusal(tuple(self.grid), [w2l[w] for w in targets if w in w2l],
                                        {r: self.slots[w].node for r, w in self.rank_map.items()},
                                        int((self.placement_inputs or {}).get("k", 1))) or ""
        why = drain_refusal(job_state=self.job.state.value, recovering=self.recovery is not None, pending=pending,
                            targets={w: self.slots[w].state.value for w in targets},
                            standby_off_target=standby_off, target_nodes=nodes, shrink=shrink)
        if why:
            return self._reject(f"drain: {why}", body)
        rid = str(body.get("request_id") or uuid.uuid4().hex[:12])
        members = sorted(self.rank_map.values())
        ahead = body.get("steps_ahead", STEPS_AHEAD)
        if not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 1:
            return self._reject(f"drain: steps_ahead {ahead!r} must be an integer >= 1", body)
        at_step = max(self.slots[w].step for w in members) + ahead
        exact = body.get("at_step")
        if exact is not None:  # obeyed exactly or refused (by the slots, if one already started it)
            if not isinstance(exact, int) or isinstance(exact, bool) or exact < 1:
                return self._reject(f"drain: at_step {exact!r} must be an integer >= 1", body)
            at_step = exact
        self.drain = PendingDrain(rid, sorted(targets), members, at_step, body,
                                  deadline=self.clock() + confirm_within(body), target=dict(body["target"]))
        self._held_replies.add(str(body.get("reply_to")))
        self.journal.append(E.DrainRequested(request_id=rid, target=body.get("target"), targets=sorted(targets),
                                             nodes=sorted(nodes), at_step=at_step))
        self._send_drain_arm(self.drain)

    def _send_drain_arm(self, d: PendingDrain) -> None:
        d.acks = {}
        for w in d.members:
            self._send(w, {"type": "drain", "request_id": d.request_id, "at_step": d.at_step, "attempt": d.attempt})

    def _on_drain_ack(self, body: dict) -> None:
        slot = self._slot_of(body, "drain_ack")
        d = self.drain
        if slot is None or d is None or str(body.get("request_id")) != d.request_id or d.state != "confirming":
            return
        if int(body.get("attempt", 0)) != d.attempt or slot.world_rank not in d.members:
            return
        d.acks[slot.world_rank] = body
        v = drain_verdict(d)
        if v == "retry" and d.request.get("at_step") is not None:  # an exact iteration is never moved later
            v = "refused"
        if v == "retry":
            self._undrain(d)
            d.at_step = retry_step(d)
            d.attempt += 1
            self.journal.append(E.DrainRearmed(request_id=d.request_id, at_step=d.at_step, attempt=d.attempt))
            self._send_drain_arm(d)
        elif v == "refused":
            why = "; ".join(f"world rank {w}: {a.get('reason') or 'refused'}" for w, a in sorted(d.acks.items())
                            if not a.get("armed"))
            self._refuse_drain(d, why)
        elif v == "armed":
            d.state = "armed"
            self.journal.append(E.DrainArmed(request_id=d.request_id, at_step=d.at_step, members=d.members))
            self._release_reply(d.request, {"type": "accepted", "request_id": d.request_id, "targets": d.targets,
                                    "at_step": d.at_step})

    def _on_drain_reached(self, body: dict) -> None:
        """A member paused at the commit fence of the drain's iteration."""
        slot = self._slot_of(body, "drain_reached")
        d = self.drain
        if slot is None or d is None or str(body.get("request_id")) != d.request_id or d.state != "armed":
            return
        d.reached.add(slot.world_rank)
        if set(d.reached) >= set(d.members) and self.recovery is None and self.job.state is JobState.RUNNING:
            self._start_drain(d)

    def _start_drain(self, d: PendingDrain) -> None:
        """Every member paused at the fence: the drained slots leave (DONE), the others are quiesced and the
        hot swap gives their logical ranks to spares on other nodes."""
        now = self.clock()
        d.state = "moving"
        nodes = sorted(target_nodes_of(self.slots, d.targets))
        self.journal.append(E.DrainStart(request_id=d.request_id, targets=d.targets, nodes=nodes,
                                         live_step=d.at_step - 1))
        self.drained |= set(d.targets)
        self.drained_nodes |= set(nodes)
        for w in d.targets:
            self.slots[w].machine.to(SlotState.DONE, f"drained (request {d.request_id})")
            self._send(w, {"type": "stop", "drained": True, "job_state": "drained",
                           "reason": f"drained: logical rank {self.slots[w].logical_rank} "
                                     f"{'leaves with its DP replica (shrink)' if d.request.get('shrink') else 'moves to a spare'}"})
        decision = Decision(Action.HOT_SWAP, f"planned drain of {', '.join(nodes)} (request {d.request_id})"
                                             f"{' by a shrink' if d.request.get('shrink') else ''}")
        self._start_recovery(decision, [], now, now, drain=d)
        d.generation = self.generation

    def _drain_finished(self, rec, now: float) -> None:
        """The drain's hot swap is done (called from the recovery machine)."""
        d = self.drain
        if d is None or rec.drain is not d:
            return
        d.state = "done"
        moved = [[j.replaces_world_rank, j.world_rank, j.logical_rank] for j in rec.plan.joins]
        self.journal.append(E.DrainDone(request_id=d.request_id, generation=rec.generation,
                                        steps_replayed=rec.plan.steps_replayed, recoverable_step=rec.plan.recoverable_step,
                                        moved=moved, total_s=round(now - rec.t_start, 3),
                                        **({"dp": rec.plan.grid[2], "freed": [w for w in rec.plan.leavers
                                                                             if self.slots[w].state is SlotState.STANDBY]}
                                           if rec.plan.action == "shrink" else {})))

    def _drain_missed(self, reason: str) -> None:
        """Something came first (a fault, a lost slot, the end of the job): a drain being confirmed is
        refused, an armed or moving one is journalled missed; every live member is disarmed."""
        d = self.drain
        if d is None or d.state not in ("confirming", "armed", "moving"):
            return
        if d.state == "confirming":
            return self._refuse_drain(d, reason)
        if d.state == "moving":  # the drained slots have left; the recovery that follows replaces them
            reason = f"the drain's hot swap was cut short, its slots are replaced by the next recovery ({reason})"
        d.state = "missed"
        self._undrain(d)
        self.journal.append(E.DrainMissed(request_id=d.request_id, at_step=d.at_step, targets=d.targets,
                                          reason=reason))

    def _undrain(self, d: PendingDrain) -> None:
        for w in d.members:
            if self.slots[w].state in LIVE_SLOT_STATES:
                self._send(w, {"type": "undrain", "request_id": d.request_id})

    def _refuse_drain(self, d: PendingDrain, reason: str) -> None:
        d.state = "refused"
        self._undrain(d)
        self.journal.append(E.DrainRefused(request_id=d.request_id, reason=reason, targets=d.targets))
        self.counters["rejected"] += 1
        self._release_reply(d.request, {"type": "rejected", "reason": f"drain: {reason}"})

    def _drains_tick(self, now: float) -> None:
        d = self.drain
        if d is not None and d.state == "confirming" and now > d.deadline:
            silent = sorted(set(d.members) - set(d.acks))
            self._refuse_drain(d, f"world rank(s) {silent} did not confirm within {confirm_within(d.request):g} s")
