"""What ``phoenix status`` says is one story: each place where two parts of a status (or a record and the
status derived from it) could tell different things, on synthetic journal records. One test per case."""

from __future__ import annotations

from phoenix_hpc.control import recovery_machine
from phoenix_hpc.status.derive import derive_status
from phoenix_hpc.status.model import RunFiles, SlurmInfo

from test_status_derive import CONFIG, N1, N2, N3, _text, node_loss_records, run_files, running_slurm, start_records


def _header(st) -> dict[str, str]:
    """The header rows of the rendered status, {label: value}."""
    out, label = {}, None
    for line in _text(st).splitlines():
        if not line.strip():
            break
        head, _, rest = line.partition(" ")
        if head and not line.startswith(" "):
            label = head
            out[label] = rest.strip()
    return out


def test_a_job_slurm_forgot_without_a_final_record_has_ended_as_its_cause_says():
    """Slurm answered that it has no record of the job (it forgets ended jobs): the state is ``ended``, as
    the cause (coordinator loss) says, not the last journalled ``running``."""
    slurm = SlurmInfo(error="Slurm has no record of job 77", no_record=True)
    st = derive_status(start_records(), slurm, now=1e6, run=run_files())
    assert st.job.state == "ended" and st.job.end_cause == "coordinator loss"
    assert "coordinator_gone" in [w.code for w in st.warnings]
    h = _header(st)
    assert h["state"].startswith("ended") and "by coordinator loss" in h["ended"]


def test_a_shell_that_cannot_reach_slurm_says_so_and_blames_no_coordinator():
    """No SLURM_CONF: nothing is known of the job; a job 4 s after its submit is ``starting`` as journalled,
    Slurm is ``not reachable``, and nothing says it ended."""
    recs = start_records()[:1]
    st = derive_status(recs, SlurmInfo(error="Slurm not reachable; shown from the journal", unreachable=True),
                       now=4.0, run=RunFiles(run_dir="/runs/toy", config=CONFIG,
                                             job={"job_id": "77", "jobs": [{"job_id": "77"}]}))
    assert st.job.state == "starting" and st.job.end_cause is None
    assert [j.end for j in st.run_jobs] == ["unknown"]
    h = _header(st)
    assert "not reachable" in h["state"] and "ended" not in h


def test_a_plain_scancel_before_the_first_step_is_a_cancel_not_a_coordinator_loss():
    slurm = SlurmInfo(job={"JobId": "77", "JobState": "CANCELLED", "NodeList": "nid0000[1-3]", "BatchHost": N1})
    st = derive_status(start_records()[:1], slurm, now=5.0, run=run_files())
    assert st.job.state == "ended" and st.job.end_cause == "scancel"
    (w,) = [w for w in st.warnings if w.code == "coordinator_gone"]
    assert "cancelled" in w.message and "killed or its node lost" not in w.message


def test_injections_of_an_earlier_job_of_a_resumed_run_are_not_shown_with_negative_times():
    first = start_records() + [{"ts": 9.1, "event": "coordinator_stopped", "reason": "SIGTERM", "signal": "TERM"}]
    second = [{**r, "ts": r["ts"] + 100} for r in start_records()]
    fired = [{"ts": 5.0, "request_id": "old", "world_rank": 1, "step": 4, "phase": "forward_backward",
              "kind": "transient"},
             {"ts": 104.0, "request_id": "new", "world_rank": 1, "step": 4, "phase": "forward_backward",
              "kind": "transient"}]
    st = derive_status(first + second, running_slurm(), now=105.0, run=run_files(fired=fired))
    assert [i.request_id for i in st.injections] == ["new"]
    assert "t+-" not in _text(st)


def test_a_resumed_job_that_never_trained_says_so():
    recs = start_records()[:-2] + [{"ts": 2.0, "event": "progress", "step": 828, "min_step": 828, "generation": 0},
                                   {"ts": 3.0, "event": "clean_stop", "reason": "every rank failed at load"}]
    job = {"job_id": "78", "jobs": [{"job_id": "77", "resume_step": None}, {"job_id": "78", "resume_step": 828}]}
    st = derive_status(recs, None, now=10.0, run=RunFiles(run_dir="/runs/toy", config=dict(CONFIG, training={
        "steps": 1200}), job=job))
    assert st.job.resume_step == 828
    assert _header(st)["step"].startswith("828/1200 (resumed from the checkpoint of step 828, no step trained)")


