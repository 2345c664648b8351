"""A recovery plan is stored once under its key; the ``recover`` instruction names it by key and digest."""

from __future__ import annotations

import pytest

from phoenix_hpc.control import protocol as P

SECRET = b"k" * 64


class DictStore:
    def __init__(self):
        self.kv = {}

    def set(self, key, value):
        self.kv[key] = value

    def get(self, key):
        return self.kv[key]


PLAN = {"action": "hot_swap", "generation": 3, "rank_map": [[0, 0], [1, 4]], "recoverable_step": 23}


def test_recover_names_the_stored_plan_and_resolves_to_it():
    store = DictStore()
    body = P.plan_reference(store, 3, PLAN, SECRET)
    assert body == {"type": "recover", "generation": 3, "plan_key": "ctl/plan/3", "plan_sha256": P.plan_digest(PLAN)}
    msg = P.decode(P.encode(body, SECRET), SECRET)
    got = P.resolve_plan(msg, store.get, SECRET)
    assert got["plan"] == PLAN and got["generation"] == 3
    inline = {"type": "recover", "generation": 3, "plan": PLAN}  # a plan carried inline is kept as it is
    assert P.resolve_plan(inline, store.get, SECRET) is inline


def test_a_swapped_or_foreign_plan_is_refused():
    store = DictStore()
    body = P.plan_reference(store, 3, PLAN, SECRET)
    store.set("ctl/plan/3", P.encode({"type": "plan", "generation": 3, "plan": {**PLAN, "recoverable_step": 9}},
                                     SECRET))
    with pytest.raises(P.ProtocolError, match="does not match"):
        P.resolve_plan(body, store.get, SECRET)
    store.set("ctl/plan/3", P.encode({"type": "plan", "generation": 3, "plan": PLAN}, b"other" * 8))
    with pytest.raises(P.ProtocolError, match="MAC"):
        P.resolve_plan(body, store.get, SECRET)
    P.plan_reference(store, 4, PLAN, SECRET)
    store.set("ctl/plan/3", store.get("ctl/plan/4"))  # the plan of another generation
    with pytest.raises(P.ProtocolError, match="does not match"):
        P.resolve_plan(body, store.get, SECRET)


class _Empty(Exception):
    pass


class _DistError(Exception):
    pass


class QueueStore(DictStore):
    def __init__(self):
        super().__init__()
        self.queues = {}

    def queue_push(self, key, raw):
        self.queues.setdefault(key, []).append(raw)

    def queue_pop(self, key, block=False):
        q = self.queues.get(key)
        if not q:
            raise _Empty()
        return q.pop(0)


def _client(store, world_rank):
    import threading
    import types

    from phoenix_hpc.control.armed import ArmedInstructions
    from phoenix_hpc.control.client import CoordinatorClient

    c = object.__new__(CoordinatorClient)  # no coordinator process: the client's poll over a dict store
    c.store, c.secret, c.world_rank, c._lock = store, SECRET, world_rank, threading.Lock()
    c._dist = types.SimpleNamespace(QueueEmptyError=_Empty, DistError=_DistError)
    c._guard = P.ReplayGuard(max_age_s=None)
    c._alive, c._rings_seen = None, -1  # no liveness connection: every poll reads the store
    c._away_since = None  # the coordinator never went away
    c.armed = ArmedInstructions(world_rank, 0, lambda body: None)  # no inject or drain here
    return c


def test_every_member_reads_the_one_recover_message_with_its_plan_and_a_tampered_plan_is_dropped():
    store = QueueStore()
    raw = P.encode(P.plan_reference(store, 3, PLAN, SECRET), SECRET)  # one message, pushed to each member
    for w in (0, 4):
        store.queue_push(P.key_out(w), raw)
    for w in (0, 4):
        (msg,) = _client(store, w).poll()
        assert msg["type"] == "recover" and msg["plan"] == PLAN
    store.set("ctl/plan/3", P.encode({"type": "plan", "generation": 3, "plan": {**PLAN, "rank_map": []}}, SECRET))
    store.queue_push(P.key_out(1), raw)
    assert _client(store, 1).poll() == []  # as if it never came: the coordinator's restore deadline handles it
