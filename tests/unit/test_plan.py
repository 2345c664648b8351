"""The pure recovery plan: rank map, recoverable step, transfers, fallbacks."""

import pytest

from phoenix_hpc.recovery.plan import FallbackRequired, PlanInput, plan_recovery, shard_id_of

# 8 active slots, tp=2 pp=1 dp=4 on nodes A (world 0-3) and B (world 4-7); spare node C (world 8-11).
GRID = (2, 1, 4)
NODES = {**{w: "A" for w in range(4)}, **{w: "B" for w in range(4, 8)}, **{w: "C" for w in range(8, 12)}}
RANK_MAP = {r: r for r in range(8)}


def _placement(k=1, stride=1):
    """Holders of dp=i: DP ranks i+stride, i+2*stride, ... around the ring (same tp). stride=2 puts the
    first holder on the other node (domain-aware); stride=1 is the naive ring (same node for dp0->dp1)."""
    tp, _, dp = GRID
    out = {}
    for r in range(8):
        t, d = r % tp, r // tp
        out[shard_id_of(r, *GRID)] = tuple(((d + j * stride) % dp) * tp + t for j in range(1, k + 1))
    return out


def _committed(step, placement, owner_step=None):
    out = {}
    for sid, holders in placement.items():
        owner = next(r for r in range(8) if shard_id_of(r, *GRID) == sid)
        out[sid] = {owner: step if owner_step is None else owner_step, **{h: step for h in holders}}
    return out


def _plan(dead, live_step=10, committed_step=9, spares=range(8, 12), k=1, stride=1, **kw):
    pl = _placement(k, stride)
    inputs = PlanInput(
        generation=3, grid=GRID, rank_map=RANK_MAP, nodes=NODES, dead=dead, spares=list(spares), placement=pl,
        committed=kw.pop("committed", _committed(committed_step, pl)),
        live_steps=kw.pop("live_steps", {r: live_step for r in range(8) if r not in dead}), dirty=kw.pop("dirty", ()),
    )
    return plan_recovery(inputs, **kw)


def test_node_loss_moves_the_node_onto_the_spare_node():
    p = _plan(dead=[4, 5, 6, 7], stride=2)
    assert p.action == "hot_swap" and p.generation == 4 and p.old_generation == 3
    assert p.world_of() == {0: 0, 1: 1, 2: 2, 3: 3, 4: 8, 5: 9, 6: 10, 7: 11}
    assert [(j.world_rank, j.logical_rank, j.replaces_world_rank) for j in p.joins] == [(8, 4, 4), (9, 5, 5), (10, 6, 6), (11, 7, 7)]
    assert p.recoverable_step == 9 and p.steps_replayed == 1
    assert p.rollbacks == tuple((r, 10) for r in range(4))
    by_kind = {(t.kind, t.receiver_world): t for t in p.transfers}
    # optimizer shard of dp2 tp0 (rank 4) is held by dp0 tp0 (rank 0) on the other node
    assert by_kind[("optimizer", 8)].sender_world == 0 and by_kind[("optimizer", 8)].shard_id == "opt/pp0/tp0/dp2"
    # params from a live DP peer at the same (pp, tp), not the optimizer's holder: logical 4 is (dp2, tp0),
    # its live peers are dp0 tp0 = rank 0 (the holder) and dp1 tp0 = rank 2
    assert by_kind[("params", 8)].sender_world == 2 and by_kind[("params", 8)].shard_id == "param/pp0/tp0"
    assert by_kind[("params", 9)].sender_world == 3  # logical 5 (dp2, tp1): rank 1 holds its optimizer shard
    for spare in (8, 9, 10, 11):  # each spare receives from two senders
        assert by_kind[("params", spare)].sender_world != by_kind[("optimizer", spare)].sender_world
    sends = [t.sender_world for t in p.transfers]
    assert sorted(sends.count(w) for w in range(4)) == [2, 2, 2, 2]  # the four survivors send two each
    assert all(t.step == 9 for t in p.transfers)


