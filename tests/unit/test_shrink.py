"""The shrink: the pure plan (recovery/shrink.py), the ZeRO-1 re-partition (engines/zero.py) and the uneven
deal of micro-batches (engines/torch_engine.micro_split)."""

from __future__ import annotations

import pytest
import torch

from phoenix_hpc.engines.torch_engine import micro_split
from phoenix_hpc.engines.zero import ShardedAdamW, flat_pieces
from phoenix_hpc.recovery.plan import FallbackRequired
from phoenix_hpc.recovery.shrink import overlapping, plan_shrink, shrink_refusal
from phoenix_hpc.topology import coord_of

# pp=2 x dp=3 (tp=1): logical r = pp * 3 + dp; world rank = logical rank; one slot per node
GRID = (1, 2, 3)
N = 6
NODES = {w: f"n{w}" for w in range(N + 1)}  # world 6: a standby slot that is not used by a shrink
RANK_MAP = {r: r for r in range(N)}


def _sid(r, grid=GRID):
    return coord_of(r, *grid).shard_prefix()


def _placement():
    """Holder of (pp, dp=d): (pp, dp=d+1 mod 3), the ring within the stage."""
    return {_sid(r): ((r // 3) * 3 + (r % 3 + 1) % 3,) for r in range(N)}


def _committed(step=9):
    pl = _placement()
    return {sid: {int(next(r for r in range(N) if _sid(r) == sid)): step, hs[0]: step} for sid, hs in pl.items()}


def _plan(dead, live=10, numel=None, **kw):
    return plan_shrink(generation=2, grid=GRID, rank_map=RANK_MAP, nodes=NODES, dead=dead, placement=_placement(),
                       committed=_committed(), live_steps={r: live for r in range(N) if r not in dead},
                       numel=numel or {"pp0/tp0": 10, "pp1/tp0": 7}, **kw)


def test_overlapping_slices_cover_the_new_slice():
    # numel 10: old dp 3 -> slices of 4 (0-3, 4-7, 8-9); new dp 2 -> slices of 5 (0-4, 5-9)
    assert overlapping(10, 3, 2, 0) == [0, 1] and overlapping(10, 3, 2, 1) == [1, 2]
    assert overlapping(7, 3, 2, 1) == [1, 2]  # old 3 each (0-2, 3-5, 6); new 4 each (0-3, 4-6)
    assert overlapping(2, 4, 3, 2) == []  # new slices of 1: the third is past numel
    assert overlapping(0, 4, 3, 0) == []


def test_a_dead_slot_removes_its_dp_replica_and_frees_its_other_stage():
    p = _plan(dead=[4])  # logical 4 = (pp1, dp1): replica dp1 = logical 1 and 4
    assert p.action == "shrink" and p.grid == (1, 2, 2) and p.old_grid == (1, 2, 3)
    # kept replicas dp0 and dp2 become dp0 and dp1: new logical (pp*2 + d') -> old world
    assert dict(p.rank_map) == {0: 0, 1: 2, 2: 3, 3: 5}
    assert p.leavers == (1,) and p.joins == () and p.dead_world == (4,)
    assert p.recoverable_step == 9 and p.steps_replayed == 1
    src = dict(p.sources)
    assert src["opt/pp1/tp0/dp1"] == 5  # the dead owner's slice from its holder (pp1, dp2)
    assert src["opt/pp0/tp0/dp1"] == 1  # the leaver's own slice: it sends before it leaves
    # every member needs the old slices that intersect its new one; transfers only where the source is another
    needs = dict(p.needs)
    assert needs[0] == ("opt/pp0/tp0/dp0", "opt/pp0/tp0/dp1") and needs[2] == ("opt/pp0/tp0/dp1", "opt/pp0/tp0/dp2")
    assert needs[3] == ("opt/pp1/tp0/dp0", "opt/pp1/tp0/dp1") and needs[5] == ("opt/pp1/tp0/dp1", "opt/pp1/tp0/dp2")
    pairs = {(t.kind, t.shard_id, t.sender_world, t.receiver_world) for t in p.transfers}
    # the own old slice is never sent; (pp1, dp1)'s holder 5 is a member that needs it itself
    assert pairs == {("reshard", "opt/pp0/tp0/dp1", 1, 0), ("reshard", "opt/pp0/tp0/dp1", 1, 2),
                     ("reshard", "opt/pp1/tp0/dp1", 5, 3)}
    assert all(t.sender_world != t.receiver_world and t.step == 9 for t in p.transfers)
    assert p.to_json()["shrink"]["leavers"] == [1] and p.to_json()["grid"] == {"tp": 1, "pp": 2, "dp": 2}


def test_the_shrink_is_the_same_whichever_replica_is_removed():
    a, b = _plan(dead=[0]), _plan(dead=[2])
    assert a.grid == b.grid == (1, 2, 2)
    assert [w for _, w in a.rank_map] == [1, 2, 4, 5] and [w for _, w in b.rank_map] == [0, 1, 3, 4]


def test_a_drained_slot_is_removed_like_a_dead_one():
    """``drain --shrink``: the drained slot stopped at the commit fence and is passed as dead; its replica's
    other stage leaves, its own slice comes from its holder."""
    p = _plan(dead=[3])
    assert p.grid == (1, 2, 2) and p.leavers == (0,) and p.lost == (3,)
    assert dict(p.sources)["opt/pp1/tp0/dp0"] == 4  # (pp1, dp0)'s holder is (pp1, dp1)


def test_a_shrink_that_would_leave_no_replica_falls_back():
    with pytest.raises(FallbackRequired, match="leave dp = 0"):
        _plan(dead=[0, 1, 2])
    assert "at least one whole model replica" in shrink_refusal(GRID, [3, 4, 5])
    assert shrink_refusal(GRID, [3, 4]) is None


def test_a_lost_slice_without_a_live_copy_falls_back():
    committed = _committed()
    committed["opt/pp1/tp0/dp1"] = {4: 9}  # only the dead owner had it
    with pytest.raises(FallbackRequired, match="opt/pp1/tp0/dp1 lost"):
        plan_shrink(generation=2, grid=GRID, rank_map=RANK_MAP, nodes=NODES, dead=[4], placement=_placement(),
                    committed=committed, live_steps={r: 10 for r in range(N) if r != 4},
                    numel={"pp0/tp0": 10, "pp1/tp0": 7})


def _adam(numel_sizes, d, dp, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [(n, torch.nn.Parameter(torch.randn(k, generator=g))) for n, k in numel_sizes]
    return ShardedAdamW(params, d, dp)


@pytest.mark.parametrize("old_dp,new_dp", [(3, 2), (4, 3), (2, 1), (4, 1)])
def test_resharding_equals_cutting_the_flat_vector_anew(old_dp, new_dp):
    sizes = [("a", 5), ("b", 9), ("c", 3)]  # numel 17: uneven slices and padding on both sides
    numel = 17
    g = torch.Generator().manual_seed(1)
    full = {k: torch.randn(numel, generator=g) for k in ("main", "exp_avg", "exp_avg_sq")}
    old: dict[str, torch.Tensor] = {}
    for d in range(old_dp):
        opt = _adam(sizes, d, old_dp)
        for k, t in full.items():
            getattr(opt, k)[: max(0, min(numel, (d + 1) * opt.shard_len) - d * opt.shard_len)] = \
                t[d * opt.shard_len: (d + 1) * opt.shard_len]
        old.update(dict(opt.named_state(f"opt/pp0/tp0/dp{d}")))
    for d in range(new_dp):
        new = _adam(sizes, d, new_dp, seed=5)
        need = {f"opt/pp0/tp0/dp{o}" for o in overlapping(numel, old_dp, new_dp, d)}
        new.load_resharded({n: t for n, t in old.items() if n.rsplit("/", 2)[0] in need}, old_dp,
                           lambda o: f"opt/pp0/tp0/dp{o}")
        lo, hi = d * new.shard_len, min(numel, (d + 1) * new.shard_len)
        for k, t in full.items():
            assert torch.equal(getattr(new, k)[: hi - lo], t[lo:hi]), (k, d)


def test_resharding_refuses_a_missing_piece():
    sizes = [("a", 5), ("b", 9)]
    old = dict(_adam(sizes, 0, 2).named_state("opt/pp0/tp0/dp0"))  # dp1's slice is missing
    with pytest.raises(ValueError, match="dp1/b/main is missing"):
        _adam(sizes, 0, 1).load_resharded(old, 2, lambda o: f"opt/pp0/tp0/dp{o}")
    _, pieces = flat_pieces(sizes, 1, 2)
    assert pieces  # the missing slice holds parameters


@pytest.mark.parametrize("G,mbs,dp", [(8, 2, 4), (8, 2, 3), (12, 1, 5), (6, 2, 3), (16, 4, 3)])
def test_micro_batches_are_dealt_out_in_order_once(G, mbs, dp):
    spans = [micro_split(G, mbs, dp, d) for d in range(dp)]
    covered = [m for first, n in spans for m in range(first, first + n)]
    assert covered == list(range(G // mbs))  # every micro-batch once, in order, rank by rank
    counts = [n for _, n in spans]
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)
    if G % (mbs * dp) == 0:
        assert set(counts) == {G // (mbs * dp)}


def test_micro_split_refuses_fewer_micro_batches_than_ranks():
    from phoenix_hpc.errors import EngineError

    with pytest.raises(EngineError, match="cannot be dealt out over dp = 5"):
        micro_split(8, 2, 5, 0)


def test_at_dp_1_a_dead_rank_gets_its_parameters_from_the_optimizer_slice():
    from phoenix_hpc.recovery.plan import plan_recovery

    grid = (1, 2, 1)  # pp=2 x dp=1, as after a shrink from dp 2: no DP peer holds any stage's parameters
    kw = dict(generation=4, grid=grid, rank_map={0: 4, 1: 3}, nodes={w: f"n{w}" for w in range(5)}, dead=[3],
              spares=[0], placement={"opt/pp0/tp0/dp0": (1,), "opt/pp1/tp0/dp0": (0,)},
              committed={"opt/pp0/tp0/dp0": {0: 20, 1: 20}, "opt/pp1/tp0/dp0": {1: 20, 0: 20}},
              live_steps={0: 21})
    with pytest.raises(FallbackRequired, match="no live DP peer of logical rank 1"):
        plan_recovery(**kw)
    p = plan_recovery(**kw, params_from_optimizer=True)
    assert [(t.kind, t.sender_world, t.receiver_world) for t in p.transfers] == [
        ("optimizer", 4, 0), ("params_from_optimizer", 0, 0)]
    assert dict(p.rank_map) == {0: 4, 1: 0} and p.recoverable_step == 20


def test_parameters_rebuilt_from_the_optimizer_equal_those_a_step_leaves():
    opt = _adam([("a", 5), ("b", 4)], 0, 1)
    opt.main.add_(0.25)  # as if a step had updated the main copy
    opt.gather_params(None)
    want = [p.detach().clone() for _, p in opt.named_params]
    for _, p in opt.named_params:
        p.data.zero_()
    opt.gather_params(None)
    assert all(torch.equal(p, w) for (_, p), w in zip(opt.named_params, want))


def test_a_shrink_must_leave_k_plus_1_nodes_for_the_replicas():
    # pp=1 x dp=2 on two nodes, k=1: dp 1 would leave one node, where no replica can go
    grid, nodes = (1, 1, 2), {0: "a", 1: "b"}
    assert "would leave 1 node(s), too few for k = 1" in shrink_refusal(grid, [1], nodes, 1)
    assert shrink_refusal((1, 2, 2), [1], {0: "a", 1: "b", 2: "c", 3: "d"}, 1) is None  # pp=2: two nodes left
    with pytest.raises(FallbackRequired, match="too few for k = 1"):
        plan_shrink(generation=0, grid=grid, rank_map={0: 0, 1: 1}, nodes={0: "a", 1: "b"}, dead=[1],
                    placement={"opt/pp0/tp0/dp0": (1,), "opt/pp0/tp0/dp1": (0,)},
                    committed={"opt/pp0/tp0/dp0": {0: 5, 1: 5}, "opt/pp0/tp0/dp1": {1: 5, 0: 5}},
                    live_steps={0: 5}, numel={"pp0/tp0": 10}, k=1)


def test_spares_exhausted_is_refused_outside_mode_phoenix():
    import pydantic

    from phoenix_hpc.config.schema import JobConfig

    with pytest.raises(pydantic.ValidationError) as e:
        JobConfig.model_validate({"name": "x", "data": {"path": "d"},
                                  "resilience": {"mode": "checkpoint-restart", "spares_exhausted": "shrink"}})
    (err,) = e.value.errors()
    assert err["loc"] == ("resilience", "spares_exhausted") and err["input"] == "shrink"
    assert err["msg"].startswith("needs resilience.mode 'phoenix', got resilience.mode 'checkpoint-restart'")


def test_a_sealed_part_unpacks_to_the_same_tensors_and_a_flipped_byte_is_caught():
    from phoenix_hpc.errors import ReplicationError
    from phoenix_hpc.runtime.snapshot import OPT, seal_part, unpack

    pairs = [("opt/pp0/tp0/dp1/b/main", torch.arange(5, dtype=torch.float32)),
             ("opt/pp0/tp0/dp1/a/main", torch.ones(3))]
    buf = seal_part(pairs, OPT, "opt/pp0/tp0/dp1", 7, 2)
    u = unpack(buf, (OPT,))
    assert (u.shard_id, u.step) == ("opt/pp0/tp0/dp1", 7)
    assert all(torch.equal(u.tensors[n], t) for n, t in pairs) and set(u.tensors) == {n for n, _ in pairs}
    raw = bytes(buf.numpy())
    at = raw.index(torch.ones(3).numpy().tobytes())  # the bytes of tensor .../a/main in the buffer
    buf[at + 1] ^= 0xFF
    with pytest.raises(ReplicationError):
        unpack(buf, (OPT,))


def test_the_pmix_switch_takes_0_or_1_only():
    from phoenix_hpc.errors import ConfigError
    from phoenix_hpc.launch import pmix

    assert pmix.enabled({}) and pmix.enabled({"PHOENIX_PMIX_DETACH": "1"})
    assert not pmix.enabled({"PHOENIX_PMIX_DETACH": "0"})
    env = {"PHOENIX_PMIX_DETACH": "0"}
    pmix.prepare_env(env)
    assert "OMPI_MCA_mpi_add_procs_cutoff" not in env  # off: Open MPI is left as it is
    env = {}
    pmix.prepare_env(env)
    assert env["OMPI_MCA_mpi_add_procs_cutoff"] == pmix.ADD_PROCS_CUTOFF
    with pytest.raises(ConfigError, match=r"PHOENIX_PMIX_DETACH: value 'no' is not allowed \(allowed: 1"):
        pmix.enabled({"PHOENIX_PMIX_DETACH": "no"})
    assert ConfigError("x").exit_code == 2
