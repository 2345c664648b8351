"""Registration at scale (issue 22): a batch of registrations costs one journal fsync, each answer goes out
only after the fsync that made its ``registered`` record durable (in-process, a fake store: pure message
handling). The time per registration at 1k-16k slots is measured by ``scripts/bench-control-plane``."""

from __future__ import annotations

import torch.distributed as dist

from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.coordinator import Coordinator
from phoenix_hpc.control.journal import Journal, read_journal


class _Store:
    """The two queue operations the coordinator's inbox uses, with a log of every push."""

    def __init__(self, journal: Journal):
        self.queues: dict[str, list[bytes]] = {}
        self.pushed: list[tuple[str, int]] = []  # (key, journal fsyncs at the time of the push)
        self.journal = journal

    def queue_push(self, key, value):
        self.queues.setdefault(key, []).append(value)
        self.pushed.append((key, self.journal.fsyncs))

    def queue_pop(self, key, block=False):
        q = self.queues.get(key)
        if not q:
            raise dist.QueueEmptyError("empty")
        return q.pop(0)


def _coordinator(tmp_path, n: int) -> tuple[Coordinator, _Store]:
    c = Coordinator(tmp_path, grid=(1, 1, n))
    c.secret = b"k" * 32
    c.journal = Journal(tmp_path)
    c.store = _Store(c.journal)
    return c, c.store


def _register(c: Coordinator, store: _Store, worlds) -> None:
    for w in worlds:
        store.queue_push(P.KEY_IN, P.encode({"type": "register", "world_rank": w, "pid": 100 + w,
                                             "node": f"n{w // 8}", "role": "active", "logical_rank": w,
                                             "grid": list(c.grid), "reply_to": f"r{w}"}, c.secret))
    store.pushed.clear()


def test_a_batch_of_registrations_is_made_durable_by_one_fsync_before_any_answer(tmp_path):
    c, store = _coordinator(tmp_path, 64)
    _register(c, store, range(40))
    before = c.journal.fsyncs
    c._drain_inbox()
    assert len(c.slots) == 40
    assert c.journal.fsyncs == before + 1  # one fsync for the 40 records, not 40
    replies = [(k, f) for k, f in store.pushed if k.startswith("ctl/reply/")]
    assert len(replies) == 40 and all(f == before + 1 for _, f in replies)  # every answer after that fsync
    assert [P.decode(store.queues[f"ctl/reply/r{w}"][0], c.secret)["type"] for w in (0, 39)] == ["registered"] * 2
    assert [r["world_rank"] for r in read_journal(tmp_path, "registered")] == list(range(40))
    # the last active registration starts the job: its record follows every registered record
    _register(c, store, range(40, 64))
    c._drain_inbox()
    events = [r["event"] for r in read_journal(tmp_path)]
    assert events[-1] == "job_running" and events.count("registered") == 64
    assert c.journal.sync() == 0  # nothing left undurable