def test_the_params_source_spreads_the_sends_and_avoids_the_holder():
    from phoenix_hpc.recovery.plan import params_source

    assert params_source([0, 2, 3], holder=0, sends={}) == 2  # not the holder; then dp order
    assert params_source([0, 2, 3], holder=5, sends={}) == 0  # the holder is no DP peer: dp order
    assert params_source([0, 2, 3], holder=5, sends={0: 1, 2: 1}) == 3  # the peer with the fewest sends
    assert params_source([0, 1], holder=0, sends={1: 1}) == 1  # a tie: the peer that is not the holder
    assert params_source([0], holder=0, sends={0: 3}) == 0  # the only peer, holder or not


def test_owner_and_its_only_holder_lost_falls_back_with_the_shard_named():
    # naive ring placement, k=1: dp2's only holder dp3 is on the same node -> lost together
    with pytest.raises(FallbackRequired, match=r"shard opt/pp0/tp0/dp2 lost: owner \(logical rank 4, B\)") as e:
        _plan(dead=[4, 5, 6, 7])
    assert "opt/pp0/tp0/dp2" in e.value.lost_shards and "persistent checkpoint" in str(e.value)


def test_k2_survives_the_same_double_fault():
    p = _plan(dead=[4, 5, 6, 7], k=2)
    opt = {t.shard_id: t for t in p.transfers if t.kind == "optimizer"}
    assert opt["opt/pp0/tp0/dp2"].sender_world == 0  # dp3 (dead) then dp0: the second holder
    assert opt["opt/pp0/tp0/dp3"].sender_world == 0
    assert all(t.step == 9 for t in p.transfers)


def test_single_crash_uses_one_standby_slot_and_the_replica_holder():
    p = _plan(dead=[5])
    assert p.world_of()[5] == 8 and len(p.joins) == 1
    (params,) = [t for t in p.transfers if t.kind == "params"]
    (opt,) = [t for t in p.transfers if t.kind == "optimizer"]
    assert params.sender_world == 1 and opt.sender_world == 7 and opt.shard_id == "opt/pp0/tp1/dp2"
    # the new member holds dp1 tp1's replica and its own shard goes to dp3: both re-established
    assert {(r.shard_id, r.owner, r.holder) for r in p.replication} == {("opt/pp0/tp1/dp1", 3, 5), ("opt/pp0/tp1/dp2", 5, 7)}


def test_fault_after_commit_before_any_optimizer_step_replays_nothing():
    p = _plan(dead=[5], live_step=9, committed_step=9)
    assert p.recoverable_step == 9 and p.steps_replayed == 0 and p.rollbacks == ()


def test_mixed_survivor_steps_roll_back_only_those_ahead():
    live = {r: 10 for r in range(8) if r != 5}
    live[0] = 9  # rank 0 had not applied step 10 yet
    p = _plan(dead=[5], live_steps=live)
    assert p.recoverable_step == 9 and (0, 9) not in p.rollbacks and (1, 10) in p.rollbacks


def test_local_recovery_uses_no_spare():
    p = _plan(dead=[])
    assert p.action == "local_recovery" and p.joins == () and p.transfers == ()
    assert p.recoverable_step == 10 and p.steps_replayed == 0 and p.generation == 4


def test_dirty_rank_rolls_back_to_its_committed_snapshot():
    p = _plan(dead=[], dirty=[3])
    assert p.recoverable_step == 9 and p.steps_replayed == 1 and len(p.rollbacks) == 8


def test_no_spare_left():
    with pytest.raises(FallbackRequired, match=r"no spare left: 1 dead slot\(s\) \(5\) but 0 standby slot\(s\)"):
        _plan(dead=[5], spares=[])


def test_dead_standby_is_just_released():
    p = _plan(dead=[8])
    assert p.action == "local_recovery" and p.released_spares == (8,)


def test_spare_pool_is_filled_per_node():
    nodes = {**NODES, 12: "D", 13: "D", 14: "D", 15: "D"}
    pl = _placement(2)
    p = plan_recovery(generation=0, grid=GRID, rank_map=RANK_MAP, nodes=nodes, dead=[0, 1, 2, 3],
                      spares=[8, 9, 12, 13, 14, 15], placement=pl, committed=_committed(9, pl),
                      live_steps={r: 9 for r in range(4, 8)})
    assert {p.world_of()[r] for r in range(4)} == {12, 13, 14, 15}  # one whole spare node, not split


