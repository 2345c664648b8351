"""wsum64: the device checksum's torch implementation equals its definition, detects what it claims, and is
a checksum like the others for seal/verify (CPU tensors run the same code a GPU runs)."""

import numpy as np
import pytest
import torch

from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.runtime import snapshot as S
from phoenix_hpc.runtime import wsum as W
from phoenix_hpc.runtime.checksum import DEVICE_CHECKSUMS, checksum_function


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 255, W.ROW_WORDS * 4, W.ROW_WORDS * 4 + 3,
                               W.ROW_WORDS * 4 * (W.ROWS_PER_PASS + 1) + 6, 100_001])
def test_torch_implementation_equals_the_reference(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    want = W.wsum64_reference(data)
    assert W.wsum64_bytes(data) == want
    assert W.wsum64_bytes(memoryview(bytearray(data))) == want
    assert checksum_function("wsum64")(np.frombuffer(data, dtype=np.uint8)) == want


@pytest.mark.parametrize("word", [0x7FFFFFFF, -(2**31), -1])
def test_extreme_words_do_not_overflow(word):
    data = np.full(W.ROW_WORDS * 3 + 17, word, dtype="<i4").tobytes()
    assert W.wsum64_bytes(data) == W.wsum64_reference(data)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8])
def test_a_tensor_is_its_bytes_also_when_strided_or_offset(dtype):
    base = (torch.arange(3 * 4097) % 251).to(dtype)
    for t in (base, base[1:], base.view(3, 4097).t()):
        want = W.wsum64_reference(t.contiguous().view(torch.uint8).numpy().tobytes())
        assert W.wsum64_tensor(t) == want


def test_detects_one_and_two_word_changes_swaps_and_trailing_zeros():
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, W.ROW_WORDS * 4 * 3, dtype=np.uint8)
    base = W.wsum64_bytes(data.tobytes())
    words = data.view("<i4")
    for _ in range(50):
        w = words.copy()
        j, k = rng.integers(0, w.size, 2)
        d = int(rng.integers(1, 2**31))
        w[j] = np.int32((int(w[j]) + d + 2**31) % 2**32 - 2**31)  # one word changed
        assert W.wsum64_bytes(w.tobytes()) != base
        if j != k:
            w[k] = np.int32((int(w[k]) - d + 2**31) % 2**32 - 2**31)  # a second change that cancels in A
            assert W.wsum64_bytes(w.tobytes()) != base
            s = words.copy()
            if s[j] != s[k]:
                s[j], s[k] = s[k], s[j]  # two words swapped
                assert W.wsum64_bytes(s.tobytes()) != base
    assert W.wsum64_bytes(data.tobytes() + b"\0") != base


def test_seal_and_verify_with_wsum64_and_a_flipped_bit_fails():
    opt = [("opt/a", torch.randn(5000)), ("opt/b", torch.randn(3).to(torch.bfloat16))]
    lay = S.plan_layout(opt, [], {"envelope": {}})
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(buf, lay, opt, [])
    S.seal(buf, lay, shard_id="opt/pp0/tp0/dp0", step=1, generation=0, grid={}, coord={}, envelope={},
           checksum="wsum64")
    S.verify(buf, (S.OPT,))
    buf[lay.slots[1].offset] ^= 4
    with pytest.raises(ReplicationError, match="fails its checksum"):
        S.verify(buf, (S.OPT,))
    assert DEVICE_CHECKSUMS == ("wsum64",)
