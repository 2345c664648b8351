"""A member's part in a shrink (docs/design.md section 6, "Shrink"; the plan: :mod:`phoenix_hpc.recovery.shrink`).

Every slot named in the plan (members of the new, smaller grid and the *leavers*, the healthy slots of the
removed DP replicas) first takes a host copy of its own ``S(R)`` (the live state when it is clean and at
``R``, else its committed local snapshot) and ends its engine. Then:

- a leaver joins the recovery's exchange communicator only (members first in logical order, then the
  leavers; the generation's own communicator has the members only), sends every old optimizer slice the plan names it the source of, drops its copies and raises
  :class:`~phoenix_hpc.launch.execute.LeftToStandby`: its entry point waits as a spare from then on;
- a member takes the new grid, builds the generation's groups (torch over the members, MPI over members
  and leavers), constructs a new engine at its new coordinate, runs the plan's ``reshard`` transfers in plan
  order over the exchange communicator (each old slice sealed and verified as a replica is, :mod:`phoenix_hpc.runtime.snapshot`), loads its
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
from phoenix_hpc.launch.transfers import mine
from phoenix_hpc.recovery.plan import RecoveryPlan

EXCHANGE_TAG_BASE = 17000  # Create_group tags of the exchange communicators (generation g: base + g)


def _send(member, comm, sid: str, own_sid: str, own_opt: dict, peer: int, step: int) -> None:
    """Send old slice ``sid`` of ``S(step)`` to communicator rank ``peer``: the own slice from the host copy,
    another from the replica this slot holds of it (verified before it goes)."""
    from phoenix_hpc.runtime.h2h import send_buffer
    from phoenix_hpc.runtime.snapshot import OPT, seal_part, verify

    res = member.env.cfg.resilience
    if sid == own_sid:
        buf = seal_part(list(own_opt.items()), OPT, sid, step, member.generation).numpy()
    else:
        held = member._held_buffer(sid, step)
        h, _ = verify(held, (OPT,))
        buf = held.numpy()[: int(h.opt_end)]
    send_buffer(comm, buf, peer, step, res.chunk_bytes, res.collective_timeout_s,
                f"sending slice {sid} to communicator rank {peer}")


def _recv(member, comm, sid: str, peer: int, step: int) -> dict:
    from phoenix_hpc.runtime.h2h import recv_buffer
    from phoenix_hpc.runtime.snapshot import OPT, unpack

    res = member.env.cfg.resilience
    buf = recv_buffer(comm, peer, step, res.chunk_bytes, res.collective_timeout_s,
                      f"receiving slice {sid} from communicator rank {peer}")
    u = unpack(buf, (OPT,))  # raises ReplicationError when a checksum fails
    if u.shard_id != sid or u.step != step:
        raise RecoveryError(f"received slice is {u.shard_id} step {u.step}, expected {sid} step {step}")
    return dict(u.tensors)


def _exchange(member, plan: RecoveryPlan, comm_order: list[int], own_sid: str, own_opt: dict, step: int) -> dict:
    """This slot's ``reshard`` transfers, in plan order, over the exchange communicator (members in logical
    order, then leavers; collective over them only); returns the received slices' tensors by name. The
    generation's own communicator has the members only: its collectives (the protector's) never wait for a
    leaver."""
    from phoenix_hpc.launch.execute import make_comm

    me = member.env.world_rank
    comm = make_comm(member.env.world_comm, comm_order, member.generation, tag_base=EXCHANGE_TAG_BASE)
    crank = {w: i for i, w in enumerate(comm_order)}
    got: dict = {}
    for t in mine([t for t in plan.transfers if t.kind == "reshard"], me, step, kinds=("reshard",)):
        if t.sender_world == me:
            _send(member, comm, t.shard_id, own_sid, own_opt, crank[t.receiver_world], step)
        else:
            got.update(_recv(member, comm, t.shard_id, crank[t.sender_world], step))
    return got  # the exchange communicator is dropped, not freed (a peer may have died: MPI_Comm_free is collective)


def apply_shrink(member, plan: RecoveryPlan, dirty: bool, live: int | None,
                 detail: dict[str, float] | None = None):
    """Carry out ``plan`` (``action == "shrink"``) on ``member`` (a :class:`phoenix_hpc.launch.execute.Member`).

    Returns the member's :class:`~phoenix_hpc.launch.execute.RecoveryRecord`, whose ``detail`` starts from
    ``detail`` (a survivor's ``leave`` and ``quiesce``, :meth:`~phoenix_hpc.launch.execute.Member.recover`).

    Raises:
        LeftToStandby: this slot is a leaver; it sent what it had to.
        RecoveryError: the slot is neither a member nor a leaver, a transfer is malformed, or a copy is missing.
        EngineError: the received slices do not cover the new slice exactly once.
    """
    from phoenix_hpc.launch.execute import CUT_AT, LeftToStandby, RestoreInterrupted
    from phoenix_hpc.runtime.snapshot import OPT, unpack

    e = member.env
    g = plan.generation
    R = plan.recoverable_step
    rank_map = plan.world_of()
    leavers = list(plan.leavers)
    comm_order = [rank_map[r] for r in range(len(rank_map))] + leavers
    leaving = e.world_rank in leavers
    me = plan.member_of(e.world_rank)
    if not leaving and me is None:
        raise RecoveryError(f"world rank {e.world_rank} is neither a member nor a leaver of generation {g}'s shrink")
    detail = dict(detail or {})  # a survivor's leave and quiesce (Member.recover)
    t0 = time.perf_counter()
    # S(R) in host memory and the engine ended (also a copy kept from a plan cut short at the arrival barrier)
    held, rolled, done = member._host_copy_then_teardown(R, dirty)
    if held is None:
        raise RecoveryError(f"world rank {e.world_rank} has no state to take into generation {g}'s shrink")
    own_opt, own_par, envelope = held
    detail.update(done)
    own_sid = member.coord.shard_prefix()
    member.generation = g
    e.progress.set(generation=g, step=None if leaving else R)  # as Member._apply_plan: R until the resume

    if leaving:  # send what the plan asks of this slot, then go back to standby
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        member.groups, member.comm = None, None
        _exchange(member, plan, comm_order, own_sid, own_opt, R)
        member.old_protector, member.kept, member.logical, member.rank_map = None, [], None, {}
        member.watchdog.close()  # the spare it becomes waits on the client itself, then joins as a new member
        e.client.started_step = 0  # as every spare: no step started, a fault for a recovery phase arms at any step
        e.log(f"[phoenix] world rank {e.world_rank}: DP replica removed by the shrink to generation {g} "
              f"(dp {plan.old_grid.dp} -> {plan.grid.dp}); back to standby")
        raise LeftToStandby(f"world rank {e.world_rank} left its DP replica in the shrink to generation {g}")

    member.rank_map, member.logical = rank_map, me
    e.grid = plan.grid
    try:
        detail.update(member._setup_groups())
        member.land_restore(plan.recovery_step())  # an injection for phase "restore" (not answered here)
    except RestoreInterrupted as ri:  # the engine has ended and the old grid's copies are no plan's source
        raise RecoveryError(f"world rank {e.world_rank}: the shrink to generation {g} was re-planned as generation "
                            f"{ri.msg.get('generation')} while {CUT_AT[ri.at].format(g=g)}; a cut-short shrink is "
                            "not resumed") from None
    t1 = time.perf_counter()
    member._construct_engine(state_follows=True)
    detail["engine"] = time.perf_counter() - t1
    t_reconf = time.perf_counter() - t0
    t2 = time.perf_counter()
    old = _exchange(member, plan, comm_order, own_sid, own_opt, R)
    needs = dict(plan.needs).get(e.world_rank, ())
    sources = dict(plan.sources)
    for sid in needs:  # what this slot is the source of itself: its own slice, or a replica it holds
        if sid == own_sid:
            old.update(own_opt)
        elif sources.get(sid) == e.world_rank:
            old.update(unpack(member._held_buffer(sid, R), (OPT,)).tensors)  # verified as it is unpacked
    eng = member.engine
    eng.load_param_shard(own_par)
    eng.load_resharded_optimizer(old, plan.old_grid.dp)
    c = member.coord  # the envelope of S(R) at the member's new coordinate and grid (nothing else changes)
    eng.load_envelope({**envelope, "coord": c.to_json(), "grid": e.grid.to_json()})
    t_opt = time.perf_counter() - t2
    if int(eng.step) != R:
        raise RecoveryError(f"rank {member.logical} is at step {eng.step} after the shrink, plan says {R}")
    # the old layout's copies name shards of the old grid: none of them may serve a later recovery, nor be
    # offered as evidence
    member.old_protector, member.kept = None, []
    return member._report_and_resume(g, rank_map, R, live, dirty, rolled, detail, "rebuild", t_reconf=t_reconf,
                                     t_params=0.0, t_opt=t_opt, at_step=plan.recovery_step(),
                                     what=f" after a shrink to dp {e.grid.dp}",
                                     replan_ok=False)