def test_a_corrupt_replica_overwritten_by_later_commits_is_accounted_as_harmless():
    recs = start_records() + [
        {"ts": 4.0, "event": "inject_forwarded", "request_id": "c1", "kind": "corrupt_replica",
         "phase": "forward_backward", "at_step": 8, "targets": [1]},
        {"ts": 4.1, "event": "inject_armed", "request_id": "c1", "armed_steps": [[1, 8]]},
        {"ts": 5.0, "event": "inject_landed", "request_id": "c1", "world_rank": 1, "step": 8,
         "phase": "forward_backward", "kind": "corrupt_replica"},
        {"ts": 6.0, "event": "commit", "recoverable_step": 9, "generation": 0},
    ]
    st = derive_status(recs, running_slurm(), now=6.5, run=run_files())
    (inj,) = st.injections
    assert inj.outcome.startswith("held")  # both corrupted copies may still be read
    later = recs + [{"ts": 7.0, "event": "commit", "recoverable_step": 10, "generation": 0}]
    st = derive_status(later, running_slurm(), now=7.5, run=run_files())
    (inj,) = st.injections
    assert inj.outcome.startswith("overwritten (harmless)") and "overwritten (harmless)" in _text(st)


def test_after_a_shrink_dead_slots_keep_the_coordinates_of_the_grid_they_died_in():
    """tp=1 pp=2 dp=2 (world w = logical w; coord [pp, dp, tp]); world 1 (logical 1: pp0 dp1) dies and spare
    world 4 takes logical 1; then world 3 (logical 3: pp1 dp1) dies with no spare left: dp 2 -> 1, the kept
    slots 0 and 2 become logical 0 and 1 of a grid where dp only goes to 0."""
    grid = [1, 2, 2]
    recs = [{"ts": 0.0, "event": "coordinator_started", "grid": grid}]
    for w, node in enumerate([N1, N1, N2, N2]):
        recs.append({"ts": 0.1, "event": "registered", "world_rank": w, "pid": w, "node": node, "role": "active",
                     "logical_rank": w})
    recs.append({"ts": 0.2, "event": "registered", "world_rank": 4, "pid": 4, "node": N3, "role": "standby"})
    recs += [
        {"ts": 1.0, "event": "job_running", "grid": grid, "rank_map": [[i, i] for i in range(4)], "standby": [4]},
        {"ts": 10.0, "event": "slots_dead", "slots": [1], "nodes": [N1], "kind": "process_exit", "reason": "x"},
        {"ts": 11.0, "event": "recovery_start", "generation": 1, "survivors": [0, 2, 3], "dead": [1]},
        {"ts": 12.0, "event": "recovery_plan", "generation": 1, "action": "hot_swap",
         "rank_map": [[0, 0], [1, 4], [2, 2], [3, 3]], "dead_world": [1], "recoverable_step": 7,
         "joins": [{"world_rank": 4, "node": N3, "logical_rank": 1, "replaces_world_rank": 1}]},
        {"ts": 13.0, "event": "recovery_restored", "generation": 1, "recoverable_step": 7},
        {"ts": 20.0, "event": "slots_dead", "slots": [3], "nodes": [N2], "kind": "process_exit", "reason": "x"},
        {"ts": 21.0, "event": "recovery_start", "generation": 2, "survivors": [0, 2, 4], "dead": [1, 3]},
        {"ts": 22.0, "event": "recovery_plan", "generation": 2, "action": "shrink", "grid": {"tp": 1, "pp": 2, "dp": 1},
         "rank_map": [[0, 0], [1, 2]], "dead_world": [3], "recoverable_step": 9, "joins": [],
         "shrink": {"old_grid": {"tp": 1, "pp": 2, "dp": 2}, "leavers": [4]}},
        {"ts": 23.0, "event": "shrink", "generation": 2, "dp_from": 2, "dp_to": 1, "recoverable_step": 9,
         "freed": [4], "lost": [3]},
        {"ts": 24.0, "event": "recovery_restored", "generation": 2, "recoverable_step": 9},
    ]
    st = derive_status(recs, None, now=25.0, run=RunFiles(run_dir="/r", config=dict(
        CONFIG, parallelism={"tp": 1, "pp": 2, "dp": 2})))
    by = {s.world_rank: s for s in st.slots}
    assert (by[0].logical_rank, by[0].coord) == (0, [0, 0, 0]) and (by[2].logical_rank, by[2].coord) == (1, [1, 0, 0])
    # the dead keep where they were when they died: logical 1 = pp0 dp1, logical 3 = pp1 dp1 of the 1x2x2 grid
    assert (by[1].state, by[1].coord) == ("dead", [0, 1, 0]) and (by[3].state, by[3].coord) == ("dead", [1, 1, 0])
    assert "replaced by world rank 4 (logical rank 1 of generation 1)" in by[1].note
    # the second recovery lost world 3 only (world 1 was replaced by the first)
    assert [r.dead_slots for r in st.recoveries] == [[1], [3]]