def test_spare_whose_restore_was_cut_short_is_restored_in_place():
    p = _plan(dead=[], restore=[5], live_steps={r: 10 for r in range(8) if r != 5})
    assert p.action == "hot_swap" and p.joins == ()
    assert {(t.kind, t.receiver_world) for t in p.transfers} == {("params", 5), ("optimizer", 5)}


def test_replica_at_an_older_step_cannot_serve():
    pl = _placement(1)
    committed = _committed(9, pl)
    committed["opt/pp0/tp1/dp2"][7] = 8  # the holder never committed step 9
    with pytest.raises(FallbackRequired, match=r"no copy at the recoverable step 8"):
        _plan(dead=[5], committed=committed)


def test_plan_json_is_stable():
    p = _plan(dead=[5])
    j = p.to_json()
    assert j["rank_map"][5] == [5, 8] and j["joins"][0]["coord"] == [0, 2, 1] and j["invariants"] == ["I1", "I2", "I3", "I4", "I5"]


def test_survivor_ahead_of_the_dead_ranks_replica_serves_the_older_step_from_its_previous_buffer():
    """The commit race: every survivor committed S(10) but the dead rank's only replica holds S(9). With
    only the committed step per copy the plan cannot find S(9) on the survivors and must fall back; with
    both ping-pong buffers reported (committed S(10), previous S(9)) it recovers at 9 from memory."""
    pl = _placement(1)
    committed = _committed(10, pl)
    committed["opt/pp0/tp1/dp2"][7] = 9  # the holder of dead rank 5's shard verified only S(9)
    live = {r: 10 for r in range(8) if r != 5}
    with pytest.raises(FallbackRequired, match=r"no copy at the recoverable step 9"):
        _plan(dead=[5], committed=committed, live_steps=live)
    both = {sid: {h: ([s, s - 1] if h != 7 or sid != "opt/pp0/tp1/dp2" else [9, 8]) for h, s in c.items()}
            for sid, c in committed.items()}
    p = _plan(dead=[5], committed=both, live_steps=live)
    assert p.recoverable_step == 9 and p.steps_replayed == 1
    assert sorted(r for r, _ in p.rollbacks) == [r for r in range(8) if r != 5]
    (opt,) = [t for t in p.transfers if t.kind == "optimizer"]
    assert opt.sender_world == 7 and opt.step == 9


def test_copy_steps_may_be_lists_and_a_destroyed_buffer_counts_for_nothing():
    pl = _placement(1)
    committed = {sid: {h: [s, None] for h, s in c.items()} for sid, c in _committed(9, pl).items()}
    p = _plan(dead=[5], committed=committed)
    assert p.recoverable_step == 9
    committed["opt/pp0/tp1/dp2"][7] = [None, None]  # the holder's both buffers invalid (mid-receive)
    with pytest.raises(FallbackRequired, match=r"shard opt/pp0/tp1/dp2 lost"):
        _plan(dead=[5], committed=committed)


def test_checkpoint_restart_plan_puts_spares_in_and_reloads_everyone_at_the_checkpoint():
    from phoenix_hpc.recovery.plan import plan_checkpoint_restart

    live = {r: 14 for r in range(4)}
    p = plan_checkpoint_restart(generation=2, grid=GRID, rank_map=RANK_MAP, nodes=NODES, dead=[4, 5, 6, 7],
                                spares=list(range(8, 12)), checkpoint_step=10, live_steps=live)
    assert p.action == "checkpoint_restart" and p.generation == 3 and p.transfers == ()
    assert p.world_of() == {0: 0, 1: 1, 2: 2, 3: 3, 4: 8, 5: 9, 6: 10, 7: 11}
    assert p.recoverable_step == 10 and p.steps_replayed == 4 and [r for r, _ in p.rollbacks] == [0, 1, 2, 3]
    with pytest.raises(FallbackRequired, match=r"no spare left: 4 dead slot\(s\) \(4, 5, 6, 7\) but 2 standby"):
        plan_checkpoint_restart(generation=2, grid=GRID, rank_map=RANK_MAP, nodes=NODES, dead=[4, 5, 6, 7],
                                spares=[8, 9], checkpoint_step=10, live_steps=live)


