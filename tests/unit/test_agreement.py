"""Replica agreement (control/agreement.py): the DP peers' parameter digests of one committed step are
compared; a difference is a ``silent_corruption`` fault naming the step, the coordinate and the suspects;
bad reports are rejected with a journalled reason and never trigger anything."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from phoenix_hpc.control import recovery_machine
from phoenix_hpc.control.agreement import DIGEST_HEX, PENDING_STEPS, AgreementBook, check_report, compare, majority_of
from phoenix_hpc.control.classify import Action, FaultKind, combine
from phoenix_hpc.control.coordinator import Coordinator, Slot
from phoenix_hpc.control.journal import Journal, read_journal
from phoenix_hpc.control.states import JobState, SlotState, job_machine, slot_machine
from phoenix_hpc.runtime.checksum import digest64

A, B, C = "a" * 16, "b" * 16, "c" * 16


@pytest.mark.parametrize("digests, agree, majority, suspects", [
    ({0: A, 1: A}, True, (), ()),
    ({0: A, 1: A, 2: A}, True, (), ()),
    ({0: A, 1: B}, False, (), (0, 1)),              # dp = 2: nobody can tell who is right
    ({0: A, 1: B, 2: A}, False, (0, 2), (1,)),      # dp = 3: the minority is the suspect
    ({2: B, 0: A, 1: A}, False, (0, 1), (2,)),
    ({0: A, 1: B, 2: C}, False, (), (0, 1, 2)),     # no majority
    ({0: A, 1: A, 2: B, 3: B}, False, (), (0, 1, 2, 3)),  # a tie is no majority
    ({0: A, 1: A, 2: A, 3: B}, False, (0, 1, 2), (3,)),
])
def test_compare_table(digests, agree, majority, suspects):
    v = compare(7, 1, 0, digests)
    assert (v.step, v.pp, v.tp) == (7, 1, 0)
    assert (v.agree, v.majority, v.suspects) == (agree, majority, suspects)
    assert list(v.digests) == sorted(digests)


def test_compare_needs_two_peers_and_majority_of_nothing_is_empty():
    with pytest.raises(ValueError, match="at least two"):
        compare(1, 0, 0, {0: A})
    assert majority_of({}) == ()


@pytest.mark.parametrize("digest, gen, cur, why", [
    (A, 3, 3, None),
    ("0123456789abcdef", 0, 0, None),
    ("abc", 0, 0, "not 16 lower-case hex digits"),
    ("a" * 17, 0, 0, "not 16"),
    ("A" * 16, 0, 0, "not 16"),
    ("g" * 16, 0, 0, "not 16"),
    (12345, 0, 0, "'int' is not 16"),
    (None, 0, 0, "'NoneType' is not 16"),
    (A, 2, 3, "generation 2, the job is at generation 3"),
])
def test_check_report_table(digest, gen, cur, why):
    got = check_report(digest, gen, cur)
    assert (got is None) if why is None else (why in got)


def test_the_book_judges_a_step_once_all_peers_reported_it_and_drops_older_ones():
    b = AgreementBook(dp=3)
    assert b.add(5, 0, 0, 0, A) is None and b.add(5, 0, 1, 0, A) is None
    assert b.add(5, 0, 1, 0, A) is None  # a board re-sends the same report: still waiting for dp 2
    assert b.add(6, 0, 0, 0, A) is None  # another step of the coordinate waits on its own
    v = b.add(5, 0, 2, 0, B)
    assert v is not None and not v.agree and v.suspects == (2,) and v.majority == (0, 1)
    assert b.add(5, 0, 2, 0, B) is None  # judged once
    assert b.add(5, 1, 0, 0, A) is None  # another stage waits for its own peers
    assert b.summary() == {"checked": 1, "disagreed": 1, "last_step": 5}
    for d in range(3):
        v = b.add(6, 0, d, 0, A)
    assert v.agree and b.summary() == {"checked": 2, "disagreed": 1, "last_step": 6}
    # a step never completed (a peer's report was replaced by a newer one) is dropped when a newer one is judged
    b.add(8, 0, 0, 0, A)
    for d in range(3):
        v = b.add(9, 0, d, 0, A)
    assert v.agree and 8 not in b.pending[(0, 0)]
    for s in range(20, 20 + 3 * PENDING_STEPS):  # and at most PENDING_STEPS incomplete steps wait
        b.add(s, 0, 0, 0, A)
    assert len(b.pending[(0, 0)]) == PENDING_STEPS


def test_the_book_of_one_replica_judges_nothing():
    b = AgreementBook(dp=1)
    assert b.add(1, 0, 0, 0, A) is None and b.summary()["checked"] == 0


def test_digest64_is_xxh3_of_the_checksums_in_order():
    assert digest64([1, 2]) == xxhash.xxh3_64_intdigest(np.asarray([1, 2], dtype="<u8").tobytes())
    assert digest64([1, 2]) != digest64([2, 1]) and digest64([2**64 - 1]) < 2**64
    assert len(f"{digest64([3]):016x}") == DIGEST_HEX


def _coordinator(tmp_path, grid, generation=0) -> Coordinator:
    now = [50.0]
    c = Coordinator(tmp_path, grid=grid, clock=lambda: now[0])
    c.journal = Journal(tmp_path)
    c.job = job_machine(JobState.RUNNING)
    c.view.generation = generation  # the journal fold's generation, as after its recovery_start records
    tp, pp, dp = grid
    for w in range(tp * pp * dp):
        c.slots[w] = Slot(w, f"n{w}", 100 + w, "active", slot_machine(f"slot {w}", SlotState.ACTIVE), 0.0,
                          logical_rank=w, generation=generation, step=0)
        c.rank_map[w] = w
    return c


class _NullStore:
    """The coordinator's store where nothing sent is read back (sends and the generation key)."""

    def queue_push(self, key, value):
        pass

    def set(self, key, value):
        pass


