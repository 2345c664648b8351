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


def test_a_chunked_issue_copies_exactly():
    d2h = D2H(torch.device("cpu"), copy_chunk_bytes=16)
    for t in (torch.randn(37), torch.randn(5, 7).to(torch.bfloat16), torch.arange(3)):
        dst = torch.zeros_like(t)
        d2h._issue(dst, t)
        assert torch.equal(dst, t)


@pytest.mark.parametrize("algo", ["xxh3_64", "wsum64"])
def test_cpu_copy_checksummed_gives_the_buffers_checksums(algo):
    opt = [("opt/pp0/tp0/dp0/w/main", torch.randn(3000)), ("opt/pp0/tp0/dp0/w/exp_avg", torch.randn(11))]
    par = [("param/pp0/tp0/w", torch.randn(7).to(torch.bfloat16))]
    lay = S.plan_layout(opt, par, {"envelope": {}})
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    d2h = D2H(torch.device("cpu"))
    sums, _, _ = d2h.copy_checksummed(d2h.mark(), buf, lay, opt, par, algo)
    assert sums == S.checksums(buf, lay, (S.OPT, S.PARAM), algo)
