"""D2H on CUDA: pinned host buffer, dedicated stream ordered after the compute stream by an event, copy
issued from a background thread (as the runtime's copy thread does). Skipped without CUDA; run by
scripts/gpu-check.sh."""

from __future__ import annotations

import threading

import pytest
import torch

from phoenix_hpc.runtime import snapshot as S
from phoenix_hpc.runtime.buffers import allocate_pair
from phoenix_hpc.runtime.d2h import D2H

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_cuda_d2h_sees_the_last_update_and_packs_byte_exact():
    dev = torch.device("cuda", 0)
    opt = [(f"opt/pp0/tp0/dp0/w/{k}", torch.randn(1 << 20, device=dev)) for k in ("main", "exp_avg", "exp_avg_sq")]
    params = [("param/pp0/tp0/w", torch.randn(1024, 1024, device=dev).to(torch.bfloat16))]
    lay = S.plan_layout(opt, params, {"envelope": {}})
    d2h = D2H(dev)
    assert d2h.pin
    buf, _ = allocate_pair(lay.total_bytes, pin=True)
    assert buf.is_pinned()
    # queue long work on the compute stream, then the update the snapshot must contain
    a = torch.randn(4096, 4096, device=dev)
    for _ in range(20):
        a = a @ a / 64
    for _, t in opt:
        t.add_(a[0, 0] * 0 + 1.0)
    params[0][1].mul_(2)
    token = d2h.mark()  # training thread; nothing synchronises the device before the copy
    errors = []

    def copier():
        try:
            d2h.copy(token, buf, lay, opt, params)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=copier)
    th.start()
    th.join()
    assert not errors, errors
    expected = {n: t.cpu() for n, t in opt + params}  # the state after the queued updates
    S.seal(buf, lay, shard_id="opt/pp0/tp0/dp0", step=1, generation=0, grid={}, coord={}, envelope={})
    u = S.unpack(buf, (S.OPT, S.PARAM))
    for n, t in expected.items():
        assert torch.equal(u.tensors[n], t), n