def _commit(c, w, step, digest, g=0, board=False):
    shard = f"opt/pp0/tp0/dp{w}"
    params = [[step - 1, A], [step, digest]] if step > 1 else [[step, digest]]
    if board:  # the report riding on the node's heartbeats
        rec = {"g": g, "live_step": step, "shards": {shard: step}, "replicas": {}, "params": params}
        c._dispatch({"type": "heartbeats", "world_rank": w, "pid": 100 + w, "sent_at": None,
                     "beats": [[w, 100 + w, g, step, 0.1, rec]]})
    else:
        c._dispatch({"type": "commit", "world_rank": w, "pid": 100 + w, "generation": g, "live_step": step,
                     "shards": {shard: step}, "replicas": {}, "params": params})


def test_dp3_a_minority_digest_is_a_silent_corruption_naming_the_member_and_the_majority(tmp_path):
    c = _coordinator(tmp_path, (1, 1, 3))
    for w in range(3):
        _commit(c, w, 4, A, board=True)
    _commit(c, 0, 5, A)
    _commit(c, 1, 5, B, board=True)
    _commit(c, 1, 5, B, board=True)  # the board re-sends it
    assert not c.faults and not read_journal(tmp_path, "silent_corruption")
    _commit(c, 2, 5, A)
    [rec] = read_journal(tmp_path, "silent_corruption")
    assert (rec["step"], rec["pp"], rec["tp"], rec["suspects"], rec["majority"]) == (5, 0, 0, [1], [0, 2])
    assert rec["members"] == {"0": A, "1": B, "2": A}
    [p] = list(c.faults)
    assert p.fault.kind is FaultKind.SILENT_CORRUPTION and p.fault.slots == (1,)
    assert "step 5" in p.fault.detail and "logical rank(s) [1]" in p.fault.detail
    # a step to roll back before: a local recovery restores step 4, the newest the replicas agreed at
    assert (p.fault.bad_step, p.fault.agreed_step) == (5, 4)
    assert combine([p.fault]).action is Action.LOCAL_RECOVERY
    _commit(c, 2, 5, A, board=True)  # judged once
    # steps 3, 4 (carried by the reports of step 4) and 5
    assert len(c.faults) == 1 and c.agreement.summary() == {"checked": 3, "disagreed": 1, "last_step": 5}


