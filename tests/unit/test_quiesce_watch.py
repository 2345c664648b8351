"""The quiesce watchdog (phoenix_hpc.launch.quiesce_watch) with a fake coordinator client."""

import collections
import threading
import time

import pytest

from phoenix_hpc.launch.quiesce_watch import QuiesceWatchdog


class FakeClient:
    def __init__(self):
        self.instructions = collections.deque()
        self.pending = collections.deque()
        self.lock = threading.Lock()

    def push(self, *msgs):
        with self.lock:
            self.pending.extend(msgs)

    def poll(self):
        with self.lock:
            out = list(self.pending)
            self.pending.clear()
        return out

    poll_if_rung = poll  # no doorbell: every call polls (CoordinatorClient without a liveness connection)

    def wait_ring(self, timeout_s):
        time.sleep(timeout_s)


def _until(pred, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


@pytest.fixture
def make():
    """``make(on_quiesce) -> (client, watchdog)``; every watchdog is closed after the test."""
    made = []

    def build(on_quiesce):
        c = FakeClient()
        made.append(QuiesceWatchdog(c, on_quiesce, interval_s=0.01))
        return c, made[-1]

    yield build
    for wd in made:
        wd.close()
    assert not any(t.name == "phoenix-quiesce" for t in threading.enumerate())


def test_armed_watchdog_fires_once_on_quiesce_and_keeps_every_instruction_in_order(make):
    fired = []
    c, wd = make(fired.append)
    wd.arm()
    q = {"type": "quiesce", "generation": 1}
    c.push({"type": "resume"}, q, {"type": "quiesce", "generation": 2})
    _until(lambda: fired)
    time.sleep(0.05)
    assert fired == [q]  # once per arming
    wd.disarm()
    assert list(c.instructions) == [{"type": "resume"}, q, {"type": "quiesce", "generation": 2}]
    assert wd.take_fired() == q
    assert list(c.instructions) == [{"type": "resume"}, {"type": "quiesce", "generation": 2}]
    assert wd.take_fired() is None
    wd.arm()
    c.push({"type": "quiesce", "generation": 3})
    _until(lambda: len(fired) == 2)
    wd.disarm()
    assert wd.take_fired(remove=False) == {"type": "quiesce", "generation": 3}
    assert list(c.instructions)[-1] == {"type": "quiesce", "generation": 3}  # left for the reader


def test_disarmed_watchdog_takes_nothing_and_fires_on_nothing(make):
    fired = []
    c, wd = make(fired.append)
    wd.arm()
    wd.disarm()
    c.push({"type": "quiesce", "generation": 1})
    time.sleep(0.1)
    assert fired == [] and list(c.instructions) == [] and list(c.pending)
    wd.pump()  # the training thread's own poll moves it
    assert list(c.instructions) == [{"type": "quiesce", "generation": 1}]


def test_stop_fires_too_and_a_failing_abort_does_not_kill_the_thread(make):
    calls = []

    def boom(msg):
        calls.append(msg)
        raise RuntimeError("abort failed")

    c, wd = make(boom)
    wd.arm()
    c.push({"type": "stop", "reason": "x"})
    _until(lambda: calls)
    wd.arm()  # a new arming may fire again
    c.push({"type": "quiesce", "generation": 3})
    _until(lambda: len(calls) == 2)
    assert [m["type"] for m in calls] == ["stop", "quiesce"]


def test_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        QuiesceWatchdog(FakeClient(), lambda m: None, interval_s=0)


def test_listening_watchdog_pumps_in_order_without_firing_until_armed(make):
    fired = []
    c, wd = make(fired.append)
    wd.listen()
    q = {"type": "quiesce", "generation": 1}
    c.push({"type": "resume"}, q)
    _until(lambda: len(c.instructions) == 2)
    time.sleep(0.05)
    assert fired == [] and not wd.fired and list(c.instructions) == [{"type": "resume"}, q]
    wd.arm()  # what was heard while listening is left for the first step's read; new ones fire
    q2 = {"type": "quiesce", "generation": 2}
    c.push(q2)
    _until(lambda: fired)
    wd.disarm()
    assert fired == [q2] and list(c.instructions) == [{"type": "resume"}, q, q2]
    wd.listen()
    wd.disarm()  # ends listening too
    c.push({"type": "stop"})
    time.sleep(0.05)
    assert c.pending and fired == [q2]


def test_an_active_slot_listens_from_registration_relative_to_its_start_step(tmp_path):
    """The rank entry point, right after registration: instructions are read before the first generation is
    built, and injections are judged against the step the slot will start from (a resubmitted run: its
    newest complete checkpoint), not 0."""
    from types import SimpleNamespace

    from phoenix_hpc.launch.rank import listen_from_registration
    from phoenix_hpc.recovery.ckpt_files import mark_complete, step_dir

    cfg = SimpleNamespace(training=SimpleNamespace(steps=300), resilience=SimpleNamespace(
        enabled=True, mode="phoenix", checkpoint=SimpleNamespace(path=None)))
    c = FakeClient()
    c.world_rank, c.started_step, c.last_step = 3, 0, None
    assert listen_from_registration(c, cfg, tmp_path, "/some/restore/dir") == {"watchdog": None, "start_step": None}
    step_dir(tmp_path / "checkpoints", 40).mkdir(parents=True)
    mark_complete(tmp_path / "checkpoints", 40, "final")
    got = listen_from_registration(c, cfg, tmp_path, None)
    wd = got["watchdog"]
    try:
        assert got["start_step"] == 40 and (c.started_step, c.last_step) == (40, 300)
        c.push({"type": "quiesce", "generation": 1})
        _until(lambda: c.instructions)
        assert not wd.fired and wd.name == "phoenix-quiesce-3"
    finally:
        wd.close()
