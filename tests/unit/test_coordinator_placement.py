"""The coordinator recomputes each generation's replica placement from what the slots registered (k, levels,
their nodes' failure domains) with the function the members build their protectors from; a holder's claim
on a replica whose owner never reported it is judged against it."""

from __future__ import annotations

from phoenix_hpc.control.coordinator import Coordinator, Slot
from phoenix_hpc.control.evidence import placement_inputs_problem
from phoenix_hpc.control.handlers import apply_commit
from phoenix_hpc.control.states import SlotState, slot_machine
from phoenix_hpc.topology import place_replicas


def _coordinator(tmp_path, nodes: list[str], k: int = 1) -> Coordinator:
    c = Coordinator(tmp_path, grid=(1, 1, len(nodes) - 1), clock=lambda: 0.0)
    for w, node in enumerate(nodes):  # the last slot is a spare
        role = "active" if w < len(nodes) - 1 else "standby"
        c.slots[w] = Slot(w, node, 100 + w, role, slot_machine(f"slot {w}", SlotState.ACTIVE), 0.0,
                          logical_rank=w if role == "active" else None, domain={"switch": f"s{w % 2}"})
    c.view.placement_inputs = {"k": k, "levels": ["node", "switch"]}
    return c


def test_placement_of_generation_0_and_after_a_hot_swap(tmp_path):
    c = _coordinator(tmp_path, ["a", "a", "b", "b", "c"])
    c.view.rank_maps = {0: {0: 0, 1: 1, 2: 2, 3: 3}, 1: {0: 0, 1: 1, 2: 2, 3: 4}}  # world 3 (node b) -> spare on c
    doms = {n: {"switch": f"s{w % 2}"} for w, n in enumerate(["a", "a", "b", "b", "c"])}
    got = c._placements(before=2)
    for g, nodes in ((0, ["a", "a", "b", "b"]), (1, ["a", "a", "b", "c"])):
        want = {sid: frozenset(h) for sid, h in
                place_replicas(1, 1, 4, 1, nodes, doms, ("node", "switch")).holders_by_shard().items()}
        assert {sid: h for (sid, gg), h in got.items() if gg == g} == want
    assert c._placements(before=1).keys() == {k for k in got if k[1] == 0}  # only generations before the new one


def test_no_placement_without_the_inputs_or_when_it_cannot_be_made(tmp_path):
    c = _coordinator(tmp_path, ["a", "a", "b", "b", "c"])
    c.view.rank_maps = {0: {0: 0, 1: 1, 2: 2, 3: 3}}
    c.view.placement_inputs = None
    assert c._placements(before=1) == {}
    c.view.placement_inputs = {"k": 3, "levels": ["node"]}  # 3 replicas on other nodes: only 1 other node
    assert c._placements(before=1) == {}


def test_malformed_placement_inputs_are_named():
    assert placement_inputs_problem({"k": 1, "levels": ["node"], "domain": None}) == ""
    assert "k True" in placement_inputs_problem({"k": True, "levels": ["node"]})
    assert "levels []" in placement_inputs_problem({"k": 1, "levels": []})
    assert "domain" in placement_inputs_problem({"k": 1, "levels": ["node"], "domain": {"switch": 3}})
    assert "is not an object" in placement_inputs_problem([1])


def test_an_owners_statement_riding_on_its_nodes_heartbeats_is_recorded(tmp_path):
    """With per-node heartbeats a commit report arrives as ``{"g", "live_step", "shards", "replicas", "sent"}``
    (no ``generation`` key): the owner's statement is kept for its generation as from a ``commit`` message."""
    c = _coordinator(tmp_path, ["a", "a", "b", "b", "c"])
    c.grid = (1, 1, 4)
    slot = c.slots[2]
    sid = "opt/pp0/tp0/dp2"
    apply_commit(c, slot, {"g": 0, "live_step": 3, "shards": {sid: 3}, "replicas": {},
                           "sent": {sid: {"holders": [0], "step": 3, "hash": "0123abcd"}}})
    assert c.evidence.sent[(sid, 0)] == frozenset({0}) and c.evidence.commit_hash[sid] == {3: "0123abcd"}