def test_dp2_a_difference_names_both_members_and_no_majority(tmp_path):
    c = _coordinator(tmp_path, (1, 1, 2))
    _commit(c, 0, 3, A)
    _commit(c, 1, 3, B)
    [rec] = read_journal(tmp_path, "silent_corruption")
    assert rec["suspects"] == [0, 1] and "majority" not in rec
    assert c.faults[0].fault.slots == (0, 1) and "no majority" in c.faults[0].fault.detail


def test_a_bad_or_old_digest_is_rejected_once_and_triggers_nothing(tmp_path):
    c = _coordinator(tmp_path, (1, 1, 2), generation=1)
    c.slots[1].generation = 0  # a slot whose report of generation 0 is still on its board
    _commit(c, 0, 3, "abc")
    _commit(c, 0, 3, "abc", g=1, board=True)  # the board repeats it: journalled once
    _commit(c, 1, 3, B, g=0)
    _commit(c, 0, 4, A, g=1)
    rej = read_journal(tmp_path, "agreement_rejected")
    assert [(r["world_rank"], r["step"]) for r in rej] == [(0, 3), (1, 3)]
    assert "16 lower-case hex" in rej[0]["reason"] and "generation 0" in rej[1]["reason"]
    assert not c.faults and not read_journal(tmp_path, "silent_corruption") and c.agreement.checked == 0
    c._dispatch({"type": "commit", "world_rank": 0, "pid": 100, "generation": 1, "live_step": 5,
                 "shards": {"x": 5}, "replicas": {}, "params": [["5", A], [6]]})
    rej = read_journal(tmp_path, "agreement_rejected")
    assert "not a non-negative integer" in rej[-2]["reason"] and "'list' is not 16" in rej[-1]["reason"]
    c._dispatch({"type": "commit", "world_rank": 0, "pid": 100, "generation": 1, "live_step": 5,
                 "shards": {"x": 5}, "replicas": {}, "params": {"step": 5, "digest": A}})
    assert "not a list of at most 64" in read_journal(tmp_path, "agreement_rejected")[-1]["reason"]


def test_dp1_is_journalled_once_as_undetectable(tmp_path):
    c = _coordinator(tmp_path, (2, 2, 1))
    for step in (1, 2):
        for w in range(4):
            _commit(c, w, step, A if w else B)
    [rec] = read_journal(tmp_path, "agreement_undetectable")
    assert rec["stages"] == [[0, 0], [0, 1], [1, 0], [1, 1]] and "dp = 1" in rec["reason"]
    assert not c.faults and not read_journal(tmp_path, "silent_corruption")


def test_a_bitflip_flips_the_lowest_bit_of_one_live_parameter_and_changes_the_digest():
    import torch

    from phoenix_hpc.faults.trigger import FaultTrigger, flip_param_bit
    from phoenix_hpc.runtime.checksum import checksum_function

    params = [("param/pp0/tp0/empty", torch.zeros(0)), ("param/pp0/tp0/w", torch.arange(6, dtype=torch.float32))]
    before = params[1][1].clone()
    fn = checksum_function("xxh3_64")

    def digest():
        return digest64([fn(t.numpy().view("u1")) for _, t in params])

    d0 = digest()
    assert flip_param_bit(params) == ("param/pp0/tp0/w", 3, 12)
    w = params[1][1]
    assert torch.equal(w[[0, 1, 2, 4, 5]], before[[0, 1, 2, 4, 5]]) and w[3] != before[3]
    assert torch.isfinite(w).all() and abs(float(w[3] - before[3])) < 1e-6
    assert w.view(torch.int32)[3] ^ before.view(torch.int32)[3] == 1
    assert digest() != d0
    with pytest.raises(ValueError, match="no parameter"):
        flip_param_bit([("x", torch.zeros(0))])
    # the trigger hands a due bitflip to its hook at the step's forward phase, and raises nothing
    seen = []
    trig = FaultTrigger(on_bitflip=seen.append)
    trig.arm("bitflip", 4, "forward_backward", "r1")
    trig.check(3, "forward_backward")
    assert not seen
    trig.check(4, "forward_backward")
    assert [i.kind for i in seen] == ["bitflip"]


