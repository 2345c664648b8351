"""``wsum64``: a checksum computed with torch ops on the tensor's own device (GPU or CPU), one 64-bit value.

Definition (the reference, :func:`wsum64_reference`, is the formula written directly in numpy): the bytes
are read as little-endian signed 32-bit words ``w_0 .. w_{n-1}`` (a last partial word zero padded), and

    A = sum_i w_i            mod 2**64
    B = sum_i (i + 1) * w_i  mod 2**64
    value = fmix64(A xor fmix64(B xor fmix64(nbytes)))

``fmix64`` is the 64-bit finaliser of MurmurHash3 (Appleby, public domain), a bijection of 64-bit integers.
``(A, B)`` are the two running sums of Fletcher's checksum (J. G. Fletcher, "An Arithmetic Checksum for
Serial Transmissions", IEEE Trans. Commun. 30(1), 1982) with 32-bit words and modulus 2**64 instead of
255/65535.

What it detects (not a defence against an adversary, like the other checksums of
:mod:`phoenix_hpc.runtime.checksum`): for two byte strings of the same length below 2**33 bytes, ``(A, B)``
always differ when they differ in one 32-bit word, in two words, or by two words swapped (a word changed by
``d``, ``0 < |d| < 2**32``, changes ``A`` by ``d``; two changes that cancel in ``A`` change ``B`` by
``(j - k) d``, ``0 < |j - k| < 2**31``, which is not 0 mod 2**64). With ``A`` or ``B`` unchanged the value
always changes (``fmix64`` is a bijection); with both changed it stays the same for about one pair ``(A, B)``
in 2**64. Other corruption (torn copies, zeroed or stale ranges) changes the value with that same chance of
a miss. Lengths enter the value, so trailing zero bytes are not lost. Unlike a CRC it has no burst guarantee
beyond two words.

Why it exists: the hashes of the host (XXH3, CRC) run on CPU cores at about 10 GB/s each, while the GPU
reads its memory at terabytes per second; these sums are elementwise products and row sums, which torch runs
on any device. The device computes per-block partial sums (:func:`partials`: exact integers, no overflow);
the host folds the blocks' partials (16 bytes per 16 KiB) in uint64 numpy arithmetic, where wrap-around is
defined. The same function on CPU tensors is
what holders and restores verify host bytes with, and what CI tests against the reference.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

#: words per row of the float64 matrix product (products and sums below 2**47: exact in float64)
SUB_WORDS = 1 << 8
#: rows of SUB_WORDS per block of the partial sums (int64 sums below 2**56)
SUBS = 1 << 4
#: words per block: one ``(A_r, B_r)`` pair per block goes to the host (16 bytes per 16 KiB)
ROW_WORDS = SUB_WORDS * SUBS
#: blocks per device pass (8 Mi words, 32 MiB of the tensor: 64 MiB of float64 temporaries)
ROWS_PER_PASS = 1 << 11
_M64 = (1 << 64) - 1


def fmix64(k: int) -> int:
    """MurmurHash3's 64-bit finaliser (a bijection of ``[0, 2**64)``; pure)."""
    k &= _M64
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB93FE5A13E53) & _M64
    return k ^ (k >> 33)


def finish(a: int, b: int, nbytes: int) -> int:
    """The value from the sums ``A``, ``B`` (taken mod 2**64) and the length in bytes (pure)."""
    return fmix64((a & _M64) ^ fmix64((b & _M64) ^ fmix64(nbytes)))


