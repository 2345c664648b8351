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