def test_the_bitflip_kind_lands_before_the_snapshot_and_a_drill_expects_a_local_recovery():
    from phoenix_hpc.control.protocol import INJECT_KINDS
    from phoenix_hpc.drills.drill import DrillOutcome, plan_drill
    from phoenix_hpc.errors import FaultError
    from phoenix_hpc.faults.kinds import KINDS, check_phase

    spec = KINDS["bitflip"]
    assert spec.wire in INJECT_KINDS and spec.fault_kind == FaultKind.SILENT_CORRUPTION.value
    assert spec.action == "local_recovery"
    assert check_phase("bitflip", None) == "forward"
    with pytest.raises(FaultError, match="cannot land in phase 'optimizer'"):
        check_phase("bitflip", "optimizer")
    with pytest.raises(FaultError, match="parallelism.dp = 1: .*undetectable.*allowed with dp >= 2"):
        plan_drill(1, 0, steps=40, world=2, gpus_per_node=1, spare_nodes=1, kinds=["crash", "bitflip"], k=1)
    with pytest.raises(FaultError, match="protect_every_max = 2.*allowed with protect_every_max 1"):
        plan_drill(1, 0, steps=40, world=3, gpus_per_node=1, spare_nodes=1, kinds=["bitflip"], k=1, dp=3,
                   protect_every_max=2)
    plan = plan_drill(5, 0, steps=60, world=3, gpus_per_node=1, spare_nodes=0, kinds=["bitflip", "transient"],
                      k=1, dp=3)
    flips = [f for f in plan if f.kind == "bitflip"]
    assert flips and all(f.phase == "forward" for f in flips)
    assert len({f.rank for f in flips}) == len(flips)  # each rank at most once (a second flip would replace it)
    assert all(DrillOutcome(f).expected_action == "local_recovery" for f in flips)
    only = plan_drill(5, 1, steps=60, world=3, gpus_per_node=1, spare_nodes=0, kinds=["bitflip", "transient"],
                      k=1, dp=3)
    assert sum(f.kind == "bitflip" for f in only) <= 3  # every rank flipped: the other kind is drawn


def test_status_shows_the_agreement_checks_and_a_silent_corruption_as_a_detected_fault():
    from test_status_derive import running_slurm, run_files, start_records

    from phoenix_hpc.status.derive import derive_status
    from phoenix_hpc.status.render import agreement_text, status_line

    recs = start_records() + [
        {"ts": 4.0, "event": "commit", "recoverable_step": 5, "shards": 4, "replicas": 4, "generation": 0,
         "agreement": {"checked": 5, "disagreed": 0, "last_step": 5}},
        {"ts": 4.5, "event": "agreement_rejected", "world_rank": 3, "logical_rank": 3, "generation": 0, "step": 2,
         "reason": "parameter digest 'abc' is not 16 lower-case hex digits (64 bits)"}]
    st = derive_status(recs, running_slurm(), now=5.0, run=run_files())
    assert st.agreement == {"checked": 5, "disagreed": 0, "last_step": 5, "rejected": 1} and not st.faults
    assert "agreement: 5 checks (to step 5), 0 differed, 1 digest report(s) rejected" in status_line(st)
    recs.append({"ts": 4.8, "event": "silent_corruption", "generation": 0, "step": 6, "pp": 0, "tp": 0,
                 "members": {"0": A, "1": B, "2": A, "3": A}, "suspects": [1], "majority": [0, 2, 3]})
    st = derive_status(recs, running_slurm(), now=5.0, run=run_files())
    [f] = st.faults
    assert (f.kind, f.world_rank, f.step, f.source) == ("silent_corruption", 1, 6, "detected")
    assert "logical rank(s) [1] differ from the majority [0, 2, 3]" in f.message
    assert st.agreement["disagreed"] == 1 and ", 1 differed" in status_line(st)
    assert agreement_text({"undetectable": "dp = 1: no peer"}) == "agreement: undetectable (dp = 1: no peer)"


