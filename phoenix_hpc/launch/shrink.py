"""A member's part in a shrink (docs/design.md section 6, "Shrink"; the plan: :mod:`phoenix_hpc.recovery.shrink`).

Every slot named in the plan (members of the new, smaller grid and the *leavers*, the healthy slots of the
removed DP replicas) first takes a host copy of its own ``S(R)`` (the live state when it is clean and at
``R``, else its committed local snapshot) and ends its engine. Then:

- a leaver joins the recovery's exchange communicator only (members first in logical order, then the
  leavers; the generation's own communicator has the members only), sends every old optimizer slice the plan
  names it the source of, drops its copies and goes back to standby
  (:attr:`~phoenix_hpc.launch.rank_recovery.Phase.STANDBY`): its entry point waits as a spare from then on;
- a member takes the new grid, builds the generation's groups (torch over the members, MPI over members
  and leavers), constructs a new engine at its new coordinate, runs the plan's ``reshard`` transfers in plan
  order over the exchange communicator (each old slice sealed and verified as a replica is,
  :mod:`phoenix_hpc.runtime.snapshot`), loads its
  stage's parameters from its own ``S(R)``, re-partitions its optimizer slice from the old slices it needs
  (:meth:`phoenix_hpc.engines.zero.ShardedAdamW.load_resharded`) and its envelope with the new coordinate and
  grid, and reports as in any recovery. The copies of the old layout are dropped: they name shards of the old
  grid. The new generation's first commit fence protects ``S(R)`` in the new layout.

A transfer in plan order is deadlock-free: every slot runs its own transfers in the one order of the plan, so
the earliest unfinished one always has both its ends waiting for it.
"""

from __future__ import annotations

import time

from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.launch.member_env import make_comm
from phoenix_hpc.launch.signals import CUT_AT, RestoreInterrupted
from phoenix_hpc.launch.transfers import mine
from phoenix_hpc.recovery.plan import RecoveryPlan

EXCHANGE_TAG_BASE = 17000  # Create_group tags of the exchange communicators (generation g: base + g)


def _send(rec, comm, sid: str, own_sid: str, own_opt: dict, peer: int, step: int, generation: int) -> None:
    """Send old slice ``sid`` of ``S(step)`` to communicator rank ``peer``: the own slice from the host copy,
    another from the replica this slot holds of it (verified before it goes)."""
    from phoenix_hpc.runtime.h2h import send_buffer
    from phoenix_hpc.runtime.snapshot import OPT, seal_part, verify

    res = rec.env.cfg.resilience
    if sid == own_sid:
        buf = seal_part(list(own_opt.items()), OPT, sid, step, generation).numpy()
    else:
        held = rec.held_buffer(sid, step)
        h, _ = verify(held, (OPT,))
        buf = held.numpy()[: int(h.opt_end)]
    send_buffer(comm, buf, peer, step, res.chunk_bytes, res.collective_timeout_s,
                f"sending slice {sid} to communicator rank {peer}")


def _recv(rec, comm, sid: str, peer: int, step: int) -> dict:
    from phoenix_hpc.runtime.h2h import recv_buffer
    from phoenix_hpc.runtime.snapshot import OPT, unpack

    res = rec.env.cfg.resilience
    buf = recv_buffer(comm, peer, step, res.chunk_bytes, res.collective_timeout_s,
                      f"receiving slice {sid} from communicator rank {peer}")
    u = unpack(buf, (OPT,))  # raises ReplicationError when a checksum fails
    if u.shard_id != sid or u.step != step:
        raise RecoveryError(f"received slice is {u.shard_id} step {u.step}, expected {sid} step {step}")
    return dict(u.tensors)


def _exchange(rec, plan: RecoveryPlan, comm_order: list[int], own_sid: str, own_opt: dict) -> dict:
    """This slot's ``reshard`` transfers, in plan order, over the exchange communicator (members in logical
    order, then leavers; collective over them only); returns the received slices' tensors by name. The
    generation's own communicator has the members only: its collectives (the protector's) never wait for a
    leaver."""
    me, step = rec.env.world_rank, plan.recoverable_step
    comm = make_comm(rec.env.world_comm, comm_order, plan.generation, tag_base=EXCHANGE_TAG_BASE)
    crank = {w: i for i, w in enumerate(comm_order)}
    got: dict = {}
    for t in mine([t for t in plan.transfers if t.kind == "reshard"], me, step, kinds=("reshard",)):
        if t.sender_world == me:
            _send(rec, comm, t.shard_id, own_sid, own_opt, crank[t.receiver_world], step, plan.generation)
        else:
            got.update(_recv(rec, comm, t.shard_id, crank[t.sender_world], step))
    return got  # the exchange communicator is dropped, not freed (a peer may have died: MPI_Comm_free is collective)


