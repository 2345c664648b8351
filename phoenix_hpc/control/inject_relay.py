"""Fault injection through the coordinator (``inject``): the request is checked, its target resolved to
slots and forwarded to them; they arm or refuse it (``inject_ack``) and report when it fired
(``inject_fired``). The request is answered once every target confirmed; armed requests that can no longer
land (the target died, the job ended) are journalled missed. The pure rules are in
:mod:`phoenix_hpc.control.injects`.

:class:`InjectRelayMixin` is part of :class:`phoenix_hpc.control.coordinator.Coordinator`.
"""

from __future__ import annotations

import uuid
from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.injects import PendingInject, confirm_within, unfired, verdict
from phoenix_hpc.control.operator import REPLY_PREFIX as OPERATOR_REPLY_PREFIX
from phoenix_hpc.control.states import LIVE_SLOT_STATES, TERMINAL_JOB_STATES, JobState


class InjectRelayMixin:
    """Fault-injection requests for the coordinator."""

    def _on_inject(self, body: dict) -> None:
        kind, phase, at_step = body.get("kind"), body.get("phase"), body.get("at_step")
        if kind not in P.INJECT_KINDS:
            return self._reject(f"inject: kind {kind!r} not one of {', '.join(P.INJECT_KINDS)}", body)
        if phase not in P.INJECT_PHASES:
            return self._reject(f"inject: phase {phase!r} not one of {', '.join(P.INJECT_PHASES)}", body)
        if not isinstance(at_step, int) or at_step < 1:
            return self._reject(f"inject: at_step {at_step!r} must be an integer >= 1", body)
        if self.job.state in TERMINAL_JOB_STATES:
            return self._reject(f"inject: the job is {self.job.state.value}", body)
        targets, why = self._resolve_target(body.get("target"))
        if not targets:
            return self._reject(f"inject: {why}", body)
        extra: dict[str, Any] = {}
        if kind == "corrupt_replica":  # the target names the shard (by its owner); one holder of it corrupts
            holder, why = self._holder_of(targets)  # control/evidence.py
            if holder is None:
                return self._reject(f"inject: {why}", body)
            targets, extra = [holder[0]], {"shard_id": holder[1]}
        live_step = max((self.slots[w].step for w in targets), default=0)
        ahead = body.get("steps_ahead")
        if ahead is not None:
            if not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 1:
                return self._reject(f"inject: steps_ahead {ahead!r} must be an integer >= 1", body)
            at_step = max(at_step, live_step + ahead)
        if at_step <= live_step:
            return self._reject(f"inject: step {at_step} already done by the target (at step {live_step})", body)
        rid = str(body.get("request_id") or uuid.uuid4().hex[:12])
        if rid in self.injects:
            return self._reject(f"inject: request id {rid!r} was already used", body)
        # the targets decide (they know the step they are in); the answer waits for them (control/injects.py)
        self.injects[rid] = PendingInject(rid, kind, phase, at_step, targets, body,
                                          deadline=self.clock() + confirm_within(body))
        self._held_replies.add(str(body.get("reply_to")))
        msg = {"type": "inject", "kind": kind, "at_step": at_step, "phase": phase, "request_id": rid, **extra}
        if ahead is not None:
            msg["steps_ahead"] = ahead
        for w in targets:
            self._send(w, msg)
        self.journal.append(E.InjectForwarded(kind=kind, phase=phase, at_step=at_step, targets=targets,
                                              target=body.get("target"), request_id=rid, **extra))

    def _on_inject_ack(self, body: dict) -> None:
        """A target armed or refused an injection (or answered a ``disarm``)."""
        slot = self._slot_of(body, "inject_ack")
        req = self.injects.get(str(body.get("request_id")))
        if slot is None or req is None or slot.world_rank not in req.targets or req.state != "confirming":
            return
        req.acks[slot.world_rank] = body
        v = verdict(req)
        if v == "refused":
            self._refuse_inject(req, "; ".join(req.refusals()))
        elif v == "armed":
            req.state = "armed"
            steps = req.armed_steps()
            self.journal.append(E.InjectArmed(request_id=req.request_id, armed_steps=sorted(steps.items()),
                                              started_steps=sorted((w, a.get("started_step")) for w, a in req.acks.items())))
            self._release_reply(req, {"type": "accepted", "targets": req.targets, "request_id": req.request_id,
                                      "at_step": max(steps.values()), "armed_steps": sorted(steps.items())})

    def _on_inject_fired(self, body: dict) -> None:
        """A target's injection fired (sent just before the effect; the landing file is written first)."""
        slot = self._slot_of(body, "inject_fired")
        req = self.injects.get(str(body.get("request_id")))
        if slot is None or req is None:
            return
        armed = req.armed_steps().get(slot.world_rank)
        req.fired.add(slot.world_rank)
        from phoenix_hpc.faults.trigger import landed_exactly

        self.journal.append(E.InjectLanded(request_id=req.request_id, world_rank=slot.world_rank,
                                           step=body.get("step"), phase=body.get("phase"), at_step=armed,
                                           exact=armed is not None and landed_exactly(body.get("step"), body.get("phase"),
                                                                                      armed, req.phase)))

    def _release_reply(self, req: PendingInject, reply: dict) -> None:
        self._held_replies.discard(str(req.request.get("reply_to")))
        self._reply(req.request, reply)
        to = str(req.request.get("reply_to"))
        if to.startswith(OPERATOR_REPLY_PREFIX) and to[len(OPERATOR_REPLY_PREFIX):].isdigit() and self.operator:
            self.operator.finish(int(to[len(OPERATOR_REPLY_PREFIX):]))  # closed, if the reply did not go out

    def _refuse_inject(self, req: PendingInject, reason: str) -> None:
        """Refuse a request still being confirmed: disarm it where it was armed, journal, answer."""
        req.state = "refused"
        for w in req.targets:  # also those yet to answer: their queue holds the inject, then this disarm
            if self.slots[w].state in LIVE_SLOT_STATES:
                self._send(w, {"type": "disarm", "request_id": req.request_id})
        self.journal.append(E.InjectRefused(request_id=req.request_id, reason=reason, targets=req.targets))
        self.counters["rejected"] += 1
        self._release_reply(req, {"type": "rejected", "reason": f"inject: {reason}"})

    def _injects_lost(self, worlds: list[int], why: str) -> None:
        """Slots ``worlds`` are gone: requests they still had to confirm are refused, armed ones they had not
        fired are missed."""
        for req in list(self.injects.values()):
            hit = [w for w in worlds if w in req.targets]
            if not hit:
                continue
            if req.state == "confirming":
                self._refuse_inject(req, f"world rank(s) {hit} lost before confirming ({why})")
            elif req.state == "armed":
                for w in unfired(req, self.run_dir, hit):
                    req.missed.add(w)
                    self.journal.append(E.InjectMissed(request_id=req.request_id, world_rank=w,
                                                       at_step=req.armed_steps().get(w),
                                                       reason=f"world rank {w} was lost before step {req.armed_steps().get(w)} "
                                                              f"({why})"))

    def _injects_tick(self, now: float) -> None:
        for req in list(self.injects.values()):
            if req.state == "confirming" and now > req.deadline:
                silent = sorted(set(req.targets) - set(req.acks))
                self._refuse_inject(req, f"world rank(s) {silent} did not confirm within "
                                         f"{confirm_within(req.request):g} s (an active slot reads its "
                                         "instructions from its registration on, at least once per step: one "
                                         "that does not answer is hung or overloaded; allow a longer "
                                         "--timeout-s)")

    def _injects_at_end(self, state: JobState) -> None:
        """The job ends: requests being confirmed are refused, armed ones that did not fire are missed."""
        for req in list(self.injects.values()):
            if req.state == "confirming":
                self._refuse_inject(req, f"the job ended ({state.value})")
            elif req.state == "armed":
                for w in unfired(req, self.run_dir):
                    req.missed.add(w)
                    self.journal.append(E.InjectMissed(request_id=req.request_id, world_rank=w,
                                                       at_step=req.armed_steps().get(w),
                                                       reason=f"the job ended ({state.value}) before step "
                                                              f"{req.armed_steps().get(w)}, phase {req.phase}"))

    def _resolve_target(self, target: Any) -> tuple[list[int], str]:
        live = {w: s for w, s in self.slots.items() if s.state in LIVE_SLOT_STATES}
        if not isinstance(target, dict) or len(target) != 1:
            return [], f"target {target!r} must be one of {{world_rank}}, {{logical_rank}}, {{node}}, {{coord: [pp, dp, tp]}}"
        (k, v), = target.items()
        if k == "world_rank":
            return ([int(v)], "") if int(v) in live else ([], f"no live slot with world rank {v} (live: {sorted(live)})")
        if k == "logical_rank":
            w = self.rank_map.get(int(v))
            return ([w], "") if w in live else ([], f"no live slot holds logical rank {v} (grid has {len(self.rank_map)})")
        if k == "node":
            ws = sorted(w for w, s in live.items() if s.node == v)
            return (ws, "") if ws else ([], f"no live slot on node {v!r} (nodes: {sorted({s.node for s in live.values()})})")
        if k == "coord" and self.grid:
            pp, dp, tp = (int(x) for x in v)
            T, PP, D = self.grid
            if not (0 <= pp < PP and 0 <= dp < D and 0 <= tp < T):
                return [], f"coord {list(v)} outside the grid tp={T} pp={PP} dp={D}"
            w = self.rank_map.get((pp * D + dp) * T + tp)
            return ([w], "") if w in live else ([], f"no live slot at coord {list(v)}")
        return [], f"unknown target key {k!r}"
