"""A member tells the coordinator at once when its step is past the steps its recovery replays
(launch/execute.py ``Member._report_replayed``), instead of leaving it to its node's next heartbeat."""

from types import SimpleNamespace

from phoenix_hpc.launch.execute import Member


def _member(step: int, generation: int, until):
    m = Member.__new__(Member)  # only what the report reads
    sent = []
    m.env = SimpleNamespace(client=SimpleNamespace(heartbeat=lambda g, s: sent.append((g, s))))
    m.engine = SimpleNamespace(step=step)
    m.generation = generation
    m._replay_until = until
    return m, sent


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
