"""A member tells the coordinator at once when its step is past the steps its recovery replays
(launch/execute.py ``Member._report_replayed``), instead of leaving it to its node's next heartbeat."""

from types import SimpleNamespace

from phoenix_hpc.launch.execute import Member
from phoenix_hpc.recovery.plan import RecoveryPlan


def _member(step: int, generation: int, until):
    m = Member.__new__(Member)  # only what the report reads
    sent = []
    m.env = SimpleNamespace(client=SimpleNamespace(heartbeat=lambda g, s: sent.append((g, s))))
    m.engine = SimpleNamespace(step=step)
    m.generation = generation
    m._replay_until = until
    return m, sent


def test_the_target_is_the_recoverable_step_plus_the_replayed_ones():
    def plan(replayed):
        return RecoveryPlan(action="local_recovery", old_generation=2, generation=3, rank_map=((0, 0),),
                            dead_world=(), released_spares=(), joins=(), transfers=(), recoverable_step=17,
                            rollbacks=(), replication=(), steps_replayed=replayed)

    assert plan(2).replay_target() == (3, 19)
    assert plan(0).replay_target() is None


def test_the_step_past_the_replayed_ones_is_reported_once():
    m, sent = _member(6, 2, (2, 7))
    m._report_replayed()
    assert sent == [] and m._replay_until == (2, 7)  # step 7 not done yet
    m.engine.step = 7
    m._report_replayed()
    assert sent == [(2, 7)] and m._replay_until is None


def test_a_target_of_an_older_generation_is_dropped_unsent():
    m, sent = _member(9, 3, (2, 7))  # re-planned since: the newer plan sets its own
    m._report_replayed()
    assert sent == [] and m._replay_until is None


def test_a_failed_send_is_no_fault_of_the_step():
    m, _ = _member(7, 2, (2, 7))

    def down(g, s):
        raise OSError("store unreachable")

    m.env.client.heartbeat = down
    m._report_replayed()  # the node's heartbeat carries the step later
    assert m._replay_until is None


def test_the_first_phase_of_an_iteration_reports_the_finished_steps():
    """``_phase(s, "forward_backward")`` runs before iteration ``s``: the engine has finished ``s - 1``."""
    m, sent = _member(17, 2, (2, 18))
    m.env.client.started_step = None
    m.copies, m.protector, m._poll = SimpleNamespace(kept=[]), None, lambda: None
    m.trigger = SimpleNamespace(check=lambda s, phase: None)
    m._phase(18, "forward_backward")  # replaying step 18: not past it
    assert sent == []
    m.engine.step = 18
    m._phase(19, "forward_backward")
    assert sent == [(2, 18)] and m.env.client.started_step == 19
