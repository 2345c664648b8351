"""A member's part in a recovery (docs/design.md section 6, steps 1-7) as an object with explicit phases.

A recovery starts either with an error inside the step (a gloo collective that failed or timed out because
a peer died, a commit that timed out, an injected fault: reported as ``fault``, then the member waits for
the coordinator's ``quiesce``) or with a ``quiesce`` received at a step boundary. Then:

1. *quiesce*: the partial step is abandoned, the torch process groups of ``g`` are destroyed at once
   (:meth:`Member.release_groups`: a member still blocked in a collective with this one fails with a closed
   connection instead of waiting for ``collective_timeout_s``), the protector is closed without waiting on
   peers (its buffers stay readable), and the member answers ``quiesced`` with its live step (optimizer steps fully applied),
   the steps of the verified copies of its shard and of the replicas it holds (committed and previous
   ping-pong buffer, committed first; every held replica is verified again first and one that fails is
   left out and listed in ``rejected``), and ``dirty`` when the error hit inside
   ``optimizer_step`` (an update partially applied: only the committed snapshot may be used, I4);
2. *plan*: it waits for ``recover`` {plan} (:class:`phoenix_hpc.recovery.plan.RecoveryPlan` JSON);
3. *reconfigure*: ``destroy_process_group`` and :func:`phoenix_hpc.launch.groups.init_generation` for
   ``g + 1`` with the plan's rank map, and the new MPI communicator (``Create_group`` involves only the
   members of the group, never a dead rank; the spare's world rank joins it);
4. *roll back*: a survivor whose live step is past the recoverable step ``R`` (or that is dirty) loads
   S(R) from its committed local snapshot (checksums verified): optimizer shard, parameters, envelope (step,
   data position, LR schedule, RNG);
5. *restore the spare* (the plan's transfers, :mod:`phoenix_hpc.launch.transfers`: a rank's transfers with
   one peer in plan order, with different peers at once, while it rolls back (step 4), builds its engine
   (a joining spare) or does steps 3''-4' (rebuild path), :func:`~phoenix_hpc.launch.transfers.sources_ready`
   permitting): parameters from a live DP peer at the same (pp, tp), the param part of its local snapshot
   of R (a checksum per tensor; sealed from its engine when it has none), and optimizer shard + envelope
   as the holder's replica buffer of step R, both sent over the new MPI communicator as H2H sends a
   replica (:class:`phoenix_hpc.runtime.h2h.BufferTransfer`: windowed chunks, tags under ``MPI_TAG_UB``)
   and verified (CRC-32 of every tensor) by the receiver before use; the copies of R come from this
   generation's protector or, before its first commit fence, from the kept protectors of earlier
   generations (:class:`phoenix_hpc.launch.copies.Copies`);
6. *re-establish replication*: a new protector for ``g + 1`` (placement recomputed from the new node list
   with :func:`phoenix_hpc.topology.generation_placement`);
7. it answers ``recovered`` {MemberReport, timings {reconfigure, params, optimizer} in seconds}, waits for
   ``resume`` and continues training from step ``R``. The report is evidence for the coordinator's checks
   (:meth:`RankRecovery.evidence`): the hashes of its restored optimizer and param shard and the replicas its
   previous protector holds, verified again; plus the holders its new protector sends to.

A standby slot named in a plan's ``joins`` does steps 3, 5, 6, 7 with a freshly built engine
(:meth:`RankRecovery.of_joiner`).

Steps 3 and 4 above are the ``rebind`` recovery path: a survivor keeps its engine and gives it the new
groups (:meth:`Engine.rebind`). On the ``rebuild`` path (``resilience.recovery_path``, default the engine's
own style; an engine with global state, such as megatron-core's ``parallel_state``, supports only this one)
every member of the new generation, survivors and joining spares together, builds the generation anew:

3'. a survivor first takes its own host copy of S(R): the committed local snapshot of R from its old
   protector when its live step is past R or it is dirty, else (live step R, clean) a copy of its live
   state (param shard, optimizer shard, envelope) to host memory; then it ends its engine
   (:meth:`Engine.teardown`: no object or global state of the old generation is left);
3''. every member builds the generation's groups (only the world group when the engine owns its groups,
   ``Engine.owns_groups``; the engine's constructor creates dp/pp/tp and the member uses ``engine.groups``)
   and constructs a new engine, in lockstep: every collective of construction is entered by every member
   in the same order;
4'. a survivor loads its host copy of S(R) into the new engine; a spare is restored by the transfers of
   step 5 as on the ``rebind`` path, which run meanwhile (a survivor sends the param part of its local
   snapshot of R, or, without one, seals the parameters from its new engine once that is at S(R)).

A ``checkpoint_restart`` plan takes the same steps 3' (without the host copy) and 3'', then loads the
checkpoint. :attr:`RecoveryRecord.path` (also in ``rank{r}.json`` and the rank's log line) says which path
ran.

A plan with ``action == "checkpoint_restart"`` (memory replicas could not cover the loss) replaces steps 4
and 5: every member of the new generation loads the persistent checkpoint of the plan's recoverable step
(:func:`phoenix_hpc.launch.persist.restore_step`, collective over the new world group).

The phases (:class:`Phase`) and their table (:data:`TRANSITIONS`): QUIESCING (step 1) -> PLANNING (2) ->
TRANSFERRING (3-5, or a shrink's part, :func:`phoenix_hpc.launch.shrink.apply_shrink`, whose leaver ends in
STANDBY) -> VERIFYING (the evidence, step 6) -> RESUMING (7) -> TRAINING. A re-plan heard in a wait on the other
members (the arrival barrier, the transfers, the new protector's arrival, the wait for ``resume``) goes back
to QUIESCING: a re-plan before ``recovered`` is answered from what the member quiesced with; one after it
(waiting for ``resume``) quiesces the member again from the new generation. The waits report the re-plan by
raising :class:`~phoenix_hpc.launch.signals.RestoreInterrupted` from their poll callbacks; :meth:`RankRecovery.run`
turns it into that transition in one place.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.launch import transfers
from phoenix_hpc.launch.copies import HostCopy, Offer
from phoenix_hpc.launch.member_env import RecoveryRecord
from phoenix_hpc.launch.signals import CUT_AT, RestoreInterrupted
from phoenix_hpc.recovery.plan import RecoveryPlan


class Phase(Enum):
    """Where a member is in its part of a recovery."""

    QUIESCING = "quiescing"  # leaving the generation (or answering a re-plan's quiesce): ``quiesced`` sent
    PLANNING = "planning"  # waiting for the plan; a newer quiesce meanwhile is answered again
    TRANSFERRING = "transferring"  # the new generation's groups, its own S(R), the plan's transfers or checkpoint
    VERIFYING = "verifying"  # the evidence (restored hashes, held copies verified again), the new protector
    RESUMING = "resuming"  # ``recovered`` sent, waiting for ``resume``
    TRAINING = "training"  # resumed: the recovery is over
    STANDBY = "standby"  # a shrink removed this slot's DP replica: it sent what it held and waits as a spare


#: the allowed transitions; a member enters at QUIESCING, or (a joining standby slot, whose plan named it)
#: at TRANSFERRING. Back to QUIESCING: the coordinator re-planned (a member was lost before every member
#: answered ``recovered``; from TRANSFERRING and VERIFYING, a re-plan heard in a wait on the others)
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.QUIESCING: frozenset({Phase.PLANNING}),
    Phase.PLANNING: frozenset({Phase.TRANSFERRING}),
    Phase.TRANSFERRING: frozenset({Phase.VERIFYING, Phase.QUIESCING, Phase.STANDBY}),
    Phase.VERIFYING: frozenset({Phase.RESUMING, Phase.QUIESCING}),
    Phase.RESUMING: frozenset({Phase.TRAINING, Phase.QUIESCING}),
    Phase.TRAINING: frozenset(),
    Phase.STANDBY: frozenset(),
}
ENTRY = frozenset({Phase.QUIESCING, Phase.TRANSFERRING})


def next_phase(now: Phase, to: Phase) -> Phase:
    """``to`` when the table allows ``now -> to``. Pure.

    Raises:
        RecoveryError: the transition is not in :data:`TRANSITIONS`."""
    if to not in TRANSITIONS[now]:
        raise RecoveryError(f"a member's recovery cannot go from {now.value} to {to.value}")
    return to


@dataclass
class Restored:
    """What the restore (TRANSFERRING) leaves for the report: ``rolled`` (a survivor went back from its live
    step), the seconds of the ``recovered`` report's phases, the recovery path that ran, and whether a
    re-plan may still cut it short (not after a shrink)."""

    rolled: bool
    t_reconf: float
    t_params: float
    t_opt: float
    path: str
    what: str = ""  # said after "resumed at step R" in the log
    replan_ok: bool = True


class RankRecovery:
    """One member's part in a recovery, from its quiesce (or a joining spare's plan) to its resume, through the
    phases of :class:`Phase` (module doc). Build with :meth:`of_member` or :meth:`of_joiner`; :meth:`run`.

    ``member``: the :class:`phoenix_hpc.launch.execute.Member` whose generation, engine, groups and copies the
    recovery changes. The public methods below are what a shrink's part (:mod:`phoenix_hpc.launch.shrink`)
    is made of."""

    def __init__(self, member, phase: Phase, *, quiesce: dict[str, Any] | None = None, failed: bool = False,
                 plan: RecoveryPlan | None = None):
        if phase not in ENTRY:
            raise RecoveryError(f"a member's recovery cannot start at {phase.value}")
        self.member = member
        self.env = member.env
        self.phase = phase
        self.quiesce = quiesce  # the quiesce to answer (QUIESCING)
        self.failed = failed
        self.fresh = quiesce is not None  # QUIESCING leaves the generation (else: answers a re-plan)
        self.cut: RestoreInterrupted | None = None  # the re-plan that cut the last plan short
        self.plan = plan
        self.live: int | None = None  # the live step it quiesced with (None: a joining spare)
        self.dirty = False
        self.offer = Offer()
        self.quiesced: dict[str, float] = {}  # detail of the quiesce (leave, quiesce), counted in every plan
        self.answered = -1  # the generation of the last quiesce answered
        self.detail: dict[str, float] = {}
        self.restored: Restored | None = None
        self.report: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self.held: tuple[dict, dict, dict] | None = None  # rebuild: own S(R) in host memory until loaded
        self.done: dict[str, float] = {}  # the seconds of the host copy and teardown of ``held``
        self.spent = {"reconfigure": 0.0, "rollback": 0.0}  # the engine work's seconds, by the phase they count to
        self.rolled = False
        self.record: RecoveryRecord | None = None
        self.trail: list[Phase] = [phase]  # every phase it went through, in order

    @classmethod
    def of_member(cls, member, quiesce: dict[str, Any], failed: bool) -> "RankRecovery":
        """A member of the generation that ``quiesce`` ends; ``failed``: it left its step on an error."""
        return cls(member, Phase.QUIESCING, quiesce=quiesce, failed=failed)

    @classmethod
    def of_joiner(cls, member, plan: RecoveryPlan) -> "RankRecovery":
        """A standby slot that ``plan`` names in its joins."""
        return cls(member, Phase.TRANSFERRING, plan=plan)

    # --- the driver -------------------------------------------------------------------------------------
    def run(self) -> Phase:
        """Go through the phases until TRAINING (the record is :attr:`record`) or STANDBY.

        Raises:
            StopRequested: the coordinator said ``stop`` meanwhile;
            RecoveryError: an instruction did not come in time, the plan does not fit this slot, a re-plan
                after a shrink, or what the restore raises (ReplicationError, TransportWedged ...)."""
        steps = {Phase.QUIESCING: self._quiesce, Phase.PLANNING: self._plan, Phase.TRANSFERRING: self._transfer,
                 Phase.VERIFYING: self._verify, Phase.RESUMING: self._resume}
        while self.phase in steps:
            self.phase = next_phase(self.phase, steps[self.phase]())
            self.trail.append(self.phase)
        return self.phase

    # --- QUIESCING --------------------------------------------------------------------------------------
    def _quiesce(self) -> Phase:
        if self.fresh:
            self._leave_generation()
            self.fresh = False
            return Phase.PLANNING
        # a re-plan cut the last plan short: answer its quiesce with what this member quiesced with
        cut, self.cut = self.cut, None
        g = int(cut.msg["generation"])
        m = self.member
        self.env.log(f"[phoenix] rank {m.logical}: recovery re-planned as generation {g} while "
                     f"{CUT_AT[cut.at].format(g=m.generation)}; answering its quiesce")
        self._answer(g)
        return Phase.PLANNING

    def _answer(self, g: int) -> None:
        o = self.offer
        self.env.client.report_quiesced(g, -1 if self.live is None else self.live, o.shards, o.replicas, self.dirty,
                                        rejected=o.rejected, numel=o.numel)
        self.answered = g

    def _leave_generation(self) -> None:
        """Step 1 (module doc): close the protector without waiting on peers, offer its copies, answer."""
        m, e = self.member, self.env
        t_quiesce = time.perf_counter()
        m._mark_gc()
        g = int(self.quiesce["generation"])
        with e.client.injections_lock:  # a drain armed before this recovery cannot pause it any more
            e.client.drain = None
        self.dirty = bool(self.failed and m.phase == "optimizer_step")
        self.live = int(m.engine.step)
        m.trigger.check(self.live + 1, "recovery")
        prot, m.protector = m.protector, None
        if prot is not None:
            self._close(prot)
        self.offer = m.copies.offer(prot, m.logical)
        if getattr(m.engine, "supports_shrink", False):
            self.offer.numel = {f"pp{m.coord.pp}/tp{m.coord.tp}": m.engine.optimizer_numel()}
        self._answer(g)
        left_at, asked = m._left or (t_quiesce, None)
        m._left = None
        # out of the step (groups released, protector closed, copies checked) -> the answer; interrupt -> out
        self.quiesced = {"quiesce": time.perf_counter() - left_at,
                         **({"leave": left_at - asked} if asked is not None else {})}
        e.log(f"[phoenix] rank {m.logical}: quiesced for generation {g} (live step {self.live}, committed "
              f"{self.offer.shards}, holding {self.offer.replicas}, dirty={self.dirty})")

    def _close(self, prot) -> None:
        """Close the generation's protector at once: MPI requests still posted are cancelled or freed, those
        to a dead peer at once (runtime/mpi_faults.py).

        Raises:
            TransportWedged: its H2H thread did not leave MPI (the slot cannot take part in another
                generation)."""
        m = self.member
        dead_world = {int(w) for w in self.quiesce.get("dead") or ()}
        dead_peers = frozenset(r for r, w in m.rank_map.items() if w in dead_world)
        prot.close(abandon=True, dead_peers=dead_peers)
        if prot.wedged:
            from phoenix_hpc.errors import TransportWedged
            from phoenix_hpc.runtime.h2h import ABANDON_JOIN_S

            raise TransportWedged(
                f"rank {m.logical} gen {m.generation}: the H2H thread did not leave MPI within "
                f"{ABANDON_JOIN_S:g} s of the abandon (the MPI library deadlocked on a dead peer's "
                "connection); this slot cannot take part in another generation and leaves so that a spare "
                "replaces it")
        ab = prot.abandon_report
        if ab is not None and (ab.cancelled or ab.freed or ab.kept or ab.errors):
            self.env.log(f"[phoenix] rank {m.logical}: abandoned MPI requests of generation {m.generation}: "
                         f"{ab.cancelled} cancelled, {ab.freed} freed, {ab.kept} collectives kept, {ab.completed} "
                         f"completed, errors {ab.errors[:2]}")

    # --- PLANNING ---------------------------------------------------------------------------------------
    def _plan(self) -> Phase:
        while True:  # a re-planned recovery (a fault during this one): its quiesce is answered the same way
            msg = self.member._wait_for(("recover", "quiesce"), "recovery plan")
            if int(msg.get("generation", -1)) < self.answered:
                continue  # an older one (already superseded) is not answered
            if msg["type"] == "recover":
                self.plan = RecoveryPlan.from_json(msg["plan"])
                return Phase.TRANSFERRING
            self._answer(int(msg["generation"]))

    # --- TRANSFERRING -----------------------------------------------------------------------------------
    def _transfer(self) -> Phase:
        self.detail = dict(self.quiesced)
        self.member._replay_until = self.plan.replay_target()  # the coordinator hears the step past them at once
        try:
            if self.plan.shrink:
                from phoenix_hpc.launch.shrink import apply_shrink

                self.restored = apply_shrink(self, self.plan)
                return Phase.STANDBY if self.restored is None else Phase.VERIFYING
            self.restored = self._restore(self.plan)
            return Phase.VERIFYING
        except RestoreInterrupted as ri:  # its message only: its traceback holds the cut plan's frames
            self.cut = RestoreInterrupted(ri.msg, ri.at)
        self._cut_short()  # outside the handler: no traceback holds the cut plan's groups then
        return Phase.QUIESCING

    def _cut_short(self) -> None:
        """The plan was cut short: its groups go as after a fault. What it quiesced with is still here: the
        copies (its closed protector; a new one is built only after every member arrived at it) and its engine
        (untouched at the barrier on the rebind path; rebound and perhaps rolled back to S(R) after it; on the
        rebuild path ended, its host copy kept, or built and loaded after the barrier). It answers the live
        step it quiesced with: the newest step it finished, which the next plan counts as replayed. A joining
        spare offers nothing: an engine it built meanwhile is ended, the next plan builds and loads it again."""
        m = self.member
        if self.held is not None:  # the engine is gone: the next plan loads this copy
            m.copies.host_copy = HostCopy(self.plan.recoverable_step, self.held, self.rolled, self.done)
            self.held = None
        m.release_groups()
        if self.live is None and m.engine is not None:  # a joining spare's engine, built and partly loaded
            m._teardown_engine()

    def enter_generation(self, plan: RecoveryPlan, logical: int) -> None:
        """Take ``logical`` in ``plan``'s generation (its grid, rank map and generation number); heartbeats say
        the recoverable step from now on, not the live step it quiesced at: a node's heartbeat arriving after
        the resume must not put it past the steps it is about to replay."""
        m = self.member
        self.env.grid = plan.grid
        m.generation, m.rank_map, m.logical = plan.generation, plan.world_of(), logical
        self.env.progress.set(generation=plan.generation, step=plan.recoverable_step)

    def _restore(self, plan: RecoveryPlan) -> Restored:
        """Steps 3-5 (module doc) for a hot swap, a local recovery or a restart from the checkpoint."""
        m, e = self.member, self.env
        R = plan.recoverable_step
        mine = plan.member_of(e.world_rank)
        if mine is None:
            raise RecoveryError(f"world rank {e.world_rank} is not a member of generation {plan.generation}'s rank "
                                f"map {[list(x) for x in plan.rank_map]}")
        if m.logical is not None and mine != m.logical:
            raise RecoveryError(f"plan moves world rank {e.world_rank} from logical rank {m.logical} to {mine}")
        self.enter_generation(plan, mine)
        rebuild = m.recovery_path == "rebuild"
        self.rolled, self.held, self.done = False, None, {}
        t0 = time.perf_counter()
        if rebuild:  # 3': own host copy of S(R), then end the old engine
            self.held, self.rolled, self.done = self.host_copy_then_teardown(R, self.dirty,
                                                                             copy=not plan.from_checkpoint)
            self.detail.update(self.done)
        self.build_generation()
        t_reconf = time.perf_counter() - t0  # rebuild: teardown, groups and (below) the new engine
        self.spent = {"reconfigure": 0.0, "rollback": 0.0}  # the engine work's seconds, by the phase they count to
        if plan.from_checkpoint:  # memory could not cover the loss: every member loads the persistent checkpoint
            from phoenix_hpc.launch.persist import restore_step

            self._engine_work()
            t3 = time.perf_counter()
            restore_step(m.engine, m.groups, e.cfg, e.run_dir, R)
            self.rolled = self.live is not None
            self.detail["checkpoint_load"] = time.perf_counter() - t3
            t_params, t_opt = 0.0, self.detail["checkpoint_load"]
        else:  # 5: the engine work runs while this member's buffers go, when none of them needs the engine
            moved = transfers.run(m, plan.transfers, R, during=self._engine_work, check=m._restore_check("transfers"))
            t_params, t_opt = moved.params_s, moved.optimizer_s
            self.detail.update({f"wire.{k}": v for k, v in moved.wire.items()})
        if int(m.engine.step) != R:
            raise RecoveryError(f"rank {m.logical} is at step {m.engine.step} after the restore, plan says {R}")
        return Restored(self.rolled, t_reconf + self.spent["reconfigure"], t_params, t_opt + self.spent["rollback"],
                        m.recovery_path)

    def _engine_work(self) -> None:
        """3''/4/4': this member's engine, at S(R) unless its transfers bring it."""
        m, plan = self.member, self.plan
        R, detail, spent = plan.recoverable_step, self.detail, self.spent
        t1 = time.perf_counter()
        if m.engine is not None:  # rebind: keep the engine, give it the new groups
            m.engine.rebind(m.groups, m.coord)
            if not plan.from_checkpoint and (int(m.engine.step) != R or self.dirty):
                m._load_state(*m.copies.snapshot_state(R, m.logical))  # roll back to S(R) (I4)
                self.rolled = True
            elif self.live is not None and self.live != R:  # rolled back in a plan cut short after its rollback
                self.rolled = True
            detail["rollback"] = spent["rollback"] = time.perf_counter() - t1
            return
        # a joining spare, or every member on the rebuild path (3'')
        self.construct_engine()
        detail["engine"] = time.perf_counter() - t1
        spent["reconfigure" if m.recovery_path == "rebuild" else "rollback"] += detail["engine"]
        if self.held is not None:  # 4': the survivor's own S(R)
            t2 = time.perf_counter()
            m._load_state(*self.held)
            self.held = None
            detail["rollback"] = time.perf_counter() - t2
            spent["rollback"] += detail["rollback"]

    # --- the restore's parts (public: a shrink is made of them) ---------------------------------------
    def build_generation(self) -> dict[str, float]:
        """Step 3: this generation's groups and communicator (every member arrives first); then an injection
        for phase ``restore`` lands. Returns the seconds per part (added to the detail).

        Raises:
            RestoreInterrupted: a re-plan heard while waiting for the others."""
        m = self.member
        built = m._setup_groups()
        self.detail.update(built)
        m.land_restore(self.plan.recovery_step())
        return built

    def construct_engine(self) -> None:
        """This generation's engine on its groups, its state to be loaded next."""
        self.member._construct_engine(state_follows=True)

    def host_copy_then_teardown(self, R: int, dirty: bool, copy: bool = True) -> tuple[Any, bool, dict[str, float]]:
        """Step 3' of the rebuild path and of a shrink: ``(S(R) in host memory as (optimizer shard, param shard,
        envelope), or None without ``copy``; rolled back; seconds {"host_copy", "teardown"})``, the engine
        ended. The copy is the committed local snapshot of ``R`` when the live step is past ``R`` or dirty,
        else the live state. A survivor whose engine ended already, for a plan cut short at the arrival
        barrier, takes the copy it kept then (its seconds count here), or the committed snapshot of ``R`` when
        the re-plan restores an earlier step. ``(None, False, {})`` for a member with neither (a joining
        spare). Raises ReplicationError when no copy of ``R`` is there."""
        m = self.member
        if m.engine is None:
            kept, m.copies.host_copy = m.copies.host_copy, None
            if kept is None:
                return None, False, {}
            if not copy:
                return None, False, dict(kept.seconds)
            held, rolled = kept.state, kept.rolled
            if kept.step != R:
                held, rolled = m.copies.snapshot_state(R, m.logical), True
            return held, rolled, dict(kept.seconds)
        held, rolled, done = None, False, {}
        t0 = time.perf_counter()
        if copy:
            rolled = int(m.engine.step) != R or dirty
            held = m.copies.snapshot_state(R, m.logical) if rolled else self._live_state()
            done["host_copy"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        m._teardown_engine()
        done["teardown"] = time.perf_counter() - t1
        return held, rolled, done

    def _live_state(self) -> tuple[dict, dict, dict]:
        """A host copy of the engine's live state (its step is the recoverable step and it is clean), taken
        before the teardown: ``(optimizer shard, param shard, envelope)``, tensors copied to CPU, the envelope
        through JSON (nothing shared with the old engine)."""
        eng = self.member.engine
        opt = {n: t.detach().to("cpu", copy=True) for n, t in eng.optimizer_shard()}
        par = {n: t.detach().to("cpu", copy=True) for n, t in eng.param_shard()}
        return opt, par, json.loads(json.dumps(eng.envelope()))

    def held_buffer(self, shard_id: str, step: int):
        """The replica buffer of ``shard_id`` at ``step`` this slot holds (:meth:`Copies.held_buffer`)."""
        return self.member.copies.held_buffer(shard_id, step, self.env.world_rank)

    def drop_old_copies(self) -> None:
        """Forget the copies of the old layout: after a shrink they name shards of the old grid, and none of
        them may serve a later recovery, nor be offered as evidence."""
        self.member.copies.drop()

    def leave_to_standby(self) -> None:
        """A shrink's leaver, once it sent what it held: no groups, no copies, no logical rank; it waits as a
        spare from now on (on the client itself: its quiesce watchdog is closed) and joins as a new member."""
        m = self.member
        m.copies.drop()
        m.logical, m.rank_map = None, {}
        m.watchdog.close()
        # as every spare: no step started, a fault for a recovery phase arms at any step
        self.env.client.started_step = 0

    def leave_groups(self) -> None:
        """Destroy the old generation's torch groups (a leaver takes part in the exchange over MPI only)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        self.member.groups, self.member.comm = None, None

    # --- VERIFYING --------------------------------------------------------------------------------------
    def _verify(self) -> Phase:
        """Step 6 and the evidence: this generation's protector (the previous generation's copies of ``R`` stay
        usable until its first commit fence; a shrink has dropped them before: they name shards of the old
        grid)."""
        m, r = self.member, self.restored
        t2 = time.perf_counter()
        self.report = self.evidence()
        self.detail["evidence"] = time.perf_counter() - t2
        t2 = time.perf_counter()
        try:
            m.protector = m._build_protector(replan_ok=r.replan_ok)
        except RestoreInterrupted as ri:
            self.cut = RestoreInterrupted(ri.msg, ri.at)
        if self.cut is not None:
            self._cut_short()
            return Phase.QUIESCING
        created = m.protector.create_s
        self.detail.update({f"protector_{k}": v for k, v in created.items()})
        m.copies.carry_into()
        # every member reaches the protector's first collective only after its transfers: the wait there for
        # the slowest member (the receiving spare, usually) is measured apart ("protector_arrive") and left
        # out of "reconfigure", which then holds this member's own work; the transfers are not counted a
        # second time in it (the recovery's total is the same)
        t_repl = time.perf_counter() - t2 - created.get("arrive", 0.0)
        self.detail["protector"] = t_repl
        self.report["sent"] = {m.protector.shard_id: {"holders": list(m.protector.holders)}}
        self.timings = {"reconfigure": r.t_reconf + t_repl, "params": r.t_params, "optimizer": r.t_opt}
        return Phase.RESUMING

    def evidence(self) -> dict[str, Any]:
        """This member's ``recovered`` report (:class:`phoenix_hpc.recovery.invariants.MemberReport` JSON):
        the hashes of its restored optimizer and param shard (:func:`phoenix_hpc.runtime.snapshot.part_hash`)
        and every replica its previous protector holds, each verified again now (:meth:`Copies.held_evidence`)
        and listed with the shard id, step and generation its header names and the hash of its optimizer part."""
        from phoenix_hpc.runtime.snapshot import part_hash

        m = self.member
        eng, c, ck = m.engine, m.coord, self.env.cfg.resilience.checksum
        return {"world_rank": self.env.world_rank, "logical_rank": m.logical, "generation": m.generation,
                "rank_map": [[r, w] for r, w in sorted(m.rank_map.items())], "step": int(eng.step),
                "partial": False, "opt_shard": c.shard_prefix(), "opt_hash": part_hash(eng.optimizer_shard(), ck),
                "param_shard": c.param_shard(), "param_hash": part_hash(eng.param_shard(), ck),
                "held": m.copies.held_evidence(m.logical)}

    # --- RESUMING ---------------------------------------------------------------------------------------
    def _resume(self) -> Phase:
        """Step 7: ``recovered`` with the timings, then the wait for ``resume``. A ``quiesce`` of a later
        generation instead (a member was lost before every member answered; not after a shrink): this member
        is at ``S(R)`` with the copies of ``R`` kept, as in the first step of the generation, and quiesces
        again from there."""
        m, e, r, plan = self.member, self.env, self.restored, self.plan
        g, R = plan.generation, plan.recoverable_step
        m.trigger.check(plan.recovery_step(), "recovery")
        e.client.report_recovered(g, self.report, self.timings)
        while True:
            msg = m._wait_for(("resume", "quiesce"), "resume")
            if msg["type"] == "resume":
                break
            if int(msg.get("generation", -1)) > g:
                if not r.replan_ok:
                    raise RecoveryError(f"rank {m.logical}: generation {g}{r.what} was re-planned as generation "
                                        f"{msg['generation']} before it resumed; it cannot be quiesced again")
                e.log(f"[phoenix] rank {m.logical}: recovery re-planned as generation {msg['generation']} "
                      f"while waiting for the resume of generation {g}; quiescing again")
                m.release_groups()
                self.quiesce, self.failed, self.fresh = msg, False, True
                return Phase.QUIESCING
        if m._gc_mark is not None:
            from phoenix_hpc.launch.heap import PAUSES

            self.detail["gc"] = PAUSES.total_s - m._gc_mark
            m._gc_mark = None
        e.progress.set(step=int(m.engine.step))
        rec = RecoveryRecord(g, R, self.live, self.dirty, r.rolled, {k: round(v, 4) for k, v in self.timings.items()},
                             {k: round(v, 4) for k, v in self.detail.items()}, r.path)
        m.recoveries.append(rec)
        self.record = rec
        e.log(f"[phoenix] rank {m.logical} (world {e.world_rank}): generation {g} resumed at step {R}{r.what} "
              f"({'rolled back from ' + str(self.live) if r.rolled else 'no rollback'}) on the {rec.path} path, "
              f"timings {rec.timings}, detail {rec.detail}")
        return Phase.TRAINING
