"""Failure-domain parsing and replica placement (pure)."""

from __future__ import annotations

import itertools
import random

import pytest

from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.topology import (
    coord_of,
    node_of_rank_blocked,
    parse_scontrol_topology,
    parse_topology_addr,
    place_replicas,
)

LEVELS3 = ("node", "switch", "group")


def three_level(n_nodes: int, nodes_per_switch: int, switches_per_group: int) -> tuple[list[str], dict]:
    nodes = [f"nid{i + 1:05d}" for i in range(n_nodes)]
    dom = {
        n: {"switch": f"s{i // nodes_per_switch}", "group": f"g{i // (nodes_per_switch * switches_per_group)}"}
        for i, n in enumerate(nodes)
    }
    return nodes, dom


def check_invariants(p, tp, pp, dp, k, node_of_rank):
    n = tp * pp * dp
    assert len(p.replicas) == n * k
    for owner in range(n):
        hs = p.holders_of(owner)
        assert [h.index for h in hs] == list(range(k))
        oc = coord_of(owner, tp, pp, dp)
        assert all(h.shard_id == oc.shard_prefix() for h in hs)
        for h in hs:
            hc = coord_of(h.holder_rank, tp, pp, dp)
            assert (hc.pp, hc.tp) == (oc.pp, oc.tp) and hc.dp != oc.dp, "holder must be a DP peer"
            assert node_of_rank[h.holder_rank] != node_of_rank[owner], "never on the owner's node"
        assert len({node_of_rank[h.holder_rank] for h in hs}) == k, "holders on distinct nodes"


@pytest.mark.parametrize("k", [1, 2, 3])
def test_plain_ring_without_domain_constraints(k):
    nodes = [f"n{i}" for i in range(6)]
    p = place_replicas(1, 1, 6, k, nodes, None, ("node",))
    for owner in range(6):
        assert [h.holder_rank for h in p.holders_of(owner)] == [(owner + s) % 6 for s in range(1, k + 1)]
    assert set(p.load().values()) == {k}
    assert p.warnings == ()


def test_three_levels_k1_goes_to_another_group():
    # 8 nodes x 4 GPUs, tp=4 -> dp=8, one rank of every DP group per node; 2 nodes/switch, 2 switches/group
    nodes, dom = three_level(8, 2, 2)
    nor = node_of_rank_blocked(nodes, 4)
    p = place_replicas(4, 1, 8, 1, nor, dom, LEVELS3)
    check_invariants(p, 4, 1, 8, 1, nor)
    for r in p.replicas:
        assert dom[r.holder_node]["group"] != dom[r.owner_node]["group"]
        assert r.distinct_at == "group"
    assert p.warnings == ()
    assert set(p.load().values()) == {1}


def test_three_levels_k2_with_two_groups_degrades_to_switch_and_warns():
    nodes, dom = three_level(8, 2, 2)  # 2 groups only: owner + 2 holders cannot be in 3 distinct groups
    nor = node_of_rank_blocked(nodes, 4)
    p = place_replicas(4, 1, 8, 2, nor, dom, LEVELS3)
    check_invariants(p, 4, 1, 8, 2, nor)
    for owner in range(32):
        h0, h1 = p.holders_of(owner)
        assert h0.distinct_at == "group"  # first holder in the other group
        assert h1.distinct_at == "switch"  # second: distinct switch from owner and from the first holder
        sw = {dom[x]["switch"] for x in (h0.owner_node, h0.holder_node, h1.holder_node)}
        assert len(sw) == 3
    assert len(p.warnings) == 1
    assert "32 of 32 shards" in p.warnings[0] and "'switch'" in p.warnings[0] and "'group'" in p.warnings[0]
    assert max(p.load().values()) <= 3 and min(p.load().values()) >= 1


def test_three_levels_with_enough_groups_k2_has_no_warning():
    nodes, dom = three_level(12, 2, 2)  # 3 groups
    nor = node_of_rank_blocked(nodes, 4)
    p = place_replicas(4, 1, 12, 2, nor, dom, LEVELS3)
    check_invariants(p, 4, 1, 12, 2, nor)
    assert p.warnings == ()
    for owner in range(48):
        groups = {dom[p.holders_of(owner)[0].owner_node]["group"]} | {
            dom[h.holder_node]["group"] for h in p.holders_of(owner)
        }
        assert len(groups) == 3
    assert set(p.load().values()) == {2}