def apply_shrink(rec, plan: RecoveryPlan):
    """Carry out ``plan`` (``action == "shrink"``) as this slot's part of the recovery ``rec`` (a
    :class:`phoenix_hpc.launch.rank_recovery.RankRecovery`, through its public methods).

    Returns:
        what the restore leaves for the report (:class:`~phoenix_hpc.launch.rank_recovery.Restored`; the
        seconds of the host copy, teardown, groups and engine go to ``rec.detail``), or None when this slot
        is a leaver: it sent what it had to and is a standby slot again.

    Raises:
        RecoveryError: the slot is neither a member nor a leaver, a transfer is malformed, a copy is missing,
            or the shrink was re-planned before it resumed (a cut-short shrink is not resumed).
        EngineError: the received slices do not cover the new slice exactly once.
    """
    from phoenix_hpc.launch.rank_recovery import Restored
    from phoenix_hpc.runtime.snapshot import OPT, unpack

    e = rec.env
    g, R = plan.generation, plan.recoverable_step
    rank_map = plan.world_of()
    leavers = list(plan.leavers)
    comm_order = [rank_map[r] for r in range(len(rank_map))] + leavers
    leaving = e.world_rank in leavers
    me = plan.member_of(e.world_rank)
    if not leaving and me is None:
        raise RecoveryError(f"world rank {e.world_rank} is neither a member nor a leaver of generation {g}'s shrink")
    t0 = time.perf_counter()
    # S(R) in host memory and the engine ended (also a copy kept from a plan cut short at the arrival barrier)
    held, rolled, done = rec.host_copy_then_teardown(R, rec.dirty)
    if held is None:
        raise RecoveryError(f"world rank {e.world_rank} has no state to take into generation {g}'s shrink")
    own_opt, own_par, envelope = held
    rec.detail.update(done)
    own_sid = rec.member.coord.shard_prefix()

    if leaving:  # send what the plan asks of this slot, then go back to standby
        rec.member.generation = g
        e.progress.set(generation=g, step=None)
        rec.leave_groups()
        _exchange(rec, plan, comm_order, own_sid, own_opt)
        rec.leave_to_standby()
        e.log(f"[phoenix] world rank {e.world_rank}: DP replica removed by the shrink to generation {g} "
              f"(dp {plan.old_grid.dp} -> {plan.grid.dp}); back to standby")
        return None

    rec.enter_generation(plan, me)  # the new grid; R in the heartbeats until the resume
    try:
        rec.build_generation()  # an injection for phase "restore" lands there (not answered here)
    except RestoreInterrupted as ri:  # the engine has ended and the old grid's copies are no plan's source
        raise RecoveryError(f"world rank {e.world_rank}: the shrink to generation {g} was re-planned as generation "
                            f"{ri.msg.get('generation')} while {CUT_AT[ri.at].format(g=g)}; a cut-short shrink is "
                            "not resumed") from None
    t1 = time.perf_counter()
    rec.construct_engine()
    rec.detail["engine"] = time.perf_counter() - t1
    t_reconf = time.perf_counter() - t0
    t2 = time.perf_counter()
    old = _exchange(rec, plan, comm_order, own_sid, own_opt)
    sources = dict(plan.sources)
    for sid in dict(plan.needs).get(e.world_rank, ()):  # what this slot is the source of itself: its own slice,
        if sid == own_sid:  # or a replica it holds
            old.update(own_opt)
        elif sources.get(sid) == e.world_rank:
            old.update(unpack(rec.held_buffer(sid, R), (OPT,)).tensors)  # verified as it is unpacked
    eng = rec.member.engine
    eng.load_param_shard(own_par)
    eng.load_resharded_optimizer(old, plan.old_grid.dp)
    c = rec.member.coord  # the envelope of S(R) at the member's new coordinate and grid (nothing else changes)
    eng.load_envelope({**envelope, "coord": c.to_json(), "grid": plan.grid.to_json()})
    t_opt = time.perf_counter() - t2
    if int(eng.step) != R:
        raise RecoveryError(f"rank {rec.member.logical} is at step {eng.step} after the shrink, plan says {R}")
    rec.drop_old_copies()
    return Restored(rolled, t_reconf, 0.0, t_opt, "rebuild", what=f" after a shrink to dp {plan.grid.dp}",
                    replan_ok=False)