def test_a_repeated_report_is_taken_once_and_a_job_whose_replicas_differ_never_ends_done(tmp_path):
    c = _coordinator(tmp_path, (1, 1, 2))
    _commit(c, 0, 3, A, board=True)
    assert c.agreement.newest == {0: 3}
    c.agreement.pending[(0, 0)].clear()  # were the repeated steps taken again, they would wait again
    _commit(c, 0, 3, A, board=True)
    assert c.agreement.pending[(0, 0)] == {}
    _commit(c, 1, 3, B)
    assert len(c.faults) == 0  # step 3 of rank 0 was dropped above: nothing to compare with
    _commit(c, 0, 4, A)
    _commit(c, 1, 4, B)
    assert len(c.faults) == 1
    for w in (0, 1):
        c._dispatch({"type": "done", "world_rank": w, "pid": 100 + w, "generation": 0, "step": 4,
                     "state_hash": "h"})
    assert not read_journal(tmp_path, "job_done") and c.job.state is JobState.RUNNING


@pytest.mark.parametrize("first_bad, agreed, cks, ck, says", [
    (11, 10, [5, 10, 15, 20, 30], 10, ["last agreed at step 10", "checkpoint of step 10",
                                        "step(s) 15, 20, 30 were written after it", "move those aside"]),
    (11, 8, [5, 10, 15], 5, ["last agreed at step 8", "checkpoint of step 5", "step(s) 10, 15"]),
    (11, 10, [5, 10], 10, ["checkpoint of step 10"]),
    (11, 10, [], None, ["no persistent checkpoint from before the corruption", "submit the config again"]),
    (11, 10, [12], None, ["no persistent checkpoint from before", "step(s) 12 were written after"]),
    (11, None, [5, 10, 15], None, ["no earlier step was seen to agree", "submit the config again",
                                   "step(s) 15 were written after"]),
])
def test_restart_advice_names_only_a_checkpoint_from_before_the_corruption(first_bad, agreed, cks, ck, says):
    from phoenix_hpc.control.agreement import restart_advice

    got, text = restart_advice(first_bad, agreed, cks)
    assert got == ck
    for part in says:
        assert part in text, text
    if ck is None or ck == max(cks, default=None):
        assert "move those aside" not in text or any(s > (agreed or first_bad - 1) for s in cks)


def _fence_fault(c, w, step, agreed, g, digest=A):
    """A member's fault report of a commit fence that showed the replicas differ at ``step``."""
    c._dispatch({"type": "fault", "world_rank": w, "pid": 100 + w, "generation": g, "step": step + 2,
                 "phase": "wait_commit", "kind": "silent_corruption", "exc_type": "ReplicaDisagreement",
                 "message": f"silent corruption: the parameters differ at step {step}", "corrupt_step": step,
                 "agreed_step": agreed, "params": [[step, digest]]})