def test_a_fault_reported_while_a_stop_is_under_way_is_no_fault(tmp_path):
    """``scancel --signal=TERM``: the coordinator stops the job; a rank whose peer left first reports
    "Connection closed by peer". The coordinator journals it superseded and status lists no fault."""
    from phoenix_hpc.control import protocol as P
    from phoenix_hpc.control.journal import read_journal

    from test_coordinator_register_batch import _coordinator, _register

    c, store = _coordinator(tmp_path, 2)
    _register(c, store, range(2))
    c._drain_inbox()
    c.request_stop("SIGTERM", signal="TERM")
    store.queue_push(P.KEY_IN, P.encode({"type": "fault", "world_rank": 1, "pid": 101, "generation": 0, "step": 5,
                                         "phase": "forward_backward", "exc_type": "RuntimeError",
                                         "message": "Connection closed by peer"}, c.secret))
    c._drain_inbox()
    (f,) = read_journal(tmp_path, "fault")
    assert f["superseded"] is True and not c.faults
    st = derive_status(read_journal(tmp_path), None, now=1e9, run=RunFiles(run_dir=str(tmp_path), config=None))
    assert st.faults == []


def test_the_live_step_says_how_fresh_it_is_and_takes_the_ranks_newer_step_logs():
    """The journal's progress lags the ranks (a ``progress`` record at most every ~1 s, from heartbeats): the
    ranks' own step logs give the newer step, and the header says how old the shown step is."""
    recs = start_records() + [{"ts": 4.0, "event": "progress", "step": 6, "min_step": 6, "generation": 0}]
    st = derive_status(recs, running_slurm(), now=8.0, run=run_files(rank_newest=[(7.5, 40), (7.4, 39), (7.0, 38)]))
    assert st.job.step == 40 and st.job.step_at == 7.5
    assert "40/20 (as of 0.5s ago)" in _header(st)["step"]
    # a log line older than the newest rollback (a restore to the committed step) is not the live step
    rolled = recs + [{"ts": 7.8, "event": "recovery_restored", "generation": 1, "recoverable_step": 30}]
    st = derive_status(rolled, running_slurm(), now=8.0, run=run_files(rank_newest=[(7.5, 40)]))
    assert st.job.step == 30 and st.job.step_at == 7.8


def test_a_second_recovery_lists_only_the_slots_it_lost():
    """Status: a journal of an older coordinator whose second ``recovery_start.dead`` still names the slot
    the first recovery replaced shows the second recovery's own loss only."""
    recs = start_records() + node_loss_records() + [
        {"ts": 20.0, "event": "slots_dead", "slots": [1], "nodes": [N1], "kind": "process_exit", "reason": "x"},
        {"ts": 21.0, "event": "recovery_start", "generation": 2, "survivors": [0, 4, 5], "dead": [1, 2, 3]},
    ]
    st = derive_status(recs, running_slurm(), now=22.0, run=run_files())
    assert [r.dead_slots for r in st.recoveries] == [[2, 3], [1]]


def test_the_coordinator_names_in_recovery_start_only_the_dead_members_of_the_generation_it_leaves(tmp_path):
    from phoenix_hpc.control.classify import Action, Decision
    from phoenix_hpc.control.journal import read_journal
    from phoenix_hpc.control.states import SlotState

    from test_coordinator_register_batch import _coordinator, _register

    c, store = _coordinator(tmp_path, 3)
    _register(c, store, range(3))
    c._drain_inbox()
    store.set = lambda key, value: None  # the generation key for the slots' rendezvous
    # world 1 was replaced by world 2 in generation 1 (its slot stays dead); now world 0 is lost
    for w in (1, 0):
        c.slots[w].machine.to(SlotState.DEAD, "lost")
    c.view.rank_map = {0: 0, 1: 2}
    c.view.generation = 1
    recovery_machine.start_recovery(c, Decision(Action.HOT_SWAP, "x"), [], 0.0, 1.0)
    (rec,) = read_journal(tmp_path, "recovery_start")
    assert rec["dead"] == [0]


def test_an_at_step_refusal_names_the_step_and_its_age_that_status_shows():
    """``inject-fault --at-step`` is judged against the live step ``phoenix status`` shows, and its refusal
    says how old that step is, as the status does."""
    import pytest

    from phoenix_hpc.errors import FaultError
    from phoenix_hpc.faults.kinds import check_at_step

    recs = start_records() + [{"ts": 4.0, "event": "progress", "step": 6, "min_step": 6, "generation": 0}]
    st = derive_status(recs, running_slurm(), now=8.0, run=run_files(rank_newest=[(7.5, 12)]))
    with pytest.raises(FaultError, match=r"step 10 is already done \(the job is at step 12\) as of 0.5 s ago"):
        check_at_step(10, live_step=st.job.step, total_steps=20, as_of_s=st.now - st.job.step_at)