def test_dp_peers_sharing_a_node_tp1():
    # tp=1, 4 GPUs/node, dp=8 on 2 nodes: ranks 0-3 on node A, 4-7 on node B
    nor = node_of_rank_blocked(["nid00001", "nid00002"], 4)
    p = place_replicas(1, 1, 8, 1, nor, {"nid00001": {"switch": "s0"}, "nid00002": {"switch": "s1"}})
    check_invariants(p, 1, 1, 8, 1, nor)
    assert set(p.load().values()) == {1}, p.load()
    # k=2 needs two other nodes: impossible
    with pytest.raises(ReplicationError, match=r"k=2 .*distinct nodes.*1 other node"):
        place_replicas(1, 1, 8, 2, nor, None, ("node",))


def test_all_dp_peers_on_one_node_is_an_error():
    nor = node_of_rank_blocked(["nid00001"], 4)
    with pytest.raises(ReplicationError, match="0 other node"):
        place_replicas(1, 1, 4, 1, nor, None, ("node",))


def test_k_not_smaller_than_dp_is_an_error():
    nor = [f"n{i}" for i in range(4)]
    with pytest.raises(ReplicationError, match="k=4"):
        place_replicas(1, 1, 4, 4, nor, None, ("node",))


def test_pp2_dp2_pairs_within_each_stage():
    nor = [f"n{i}" for i in range(4)]
    p = place_replicas(1, 2, 2, 1, nor, None, ("node",))
    assert {(r.owner_rank, r.holder_rank) for r in p.replicas} == {(0, 1), (1, 0), (2, 3), (3, 2)}
    assert [r.shard_id for r in p.replicas] == ["opt/pp0/tp0/dp0", "opt/pp0/tp0/dp1", "opt/pp1/tp0/dp0", "opt/pp1/tp0/dp1"]


def test_bad_levels_and_missing_domains():
    nor = [f"n{i}" for i in range(4)]
    with pytest.raises(ReplicationError, match="must start with 'node'"):
        place_replicas(1, 1, 4, 1, nor, None, ("switch", "node"))
    with pytest.raises(ReplicationError, match="no 'switch' failure domain known for node 'n0'"):
        place_replicas(1, 1, 4, 1, nor, None, ("node", "switch"))
    with pytest.raises(ReplicationError, match=">= 1"):
        place_replicas(1, 1, 4, 0, nor, None, ("node",))


