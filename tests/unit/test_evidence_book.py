"""The evidence book as tables: owners' replica statements in, what is kept or the rejection out; the holder a
corrupt-replica injection goes to (control/evidence.py EvidenceBook). No coordinator."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from phoenix_hpc.control.evidence import EvidenceBook
from phoenix_hpc.control.states import SlotState

GRID = (1, 1, 4)  # tp, pp, dp
SID = "opt/pp0/tp0/dp2"  # the shard of logical rank 2


def _st(holders, step=3, h="0123abcd"):
    return {"holders": holders, "step": step, "hash": h}


# (name, statement, logical rank of the owner) -> (rejection or None, sent kept, hashes kept)
STATEMENTS = [
    ("its own shard", {SID: _st([0])}, 2, (None, {(SID, 0): frozenset({0})}, {SID: {3: "0123abcd"}})),
    ("no statement", None, 2, (None, {}, {})),
    ("a hash that is not hex: the holders only", {SID: _st([0, 1], h="zz")}, 2,
     (None, {(SID, 0): frozenset({0, 1})}, {})),
    ("another's shard", {SID: _st([0])}, 1,
     (("world rank 5 (logical 1) made a replica statement for shard opt/pp0/tp0/dp2 it does not own",
       ("sent", 5, SID)), {}, {})),
    ("malformed holders", {SID: {"holders": ["x"]}}, 2,
     (("world rank 5 sent a malformed replica statement for opt/pp0/tp0/dp2", ("sent", 5, "malformed")), {}, {})),
]


@pytest.mark.parametrize("name,sent,logical,expected", STATEMENTS, ids=[s[0] for s in STATEMENTS])
def test_record_sent_table(name, sent, logical, expected):
    book = EvidenceBook()
    bad = book.record_sent(world_rank=5, logical_rank=logical, grid=GRID, g=0, sent=sent)
    assert (bad, book.sent, book.commit_hash) == expected


def test_only_the_newest_hashes_are_kept():
    book = EvidenceBook()
    for step in range(1, 8):
        book.record_sent(world_rank=5, logical_rank=2, grid=GRID, g=0, sent={SID: _st([0], step=step, h=f"{step:08x}")})
    assert sorted(book.commit_hash[SID]) == [4, 5, 6, 7]


def _slots(dead=()):
    return {w: SimpleNamespace(state=SlotState.DEAD if w in dead else SlotState.ACTIVE) for w in range(4)}


# (name, owner's statement holders, placement, dead world ranks) -> (world rank, shard) or the reason
HOLDERS = [
    ("by the owner's statement: the lowest live holder", [3, 1], {}, (), (1, SID)),
    ("a dead holder is skipped", [3, 1], {}, (1,), (3, SID)),
    ("by the placement before the owner's first statement", None, {(SID, 0): frozenset({0})}, (), (0, SID)),
    ("no holder known", None, {}, (), "no holder of shard opt/pp0/tp0/dp2 is known in generation 0"),
    ("no live holder", [1], {}, (1,), "no live holder of shard opt/pp0/tp0/dp2 (holders: logical ranks [1])"),
]


@pytest.mark.parametrize("name,holders,placement,dead,expected", HOLDERS, ids=[h[0] for h in HOLDERS])
def test_holder_of_table(name, holders, placement, dead, expected):
    book = EvidenceBook()
    if holders is not None:
        book.record_sent(world_rank=2, logical_rank=2, grid=GRID, g=0, sent={SID: _st(holders)})
    got, why = book.holder_of([2], rank_map={r: r for r in range(4)}, grid=GRID, generation=0, slots=_slots(dead),
                              placement=lambda: placement)
    if isinstance(expected, str):
        assert got is None and why.startswith(expected)
    else:
        assert (got, why) == (expected, "")
    assert book.holder_of([9], rank_map={0: 0}, grid=GRID, generation=0, slots=_slots(),
                          placement=dict) == (None, "world rank 9 owns no shard")