def test_a_disagreement_is_rolled_back_once_and_a_second_one_at_that_step_stops_the_job_naming_the_checkpoint(
        tmp_path):
    from phoenix_hpc.recovery.ckpt_files import mark_complete

    c = _coordinator(tmp_path, (1, 1, 3))
    root = tmp_path / "ck"
    c.t = type(c.t)(**{**c.t.__dict__, "checkpoint_path": str(root)})
    for s in (5, 10, 15):
        (root / f"step_{s:08d}").mkdir(parents=True)
        mark_complete(root, s, {"step": s})
    c.view.checkpoint(0.0, 15)  # a persistent checkpoint of step 15, as its record leaves the view

    c.store = _NullStore()
    for w in range(3):
        _commit(c, w, 10, A)  # steps 9 and 10 agree
    for w in range(3):
        _fence_fault(c, w, 11, 10, 0, B if w == 1 else A)  # every rank's fence saw it: its digest says who
    [sc] = read_journal(tmp_path, "silent_corruption")
    assert (sc["step"], sc["suspects"], sc["majority"]) == (11, [1], [0, 2])
    assert c.agreement.first_bad == 11 and c.agreement.bad_last_agreed == 10
    recovery_machine.decide(c, c.clock())
    [dec] = read_journal(tmp_path, "decision")
    assert dec["action"] == "local_recovery" and "differ at step 11" in dec["reason"], dec
    assert not read_journal(tmp_path, "clean_stop") and not read_journal(tmp_path, "slots_dead")
    assert c.recovery is not None and c.agreement.repaired == {11} and c.generation == 1
    # a coordinator restarted now knows the step was repaired (strikes: the table test of book_from_records;
    # this journal has no registrations to map logical to world ranks)
    back = Coordinator(tmp_path, restart=1, clock=lambda: 0.0)
    back.recorder.open(Journal(tmp_path), fold_existing=True)  # as Coordinator.open does for a restart
    back.grid = c.grid
    back._rebuild_from_journal()
    assert back.agreement.repaired == {11}
    # the recovery restores a step before 11, and the reports of the left generation are superseded
    assert recovery_machine.bad_step_of(c.recovery) == 11
    _fence_fault(c, 0, 11, 10, 0)
    assert not c.faults
    c.recovery = None  # (its phases are tested elsewhere) replayed: the fence of step 11 differs again
    for w in range(3):
        c.slots[w].generation = 1
        _fence_fault(c, w, 11, 10, 1, B if w == 1 else A)
    recovery_machine.decide(c, c.clock())
    [stop] = read_journal(tmp_path, "clean_stop")
    assert "differ again at step 11" in stop["reason"], stop
    assert stop["checkpoint_step"] == 10 and "checkpoint of step 10" in stop["message"]
    assert "step(s) 15 were written after it" in stop["message"]


def test_dp2_both_members_roll_back_and_neither_is_struck(tmp_path):
    c = _coordinator(tmp_path, (1, 1, 2))

    c.store = _NullStore()
    c.t = type(c.t)(**{**c.t.__dict__, "agreement_strikes_window_steps": 1000})
    for w in range(2):
        _commit(c, w, 6, A)
    for w in range(2):
        _fence_fault(c, w, 7, 6, 0, B if w else A)
    [sc] = read_journal(tmp_path, "silent_corruption")
    assert sc["suspects"] == [0, 1] and "majority" not in sc
    recovery_machine.decide(c, c.clock())
    [dec] = read_journal(tmp_path, "decision")
    assert dec["action"] == "local_recovery" and c.recovery is not None
    assert recovery_machine.bad_step_of(c.recovery) == 7  # both roll back before step 7: nobody can tell who
    assert c.agreement.strikes == {} and not read_journal(tmp_path, "slots_dead")


@pytest.mark.parametrize("strikes, member, step, window, kept, repeat", [
    ({}, 3, 10, 100, (10,), False),
    ({3: (10,)}, 3, 10, 100, (10,), False),  # the same step judged again, or replayed: no new strike
    ({3: (10,)}, 3, 110, 100, (10, 110), True),  # 100 steps apart: within the window
    ({3: (10,)}, 3, 111, 100, (111,), False),  # too far apart: the old strike expires
    ({3: (10,)}, 4, 12, 100, (12,), False),  # another member
    ({3: (10,)}, 3, 12, 0, (12,), False),  # window 0: never
])
def test_a_member_named_twice_within_the_window_is_a_repeat_offender(strikes, member, step, window, kept, repeat):
    from phoenix_hpc.control.agreement import add_strike

    got, rep = add_strike(strikes, member, step, window)
    assert got[member] == kept and rep is repeat
    assert all(got[m] == tuple(v) for m, v in strikes.items() if m != member)