def test_randomised_invariants_and_balance():
    """Over many random 3-level topologies and grids: the hard rules always hold, and no rank holds more
    than 2k replicas unless the node layout forces it."""
    rng = random.Random(1234)
    worst_ratio = 0.0
    for _ in range(300):
        tp, pp = rng.choice([1, 2, 4]), rng.choice([1, 2])
        dp = rng.randint(2, 8)
        gpn = rng.choice([1, 2, 4])
        n = tp * pp * dp
        n_nodes = -(-n // gpn)
        nodes = [f"x{i}" for i in range(n_nodes)]
        order = nodes[:]
        rng.shuffle(order)  # nodes are not in topology order in a real allocation
        dom = {nd: {"switch": f"s{order.index(nd) // 2}", "group": f"g{order.index(nd) // 4}"} for nd in nodes}
        nor = node_of_rank_blocked(nodes, gpn)[:n]
        k = rng.randint(1, 3)
        try:
            p = place_replicas(tp, pp, dp, k, nor, dom, LEVELS3)
        except ReplicationError:
            # must be a genuine impossibility: some shard has fewer than k other nodes among its DP peers
            ok = False
            for r in range(n):
                c = coord_of(r, tp, pp, dp)
                peers = {nor[x] for x in range(n) if (lambda d: (d.pp, d.tp) == (c.pp, c.tp))(coord_of(x, tp, pp, dp))}
                if len(peers - {nor[r]}) < k:
                    ok = True
            assert ok
            continue
        check_invariants(p, tp, pp, dp, k, nor)
        loads = p.load()
        # a rank is forced to hold a shard when the shard has exactly k other nodes among its DP peers and
        # the rank is the shard's only peer on its node
        forced = dict.fromkeys(range(n), 0)
        for r in range(n):
            c = coord_of(r, tp, pp, dp)
            peers = [x for x in range(n) if x != r and (coord_of(x, tp, pp, dp).pp, coord_of(x, tp, pp, dp).tp) == (c.pp, c.tp)]
            others = [x for x in peers if nor[x] != nor[r]]
            if len({nor[x] for x in others}) == k:
                for x in others:
                    if sum(nor[y] == nor[x] for y in others) == 1:
                        forced[x] += 1
        for r in range(n):
            assert loads[r] <= max(2 * k, forced[r]), (tp, pp, dp, gpn, k, r, loads, forced)
            if forced[r] <= 2 * k:
                worst_ratio = max(worst_ratio, loads[r] / k)
    assert worst_ratio <= 2


def test_site_levels_name_the_switch_tiers():
    from phoenix_hpc.profiles import load_profile
    from phoenix_hpc.topology import switch_levels_of

    vista = switch_levels_of(load_profile("vista").failure_domains.levels)
    assert vista == ("leaf", "spine")
    assert switch_levels_of(load_profile("perlmutter").failure_domains.levels) == ("switch", "group")
    assert switch_levels_of(["node"]) == ("switch", "group")  # no switch tier named: the defaults
    # Vista's placement levels [node, leaf, spine] are all found on a two-tier address
    assert parse_topology_addr("s1.l3.c609-001", "switch.switch.node", vista) == {
        "node": "c609-001", "leaf": "l3", "spine": "s1"}


def test_parse_topology_addr():
    assert parse_topology_addr("spine.leaf0.nid00001", "switch.switch.node") == {
        "node": "nid00001",
        "switch": "leaf0",
        "group": "spine",
    }
    assert parse_topology_addr("nid00007", "node") == {"node": "nid00007"}
    assert parse_topology_addr("a.b.c.n1", "switch.switch.switch.node", ("leaf", "rack")) == {
        "node": "n1",
        "leaf": "c",
        "rack": "b",
        "tier2": "a",
    }
    for addr, pat in [("a.n1", "switch.switch.node"), ("a.n1", "node.switch"), ("a..n1", "switch.switch.node")]:
        with pytest.raises(ReplicationError, match="SLURM_TOPOLOGY_ADDR"):
            parse_topology_addr(addr, pat)


def test_parse_scontrol_topology_feeds_placement():
    text = (
        "SwitchName=s0 Level=0 LinkSpeed=1 Nodes=nid[00001-00003]\n"
        "SwitchName=s1 Level=0 LinkSpeed=1 Nodes=nid[00004-00006]\n"
        "SwitchName=top Level=1 LinkSpeed=1 Nodes=nid[00001-00006] Switches=s[0-1]\n"
    )
    dom = parse_scontrol_topology(text)
    assert dom["nid00002"] == {"node": "nid00002", "switch": "s0", "group": "top"}
    assert dom["nid00005"]["switch"] == "s1"
    nor = node_of_rank_blocked([f"nid{i:05d}" for i in range(1, 7)], 1)
    p = place_replicas(1, 1, 6, 1, nor, dom, ("node", "switch"))
    for r in p.replicas:
        assert dom[r.owner_node]["switch"] != dom[r.holder_node]["switch"]
    assert p.warnings == () and set(p.load().values()) == {1}
    with pytest.raises(ReplicationError, match="cannot parse"):
        parse_scontrol_topology("SwitchName=s0 Nodes=nid[1-2]")


def test_every_small_grid_is_deterministic():
    for tp, pp, dp in itertools.product([1, 2], [1, 2], [2, 3, 4]):
        nor = [f"n{r}" for r in range(tp * pp * dp)]
        a = place_replicas(tp, pp, dp, 1, nor, None, ("node",))
        b = place_replicas(tp, pp, dp, 1, nor, None, ("node",))
        assert a == b


def test_generation_placement_drops_levels_the_domain_model_lacks_and_equals_place_replicas():
    from phoenix_hpc.topology import covered_levels, generation_placement

    nodes, dom = three_level(8, 2, 2)
    node_of = node_of_rank_blocked(nodes, 1)  # tp=1 pp=2 dp=4 -> 8 ranks on 8 nodes
    full = generation_placement((1, 2, 4), 2, node_of, dom, LEVELS3)
    assert full.levels == LEVELS3
    assert full == place_replicas(1, 2, 4, 2, node_of, dom, LEVELS3)
    # one node without a group name: the group level is dropped for everyone, the switch level kept
    partial = {n: dict(d) for n, d in dom.items()}
    del partial[nodes[3]]["group"]
    assert covered_levels(LEVELS3, node_of, partial) == ("node", "switch")
    pl = generation_placement((1, 2, 4), 2, node_of, partial, LEVELS3)
    assert pl.levels == ("node", "switch")
    assert pl == place_replicas(1, 2, 4, 2, node_of, partial, ("node", "switch"))
    # no domain model at all: node level only
    assert generation_placement((1, 2, 4), 1, node_of, None, LEVELS3).levels == ("node",)
    by_shard = pl.holders_by_shard()
    assert sorted(by_shard) == sorted({r.shard_id for r in pl.replicas})
    assert all(len(h) == 2 for h in by_shard.values())
    assert by_shard[coord_of(0, 1, 2, 4).shard_prefix()] == [r.holder_rank for r in pl.holders_of(0)]


def test_generation_placement_refuses_what_place_replicas_refuses():
    from phoenix_hpc.topology import generation_placement

    with pytest.raises(ReplicationError, match="cannot get k=2"):
        generation_placement((1, 1, 2), 2, ["a", "b"])