def test_a_plan_reaches_a_rank_as_the_same_frozen_records():
    """What a rank receives (``to_json``, through JSON) is read back as the coordinator's records, for the
    three planners (the shrink's block included); a plan lacking a field is refused naming it."""
    import json

    from phoenix_hpc.errors import RecoveryError
    from phoenix_hpc.recovery.plan import RecoveryPlan, plan_checkpoint_restart

    plans = [_plan(dead=[4, 5, 6, 7], stride=2), _plan(dead=[]),
             plan_checkpoint_restart(generation=2, grid=GRID, rank_map=RANK_MAP, nodes=NODES, dead=[4, 5, 6, 7],
                                     spares=list(range(8, 12)), checkpoint_step=10, live_steps={r: 14 for r in range(4)})]
    from tests.unit.test_shrink import _plan as shrink_plan

    plans.append(shrink_plan(dead=[4]))
    for p in plans:
        back = RecoveryPlan.from_json(json.loads(json.dumps(p.to_json())))
        assert back == p, p.action
    assert plans[-1].shrink and plans[2].from_checkpoint and not plans[0].shrink
    d = plans[0].to_json()
    del d["recoverable_step"]
    with pytest.raises(RecoveryError, match="lacks recoverable_step"):
        RecoveryPlan.from_json(d)
    with pytest.raises(RecoveryError, match="malformed"):
        RecoveryPlan.from_json({**plans[0].to_json(), "rank_map": [[0]]})


def test_the_three_planners_take_one_input_record_or_its_fields_as_keywords():
    """:class:`PlanInput` is what every planner starts from; its fields given as keywords make the same record."""
    from dataclasses import asdict

    from phoenix_hpc.recovery.plan import plan_checkpoint_restart
    from phoenix_hpc.recovery.shrink import plan_shrink
    from tests.unit.test_shrink import _plan as shrink_plan

    p = _plan(dead=[5], dirty=[1])
    pl = _placement(1, 1)
    kw = dict(generation=3, grid=GRID, rank_map=RANK_MAP, nodes=NODES, dead=[5], spares=list(range(8, 12)),
              placement=pl, committed=_committed(9, pl), live_steps={r: 10 for r in range(8) if r != 5}, dirty=[1])
    assert plan_recovery(**kw) == p and p.rollbacks[0] == (0, 10)
    inputs = PlanInput(**kw)
    assert plan_checkpoint_restart(inputs, checkpoint_step=6) == plan_checkpoint_restart(**kw, checkpoint_step=6)
    s = shrink_plan(dead=[4])
    from tests.unit import test_shrink as S

    fields = dict(generation=2, grid=S.GRID, rank_map=S.RANK_MAP, nodes=S.NODES, dead=[4], placement=S._placement(),
                  committed=S._committed(), live_steps={r: 10 for r in range(S.N) if r != 4})
    assert plan_shrink(PlanInput(**fields), numel={"pp0/tp0": 10, "pp1/tp0": 7}) == s
    assert set(asdict(inputs)) == {"generation", "grid", "rank_map", "nodes", "dead", "live_steps", "spares",
                                   "placement", "committed", "dirty"}


def test_the_grid_is_one_type_a_named_tp_pp_dp_tuple_in_the_planners_the_plan_and_on_the_ranks():
    """topology.Grid is what launch.groups builds, what every planner puts in a plan (also a shrink's old grid),
    and what a rank reads back; it stays the ``(tp, pp, dp)`` tuple the journal and checkpoints store."""
    import json

    from phoenix_hpc.launch.groups import Grid as LaunchGrid, resolve_grid
    from phoenix_hpc.recovery.plan import RecoveryPlan
    from phoenix_hpc.topology import Grid
    from tests.unit.test_shrink import _plan as shrink_plan

    assert LaunchGrid is Grid and resolve_grid(2, 1, None, 8) == Grid(2, 1, 4) == (2, 1, 4)
    p, s = _plan(dead=[5]), shrink_plan(dead=[4])
    assert type(p.grid) is Grid and (p.grid.tp, p.grid.pp, p.grid.dp) == GRID and p.grid.world_size == 8
    assert type(s.old_grid) is Grid and s.old_grid.dp == s.grid.dp + 1
    back = RecoveryPlan.from_json(json.loads(json.dumps(s.to_json())))
    assert type(back.grid) is Grid and type(back.old_grid) is Grid and back.to_json()["grid"] == s.grid.to_json()
    assert Grid.of({"tp": 1, "pp": 2, "dp": 3}).to_json() == {"tp": 1, "pp": 2, "dp": 3}