def test_a_restarted_coordinators_book_has_the_repaired_steps_and_the_strikes():
    from phoenix_hpc.control.agreement import book_from_records

    recs = [
        {"event": "silent_corruption", "generation": 0, "step": 11, "suspects": [1], "majority": [0, 2]},
        {"event": "decision", "action": "local_recovery", "faults": [{"kind": "silent_corruption", "bad_step": 11}]},
        {"event": "silent_corruption", "generation": 1, "step": 30, "suspects": [0, 1]},  # dp = 2: no majority
        {"event": "decision", "action": "clean_stop", "faults": [{"kind": "silent_corruption", "bad_step": 40}]},
        {"event": "silent_corruption", "generation": 2, "step": 50, "suspects": [2], "majority": [0, 1]},
        {"event": "decision", "action": "hot_swap", "faults": [{"kind": "process_exit"}]},
    ]
    book = book_from_records(recs, dp=3, generation=3, rank_maps={2: {0: 0, 1: 1, 2: 7}},
                             rank_map={0: 0, 1: 1, 2: 2}, window=100)
    assert book.repaired == {11} and book.strikes == {1: (11,), 7: (50,)}  # logical 2 was world 7 in gen 2
    assert (book.generation, book.dp) == (3, 3)


def test_a_repeat_offender_is_fenced_and_replaced_restoring_a_step_before_the_difference(tmp_path):
    c = _coordinator(tmp_path, (1, 1, 3))
    c.t = type(c.t)(**{**c.t.__dict__, "agreement_strikes_window_steps": 50})

    class _Store:
        def queue_push(self, key, value):
            pass

    c.store = _Store()
    for w in range(3):
        _commit(c, w, 10, A)
    for w in range(3):
        _commit(c, w, 11, B if w == 1 else A)
    assert c.agreement.strikes == {1: (11,)} and not read_journal(tmp_path, "slots_dead")
    c.faults.clear()
    c.agreement.repaired.add(11)
    for w in range(3):
        _commit(c, w, 40, A)
    for w in range(3):
        _commit(c, w, 41, B if w == 1 else A)
    [dead] = read_journal(tmp_path, "slots_dead")
    assert dead["slots"] == [1] and dead["kind"] == "repeated_corruption", dead
    assert "steps 11, 41" in dead["reason"] and "agreement_strikes_window_steps = 50" in dead["reason"]
    kinds = {p.fault.kind: p.fault for p in c.faults}
    assert kinds[FaultKind.REPEATED_CORRUPTION].bad_step == 41
    assert combine([p.fault for p in c.faults]).action is Action.HOT_SWAP


def test_a_new_generation_or_a_shrunk_grid_starts_a_new_book(tmp_path):
    c = _coordinator(tmp_path, (1, 1, 3))
    for w in range(3):
        _commit(c, w, 2, A)  # steps 1 and 2 agree
    first = c.agreement
    c.view.generation = 1
    _commit(c, 1, 3, A)  # an old generation's report while the recovery runs: still compared in its book
    assert c.agreement is first and first.pending[(0, 0)] == {3: {1: A}}
    c.slots[1].generation = 1
    first.repaired.add(7)
    _commit(c, 1, 3, A, g=1)  # the new generation's first report: a new book
    assert c.agreement is not first and c.agreement.dp == 3 and c.agreement.generation == 1
    assert c.agreement.last_agreed == first.last_agreed == {(0, 0): 2}  # stays known (restart advice)
    assert c.agreement.repaired == {7}
    _commit(c, 2, 3, A)  # the old generation's reports are refused from now on
    assert read_journal(tmp_path, "agreement_rejected")[-1]["generation"] == 0
    c.grid = (1, 1, 1)  # the recovery's plan shrank dp to 1
    c.slots[0].generation = 1
    _commit(c, 0, 4, A, g=1)
    assert c.agreement.dp == 1
    [rec] = read_journal(tmp_path, "agreement_undetectable")
    assert rec["generation"] == 1