def _words(t) -> tuple[Any, Any]:
    """``(full, rest)``: the tensor's bytes as int32 words on its device: the whole words, and the last
    partial word zero padded (empty when the length is a multiple of 4)."""
    import torch

    u8 = t.detach().reshape(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.detach().reshape(-1)
    n = u8.numel()
    full = n // 4 * 4
    try:
        words = u8[:full].view(torch.int32)
    except RuntimeError:  # a view whose byte offset is not a multiple of 4: an aligned copy
        words = u8[:full].clone().view(torch.int32)
    if full == n:
        return words, torch.empty(0, dtype=torch.int32, device=t.device)
    pad = torch.zeros(4, dtype=torch.uint8, device=t.device)
    pad[: n - full] = u8[full:]
    return words, pad.view(torch.int32)


def partials(t):
    """Per-block ``(A_r, B_r)`` of tensor ``t`` (any dtype, contiguous or not; read as its bytes in row-major
    order), computed on ``t``'s device on the current stream: an int64 tensor of shape ``(blocks, 2)``, one
    row per :data:`ROW_WORDS` words (the last block may be shorter). ``B_r`` weights a block's words
    1 .. :data:`ROW_WORDS`; :func:`fold` places the blocks.

    How: words in rows of :data:`SUB_WORDS` as float64, times a ``(SUB_WORDS, 2)`` matrix of ones and the
    weights 1 .. SUB_WORDS (one matrix product; every product and partial sum is an integer below 2**47,
    exact in float64 whatever order the library sums in), then :data:`SUBS` such rows per block in int64
    (below 2**56). A matrix product runs at the memory's speed on both CPUs and GPUs, where int64
    elementwise products are several times slower."""
    import torch

    if not t.is_contiguous():
        t = t.contiguous()
    words, rest = _words(t)
    n = words.numel()
    full = n // ROW_WORDS
    dev = t.device
    mat = torch.stack((torch.ones(SUB_WORDS, dtype=torch.float64, device=dev),
                       torch.arange(1, SUB_WORDS + 1, dtype=torch.float64, device=dev)), dim=1)
    shift = (torch.arange(SUBS, dtype=torch.int64, device=dev) * SUB_WORDS).view(1, SUBS)
    parts = []
    for r0 in range(0, full, ROWS_PER_PASS):
        r1 = min(full, r0 + ROWS_PER_PASS)
        sub = (words[r0 * ROW_WORDS : r1 * ROW_WORDS].view(-1, SUB_WORDS).to(torch.float64) @ mat).to(torch.int64)
        sub = sub.view(r1 - r0, SUBS, 2)
        a = sub[:, :, 0]
        parts.append(torch.stack((a.sum(1), (sub[:, :, 1] + shift * a).sum(1)), dim=1))
    last = words[full * ROW_WORDS :]
    if last.numel() or rest.numel():
        w = torch.cat((last, rest)).to(torch.int64)
        weights = torch.arange(1, w.numel() + 1, dtype=torch.int64, device=dev)
        parts.append(torch.stack((w.sum(), (w * weights).sum())).view(1, 2))
    if not parts:
        return torch.zeros(0, 2, dtype=torch.int64, device=dev)
    return torch.cat(parts)


def fold(rows: np.ndarray, nbytes: int) -> int:
    """The value from :func:`partials` moved to the host (``rows``: int64, shape ``(rows, 2)``) and the
    tensor's length in bytes: ``A = sum A_r``, ``B = sum (B_r + r * ROW_WORDS * A_r)``, mod 2**64 (pure)."""
    r = np.ascontiguousarray(rows, dtype=np.int64).view(np.uint64).reshape(-1, 2)
    with np.errstate(over="ignore"):
        a = int(r[:, 0].sum(dtype=np.uint64))
        offs = np.arange(r.shape[0], dtype=np.uint64) * np.uint64(ROW_WORDS)
        b = int((r[:, 1] + offs * r[:, 0]).sum(dtype=np.uint64))
    return finish(a, b, nbytes)


def wsum64_tensor(t) -> int:
    """``wsum64`` of tensor ``t``'s bytes, computed on its device (synchronises with it to read the row sums)."""
    return fold(partials(t).cpu().numpy(), t.numel() * t.element_size())


def wsum64_bytes(view) -> int:
    """``wsum64`` of a contiguous host byte view (``memoryview``, ``bytes`` or uint8 ``numpy`` array) with
    torch's CPU ops (what holders and restores verify with)."""
    import torch

    mv = memoryview(view).cast("B")
    if mv.nbytes == 0:
        return finish(0, 0, 0)
    with warnings.catch_warnings():  # a read-only view: torch warns that the tensor could write; it only reads
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(mv, dtype=torch.uint8)
    return wsum64_tensor(t)


def wsum64_reference(data: bytes) -> int:
    """The definition written directly (numpy, uint64 wrap-around, one pass): the test oracle."""
    raw = bytes(data)
    padded = raw + b"\0" * (-len(raw) % 4)
    w = np.frombuffer(padded, dtype="<i4").astype(np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        a = int(w.sum(dtype=np.uint64))
        b = int((w * np.arange(1, w.size + 1, dtype=np.uint64)).sum(dtype=np.uint64))
    return finish(a, b, len(raw))
