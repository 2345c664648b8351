"""A CUDA D2H's chunked copy commands (resilience.d2h_copy_chunk_bytes): the pieces, the refusals, and the
copy itself on CPU tensors (the code a side stream runs, without the stream)."""

import pytest
import torch

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.runtime import snapshot as S
from phoenix_hpc.runtime.d2h import D2H
from phoenix_hpc.runtime.d2h_chunks import copy_chunk_problem, copy_pieces


def test_pieces_cover_every_element_once_in_bounded_commands():
    assert copy_pieces(10, 4, 16) == [(0, 4), (4, 8), (8, 10)]
    assert copy_pieces(0, 2, 16) == []
    assert copy_pieces(3, 2, 64) == [(0, 3)]
    with pytest.raises(ValueError, match="holds no element"):
        copy_pieces(3, 8, 4)


@pytest.mark.parametrize("bad", [-16, 15, 17, 1.5, True, "4MiB"])
def test_bad_chunk_sizes_are_refused_naming_the_field(bad):
    assert "d2h_copy_chunk_bytes" in copy_chunk_problem(bad)
    with pytest.raises(ReplicationError, match="d2h_copy_chunk_bytes"):
        D2H(torch.device("cpu"), copy_chunk_bytes=bad)


def test_the_config_and_the_runtime_share_one_alignment():
    from phoenix_hpc.config.schema import D2H_COPY_CHUNK_ALIGN
    from phoenix_hpc.runtime.d2h_chunks import COPY_CHUNK_ALIGN

    assert D2H_COPY_CHUNK_ALIGN == COPY_CHUNK_ALIGN


def test_config_takes_the_chunk_size_and_refuses_a_bad_one():
    base = {"name": "x", "engine": "torch", "data": {"path": "/d"}, "parallelism": {"tp": 1, "pp": 1, "dp": 1},
            "model": {"layers": 1, "hidden_size": 8, "heads": 1, "vocab_size": 16, "seq_length": 8},
            "training": {"steps": 1, "micro_batch_size": 1, "global_batch_size": 1}}
    assert JobConfig.model_validate(base).resilience.d2h_copy_chunk_bytes == 0
    ok = JobConfig.model_validate({**base, "resilience": {"d2h_copy_chunk_bytes": 4 << 20, "checksum": "wsum64"}})
    assert ok.resilience.d2h_copy_chunk_bytes == 4 << 20 and ok.resilience.checksum == "wsum64"
    for bad in (100, -16, True, "4MiB"):
        with pytest.raises(Exception, match="d2h_copy_chunk_bytes"):
            JobConfig.model_validate({**base, "resilience": {"d2h_copy_chunk_bytes": bad}})


def test_a_chunked_issue_copies_exactly(monkeypatch):
    from phoenix_hpc.runtime import d2h as d2h_mod

    asked = []
    real = d2h_mod.copy_pieces
    monkeypatch.setattr(d2h_mod, "copy_pieces", lambda *a: asked.append(a) or real(*a))
    d2h = D2H(torch.device("cpu"), copy_chunk_bytes=16)
    for t in (torch.randn(37), torch.randn(5, 7).to(torch.bfloat16), torch.arange(3), torch.arange(2)):
        dst = torch.zeros_like(t)
        d2h._issue(dst, t)
        assert torch.equal(dst, t)
    assert asked == [(37, 4, 16), (35, 2, 16), (3, 8, 16)]  # split; 16 bytes or fewer: one command


@pytest.mark.parametrize("algo", ["xxh3_64", "wsum64"])
def test_cpu_copy_checksummed_gives_the_buffers_checksums(algo):
    opt = [("opt/pp0/tp0/dp0/w/main", torch.randn(3000)), ("opt/pp0/tp0/dp0/w/exp_avg", torch.randn(11))]
    par = [("param/pp0/tp0/w", torch.randn(7).to(torch.bfloat16))]
    lay = S.plan_layout(opt, par, {"envelope": {}})
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    d2h = D2H(torch.device("cpu"))
    sums, _, _ = d2h.copy_checksummed(d2h.mark(), buf, lay, opt, par, algo)
    assert sums == S.checksums(buf, lay, (S.OPT, S.PARAM), algo)


def test_runs_join_tensors_of_one_storage_laid_out_as_their_slots():
    from phoenix_hpc.runtime.d2h_chunks import copy_runs

    # (storage, src offset, bytes, dst offset, storage bytes)
    items = [(1, 0, 64, 100, 1000), (1, 64, 64, 164, 1000), (1, 128, 60, 228, 1000), (1, 192, 8, 292, 1000),
             (2, 0, 8, 356, 8), (2, 8, 8, 364, 8),  # past its storage's end: cannot join
             (3, 0, 64, 420, 128), (3, 64, 64, 500, 128),  # the slot lies further than the source: cannot join
             (4, 64, 8, 600, 128), (4, 0, 8, 664, 128)]  # out of order in the storage: cannot join
    assert copy_runs(items) == [(0, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 10)]
    assert copy_runs([]) == []


def test_a_coalesced_group_copies_every_tensor_onto_its_slot():
    flat = torch.randn(3000)  # an engine's flat buffer; its shard tensors are views of it
    opt = [(f"opt/pp0/tp0/dp0/w{i}/main", flat[a:b]) for i, (a, b) in enumerate(((0, 16), (16, 48), (48, 1000),
                                                                              (1000, 1003), (1003, 3000)))]
    par = [("param/pp0/tp0/w", torch.randn(7).to(torch.bfloat16))]
    lay = S.plan_layout(opt, par, {"envelope": {}})
    want = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(want, lay, opt, par)
    for chunk in (0, 64):
        d2h = D2H(torch.device("cpu"), copy_chunk_bytes=chunk, copy_coalesce=True)
        buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
        views = S.slot_views(buf, lay)
        pairs = S.check_state(lay, opt, par, views)
        issued, real = [], d2h._issue
        d2h._issue = lambda view, t: (issued.append(t.numel() * t.element_size()), real(view, t))
        d2h._issue_group(buf, lay, pairs, views, 0, len(pairs))
        assert issued[0] == 1000 * 4 and len(issued) < len(pairs)  # the first three tensors: one command
        assert all(torch.equal(buf[s.offset:s.offset + s.nbytes], want[s.offset:s.offset + s.nbytes]) for s in lay.slots)