def test_the_cost_bench_judges_every_step_of_every_stage_once():
    from phoenix_hpc.bench.agreement_cost import coordinator_us, digest_us

    us, n, judged = coordinator_us(pp=2, dp=3, steps=20, history=8)
    assert n == 20 * 6 and judged == 20 * 2 and us > 0
    assert digest_us(4) > 0


# (name, decision, faults: (kind, bad_step, agreed_step), book: (first_bad, bad_last_agreed, repaired))
#   -> (action after, stop_from, repaired)
_HS = ("hot_swap", "a node")
_LR = ("local_recovery", "silent corruption")
_CS = ("clean_stop", "silent data corruption")
VERDICTS = [
    ("no book: the decision stands", _LR, [("silent_corruption", 7, 6)], None, ("local_recovery", None, set())),
    ("a first difference: repaired from memory", _LR, [("silent_corruption", 7, 6)], (7, 6, set()),
     ("local_recovery", None, {7})),
    ("the same step differs again: a clean stop naming the book's first difference", _LR,
     [("silent_corruption", 7, 6)], (7, 6, {7}), ("clean_stop", (7, 6), {7})),
    ("differs again, the book saw no difference: the reports' agreed step", _LR, [("silent_corruption", 9, 8)],
     (None, None, {9}), ("clean_stop", (9, 8), {9})),
    ("a clean stop of other faults: no restart advice", _CS, [("numerical", None, None)], (7, 6, set()),
     ("clean_stop", None, set())),
    ("a heartbeat-found difference stopping cleanly: the advice", _CS, [("silent_corruption", None, None)],
     (5, 3, set()), ("clean_stop", (5, 3), set())),
    ("a hot swap is not touched", _HS, [("node_loss", None, None)], (5, 3, {5}), ("hot_swap", None, set())),
]


@pytest.mark.parametrize("name,decision,faults,book,expected", VERDICTS, ids=[v[0] for v in VERDICTS])
def test_the_corruption_verdict_table(name, decision, faults, book, expected):
    from phoenix_hpc.control.agreement import AgreementBook, judge_corruption
    from phoenix_hpc.control.classify import Action, Decision, Fault, FaultKind

    fs = [Fault(FaultKind(k), (1,), (), False, "", bad_step=b, agreed_step=a) for k, b, a in faults]
    b = None
    if book is not None:
        b = AgreementBook(dp=3, generation=0)
        b.first_bad, b.bad_last_agreed, b.repaired = book[0], book[1], set(book[2])
    v = judge_corruption(Decision(Action(decision[0]), decision[1]), fs, b)
    assert (v.decision.action.value, v.stop_from, set(v.repaired)) == expected
    assert b is None or b.repaired == set(book[2])  # pure: the book is not changed


def test_a_difference_at_a_generations_first_commit_falls_back_saying_why(tmp_path):
    """The flip came before the first snapshot of the generation: no copy from before the bad step is in memory.
    The fallback says so, not that owner and holders are dead."""
    c = _coordinator(tmp_path, (1, 1, 2))

    c.store = _NullStore()
    for w in range(2):
        _fence_fault(c, w, 1, None, 0, B if w else A)
    recovery_machine.decide(c, c.clock())
    rec = c.recovery
    assert rec is not None and recovery_machine.bad_step_of(rec) == 1
    rec.quiesced = {w: {"live_step": 2, "shards": {f"opt/pp0/tp0/dp{w}": [1]},
                        "replicas": {f"opt/pp0/tp0/dp{1 - w}": [1]}} for w in range(2)}
    recovery_machine._plan(c, rec, c.clock())
    [fb] = read_journal(tmp_path, "fallback")
    assert fb["reason"].startswith("the DP replicas' parameters differed at step 1 and memory holds no copy"), fb
    assert "are dead" not in fb["reason"].split("the planner:")[0]
