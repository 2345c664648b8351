"""Snapshot packing: one rank's state in ONE contiguous host byte buffer, with an index and a checksum per
tensor (docs/design.md sections 2-4).

Buffer format (all integers little-endian)::

    [0, 64)                      fixed header: magic b"PHXSNAP1", format version (u32), flags (u32),
                                 index length (u32), CRC-32 of the index (u32), index capacity (u64),
                                 opt_end (u64), total length (u64), step (i64), generation (i64)
    [64, 64 + index_capacity)    UTF-8 JSON index, zero padded: shard id, step, generation, checksum
                                 (algorithm name), grid, coord, envelope, and per tensor
                                 {name, part, dtype, shape, offset, nbytes, sum}
    [data_start, opt_end)        the optimizer shard's tensors ("opt" part), each 64-byte aligned
    [opt_end, total)             the param shard's tensors ("param" part), each 64-byte aligned

The optimizer part comes first so that a *replica* (what H2H sends: header + index + optimizer shard,
docs/design.md section 3) is the prefix ``buf[:opt_end]`` of the local snapshot: no second packing, no copy.
A replica's index still lists the param tensors (with their checksums) but its readers ignore them.

Checksum: one per tensor, with the algorithm named in the index (``checksum``: ``crc32c``, ``crc32`` or
``xxh3_64``; :mod:`phoenix_hpc.runtime.checksum`, chosen by ``resilience.checksum``), computed once per byte
by the owner when it seals the snapshot and once by each holder when a replica arrives; the holder
acknowledges the combined value of the optimizer part and the owner compares it with its own. The index
itself is protected by a CRC-32 in the header. An integrity check against torn or corrupted copies, not a
defence against an adversary.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.runtime.buffers import host_empty
from phoenix_hpc.runtime.checksum import DEFAULT_CHECKSUM, checksum_function, combine
from phoenix_hpc.runtime.checksum_pool import checksum_groups

MAGIC = b"PHXSNAP1"
FORMAT_VERSION = 2  # 2: per-tensor "sum" with the algorithm named in the index ("checksum")
HEADER_BYTES = 64
ALIGN = 64
_HEADER = struct.Struct("<8sIIIIQQQqq")
assert _HEADER.size == HEADER_BYTES

OPT, PARAM = "opt", "param"

_DTYPES: dict[str, torch.dtype] = {
    str(d): d
    for d in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lives in a snapshot buffer. ``offset``/``nbytes`` in bytes from the buffer start."""

    name: str
    part: str  # "opt" or "param"
    dtype: str  # str(torch.dtype), e.g. "torch.float32"
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SnapshotLayout:
    """Byte layout of one rank's snapshot buffer; fixed for a run (shapes never change between steps).

    ``total_bytes`` is the snapshot size, ``opt_end`` the replica size (header + index capacity + optimizer
    shard). ``index_capacity`` reserves room for the JSON index; the envelope may change size from step to
    step, so the capacity is twice the first index's length plus 64 KiB.
    """

    slots: tuple[TensorSlot, ...]
    index_capacity: int
    data_start: int
    opt_end: int
    total_bytes: int

    @property
    def replica_bytes(self) -> int:
        return self.opt_end

    @property
    def opt_data_bytes(self) -> int:
        return sum(s.nbytes for s in self.slots if s.part == OPT)

    @functools.cached_property
    def index_entries(self) -> tuple[str, ...]:
        """Per slot, the compact JSON text of its index entry up to its checksum value
        (``{"name":...,"nbytes":N,"sum":``): the part of every :func:`seal` of this layout that never changes,
        built once. Encoding the whole index every step cost about 0.7 ms for 212 tensors."""
        return tuple(_compact({"name": s.name, "part": s.part, "dtype": s.dtype, "shape": list(s.shape),
                               "offset": s.offset, "nbytes": s.nbytes, "sum": 0})[:-2] for s in self.slots)


def _compact(obj: Any) -> str:
    """``obj`` as compact JSON, the encoding of every snapshot index."""
    return json.dumps(obj, separators=(",", ":"))


def _check_tensors(pairs: list[tuple[str, torch.Tensor]], part: str) -> None:
    seen = set()
    for name, t in pairs:
        if name in seen:
            raise ReplicationError(f"{part} tensor name {name!r} appears twice")
        seen.add(name)
        if str(t.dtype) not in _DTYPES:
            raise ReplicationError(f"{part} tensor {name!r} has unsupported dtype {t.dtype}")


def plan_layout(
    opt: list[tuple[str, torch.Tensor]],
    params: list[tuple[str, torch.Tensor]],
    index_example: dict[str, Any],
) -> SnapshotLayout:
    """Lay out a snapshot of ``opt`` (optimizer shard) and ``params`` (param shard).

    ``index_example`` is a representative index dict (same keys and envelope as at run time, checksums
    zero) whose JSON length sizes the reserved index region. Pure: reads only shapes, dtypes and names.
    """
    _check_tensors(opt, OPT)
    _check_tensors(params, PARAM)
    probe = dict(index_example)
    probe["tensors"] = [
        {"name": n, "part": OPT if i < len(opt) else PARAM, "dtype": str(t.dtype), "shape": list(t.shape),
         "offset": 2**40, "nbytes": 2**40, "sum": 2**64 - 1}
        for i, (n, t) in enumerate(opt + params)
    ]
    first = len(_compact(probe).encode())
    capacity = _align(2 * first + (64 << 10))
    off = data_start = _align(HEADER_BYTES + capacity)
    slots = []
    for part, pairs in ((OPT, opt), (PARAM, params)):
        for name, t in pairs:
            nbytes = t.numel() * t.element_size()
            slots.append(TensorSlot(name, part, str(t.dtype), tuple(t.shape), off, nbytes))
            off = _align(off + nbytes)
        if part == OPT:
            opt_end = off
    return SnapshotLayout(tuple(slots), capacity, data_start, opt_end, off)


def tensor_view(buf: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    """A typed view (shape ``slot.shape``, dtype ``slot.dtype``) of ``slot``'s bytes in the uint8 ``buf``."""
    return buf[slot.offset : slot.offset + slot.nbytes].view(_DTYPES[slot.dtype]).view(slot.shape)


def slot_views(buf: torch.Tensor, layout: SnapshotLayout) -> tuple[torch.Tensor, ...]:
    """A typed view of every slot of ``layout`` in ``buf`` (:func:`tensor_view`, slot order). Building a
    view costs a few microseconds of Python and torch dispatch; a caller that copies into the same buffer
    every step builds them once (``runtime/d2h.py``)."""
    return tuple(tensor_view(buf, s) for s in layout.slots)


def copy_in(
    buf: torch.Tensor,
    layout: SnapshotLayout,
    opt: list[tuple[str, torch.Tensor]],
    params: list[tuple[str, torch.Tensor]],
    non_blocking: bool = False,
    views: tuple[torch.Tensor, ...] | None = None,
) -> None:
    """Copy the live tensors into ``buf`` (a uint8 host tensor of at least ``layout.total_bytes``).

    On CUDA call it inside the D2H stream with ``non_blocking=True`` and a pinned ``buf``. ``views``:
    :func:`slot_views` of ``buf`` and ``layout``, built earlier (the same bytes are written either way).
    Raises ReplicationError if names, shapes or dtypes differ from the layout (the engine changed shape).
    """
    if views is None:
        views = slot_views(buf, layout)
    pairs = check_state(layout, opt, params, views)
    with torch.no_grad():  # the buffer's views must not join an autograd graph of a parameter
        for (_, t), view in zip(pairs, views):
            view.copy_(t, non_blocking=non_blocking)


def check_state(layout: SnapshotLayout, opt: list[tuple[str, torch.Tensor]], params: list[tuple[str, torch.Tensor]],
                views: tuple[torch.Tensor, ...]) -> list[tuple[str, torch.Tensor]]:
    """``opt + params`` after checking them against ``layout`` and its :func:`slot_views` ``views``: one
    tensor per slot, in slot order, with the slot's name, dtype and shape. Raises ReplicationError naming the
    first that differs (the engine changed shape)."""
    pairs = opt + params
    if len(pairs) != len(layout.slots):
        raise ReplicationError(f"engine state has {len(pairs)} tensors, the snapshot layout {len(layout.slots)}")
    for (name, t), slot, view in zip(pairs, layout.slots, views):
        if name != slot.name or t.dtype != view.dtype or t.shape != view.shape:
            raise ReplicationError(
                f"engine tensor {name} {t.dtype} {tuple(t.shape)} does not match the snapshot layout's "
                f"{slot.name} {slot.dtype} {slot.shape}"
            )
    return pairs


def _np(buf: torch.Tensor) -> np.ndarray:
    return buf.numpy() if buf.device.type == "cpu" else buf.cpu().numpy()


def checksums(buf: torch.Tensor, layout: SnapshotLayout, parts: tuple[str, ...] = (OPT, PARAM),
              checksum: str = DEFAULT_CHECKSUM) -> list[int]:
    """Checksum of every tensor of ``layout`` (in slot order) already copied into ``buf``; tensors of parts
    not listed get -1 (not checked). Every byte of the listed parts is read once."""
    fn = checksum_function(checksum)
    a = _np(buf)
    return [fn(memoryview(a[s.offset : s.offset + s.nbytes])) if s.part in parts else -1 for s in layout.slots]


def combined_crc(crcs: list[int]) -> int:
    """One 32-bit value over a list of per-tensor checksums (the value a holder acknowledges)."""
    return combine(crcs)


def hash_hex(crc: int) -> str:
    """A combined CRC-32 (:func:`combined_crc`) as the 8 lowercase hex digits members and holders report."""
    return f"{crc & 0xFFFFFFFF:08x}"


def part_hash(pairs: list[tuple[str, torch.Tensor]], checksum: str = DEFAULT_CHECKSUM) -> str:
    """The hash of one part of a rank's live state (its optimizer shard, or its param shard): the combined
    value (:func:`combined_crc`) of the per-tensor checksums ``checksum`` (``resilience.checksum``, the one
    the snapshots are sealed with) of the tensors' bytes, in the given order, as :func:`hash_hex`.

    For the optimizer shard in the engine's ``optimizer_shard()`` order this equals the value :func:`seal`
    returns for a snapshot of that state and :func:`verify` recomputes from a replica of it (the snapshot
    layout follows that order and copies bytes unchanged), so a restored shard can be compared with the
    replica it came from without moving it. Tensors may live on any device (copied to host for the CRC)."""
    fn = checksum_function(checksum)
    crcs = []
    for _, t in pairs:
        flat = t.detach().contiguous().reshape(-1)
        if flat.device.type != "cpu":
            flat = flat.cpu()
        crcs.append(fn(memoryview(flat.view(torch.uint8).numpy())))
    return hash_hex(combined_crc(crcs))


def seal(
    buf: torch.Tensor,
    layout: SnapshotLayout,
    *,
    shard_id: str,
    step: int,
    generation: int,
    grid: dict[str, int],
    coord: dict[str, int],
    envelope: dict[str, Any],
    parts: tuple[str, ...] = (OPT, PARAM),
    checksum: str = DEFAULT_CHECKSUM,
    sums: list[int] | None = None,
) -> int:
    """Checksum every tensor of ``parts`` already copied into ``buf`` (or take ``sums``, from
    :func:`checksums` with the same ``parts`` and ``checksum``), write the index and the header.

    Returns the combined checksum of the optimizer part (:func:`combined_crc` of the opt tensors'), the
    value holders acknowledge. Tensors of parts not listed get -1 (not checked).
    Raises ReplicationError when the index (envelope) outgrows the reserved capacity, or ``sums`` does not
    have one value per tensor.
    """
    if sums is None:
        sums = checksums(buf, layout, parts, checksum)
    if len(sums) != len(layout.slots):
        raise ReplicationError(f"{len(sums)} checksums for {len(layout.slots)} tensors")
    opt_crcs = [int(c) for s, c in zip(layout.slots, sums) if s.part == OPT]
    # the index as json.dumps would write it with "tensors" last, from the layout's fixed entry texts
    head = _compact({"format": FORMAT_VERSION, "shard_id": shard_id, "step": step, "generation": generation,
                     "checksum": checksum, "grid": grid, "coord": coord, "envelope": envelope})
    tensors = ",".join([f"{e}{int(c)}}}" for e, c in zip(layout.index_entries, sums)])
    raw = f'{head[:-1]},"tensors":[{tensors}]}}'.encode()
    if len(raw) > layout.index_capacity:
        raise ReplicationError(
            f"snapshot index of {len(raw)} bytes exceeds the reserved {layout.index_capacity} bytes "
            "(the engine's envelope grew a lot since start-up)"
        )
    _write_head(_np(buf), raw, layout.index_capacity, layout.opt_end, layout.total_bytes, step, generation)
    return combined_crc(opt_crcs)


def _write_head(a: np.ndarray, raw: bytes, capacity: int, opt_end: int, total_bytes: int, step: int,
                generation: int) -> None:
    """Write the JSON index ``raw`` (zero-padded to ``capacity`` bytes), then the fixed header naming it, at
    the start of the uint8 array ``a``: the head of every sealed buffer (:func:`seal`, :func:`param_part`)."""
    a[HEADER_BYTES : HEADER_BYTES + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    a[HEADER_BYTES + len(raw) : HEADER_BYTES + capacity] = 0
    a[:HEADER_BYTES] = np.frombuffer(_HEADER.pack(MAGIC, FORMAT_VERSION, 0, len(raw), zlib.crc32(raw), capacity,
                                                  opt_end, total_bytes, step, generation), dtype=np.uint8)


@dataclass(frozen=True)
class SnapshotHeader:
    step: int
    generation: int
    index_capacity: int
    opt_end: int
    total_bytes: int
    index: dict[str, Any]


def seal_part(pairs: list[tuple[str, torch.Tensor]], part: str, shard_id: str, step: int,
              generation: int) -> torch.Tensor:
    """One part (``OPT`` or ``PARAM``) of a state, ``(name, tensor)`` pairs, copied into a new host buffer and
    sealed (header, index, a checksum per tensor; empty grid, coordinate and envelope): what a recovery sends
    that is not a replica buffer already (a DP peer's parameters, a shrink's own optimizer slice).
    :func:`unpack` with ``(part,)`` verifies and reads it."""
    pairs = sorted(pairs, key=lambda x: x[0])
    meta = {"shard_id": shard_id, "step": step, "generation": generation, "grid": {}, "coord": {}, "envelope": {}}
    opt, par = (pairs, []) if part == OPT else ([], pairs)
    layout = plan_layout(opt, par, meta)
    buf = host_empty(layout.total_bytes)  # header, index and every tensor byte are written below; the
    # checksums cover those bytes only, so the alignment gaps need no fill
    copy_in(buf, layout, opt, par)  # writes header and index; the checksums cover the tensors only
    seal(buf, layout, shard_id=shard_id, step=step, generation=generation, grid={}, coord={}, envelope={},
         parts=(part,))
    return buf


def read_header(buf: torch.Tensor | np.ndarray) -> SnapshotHeader:
    """Parse and check the fixed header and the JSON index of a snapshot or replica buffer.

    Raises ReplicationError on a wrong magic/version, an index CRC mismatch or an unreadable index.
    """
    a = buf if isinstance(buf, np.ndarray) else _np(buf)
    if a.size < HEADER_BYTES:
        raise ReplicationError(f"buffer of {a.size} bytes is too small for a snapshot header")
    magic, ver, _flags, ilen, icrc, icap, opt_end, total, step, gen = _HEADER.unpack(a[:HEADER_BYTES].tobytes())
    if magic != MAGIC or ver != FORMAT_VERSION:
        raise ReplicationError(f"not a snapshot buffer (magic {magic!r}, version {ver})")
    if ilen > icap or HEADER_BYTES + icap > a.size:
        raise ReplicationError(f"corrupt snapshot header (index length {ilen}, capacity {icap}, buffer {a.size})")
    raw = a[HEADER_BYTES : HEADER_BYTES + ilen].tobytes()
    if zlib.crc32(raw) != icrc:
        raise ReplicationError("snapshot index fails its checksum")
    try:
        index = json.loads(raw)
    except ValueError as e:
        raise ReplicationError(f"snapshot index is not valid JSON: {e}") from e
    return SnapshotHeader(step, gen, icap, opt_end, total, index)


def param_part(buf: torch.Tensor, shard_id: str) -> tuple[np.ndarray, np.ndarray]:
    """The param part of a sealed snapshot ``buf`` as a param-only sealed buffer in two pieces, without
    copying or checksumming a tensor byte: ``head`` (uint8, a new header and index: shard ``shard_id``, the
    snapshot's step, generation and checksum algorithm, each param tensor with its checksum and its offset
    moved) and ``body`` (a uint8 view of ``buf[opt_end:total]``). ``head`` followed by ``body`` reads with
    :func:`unpack` ``(PARAM,)`` as :func:`seal_part` of the same tensors would: what a DP peer sends a spare
    from its local snapshot of the recoverable step (sealed by its copy path, so every byte was checksummed
    once already; the receiver verifies every tensor).

    Raises:
        ReplicationError: ``buf`` is not a sealed snapshot (:func:`read_header`), or a param tensor has no
            checksum (a buffer sealed without its param part)."""
    h = read_header(buf)
    params = [e for e in h.index["tensors"] if e["part"] == PARAM]
    if any(int(e["sum"]) < 0 for e in params):
        raise ReplicationError(f"snapshot of {h.index.get('shard_id')} step {h.step} has no param checksums")
    index = {"format": FORMAT_VERSION, "shard_id": shard_id, "step": h.step, "generation": h.generation,
             "checksum": h.index["checksum"], "grid": {}, "coord": {}, "envelope": {}, "tensors": []}

    def raw_for(start: int) -> bytes:
        index["tensors"] = [{**e, "offset": e["offset"] - h.opt_end + start} for e in params]
        return _compact(index).encode()

    capacity = _align(len(raw_for(2**40)) + 64)  # the largest offsets bound the index's length
    start = _align(HEADER_BYTES + capacity)
    raw = raw_for(start)
    head = np.zeros(start, dtype=np.uint8)
    _write_head(head, raw, capacity, start, start + h.total_bytes - h.opt_end, h.step, h.generation)
    return head, _np(buf)[h.opt_end : h.total_bytes]


@dataclass(frozen=True)
class Unpacked:
    """A verified snapshot or replica, copied out of its buffer: ``tensors`` maps logical names to fresh
    CPU tensors (dtypes/shapes as saved), ``envelope`` is the engine's metadata envelope."""

    shard_id: str
    step: int
    generation: int
    grid: dict[str, int]
    coord: dict[str, int]
    envelope: dict[str, Any]
    tensors: dict[str, torch.Tensor]
    opt_crc: int


def verify(buf: torch.Tensor, parts: tuple[str, ...] = (OPT,), pool=None,
           timings: dict | None = None) -> tuple[SnapshotHeader, int]:
    """Check header, index and the checksum (the index's algorithm) of every tensor of ``parts``; return
    the header and the combined checksum of the opt part. Raises ReplicationError naming the first tensor
    (in index order) that fails, or an algorithm this build does not know.

    ``pool``: a :class:`~phoenix_hpc.runtime.checksum_pool.ChecksumPool`; with more than one thread the
    tensors are checksummed on it (a GPU rank's held replicas, gigabytes of host memory), and
    ``timings["checksum_ns"]`` (when ``timings`` is given) receives the CPU ns the checksums took on its
    threads. Without one, or with one thread, they are checksummed in the calling thread."""
    h = read_header(buf)
    algo = h.index.get("checksum", "")
    fn = checksum_function(algo)  # raises on an unknown algorithm
    mv = memoryview(_np(buf))
    opt_limit, all_limit = min(h.opt_end, len(mv)), min(h.total_bytes, len(mv))
    entries = [e for e in h.index["tensors"] if e["part"] in parts]
    for e in entries:
        if e["offset"] + e["nbytes"] > (opt_limit if e["part"] == OPT else all_limit):
            raise ReplicationError(f"tensor {e['name']} lies outside the buffer")
    if pool is not None and pool.threads > 1:  # every checksum ends before any error is raised
        slots = [TensorSlot(e["name"], e["part"], e["dtype"], tuple(e["shape"]), e["offset"], e["nbytes"])
                 for e in entries]
        values, ns = checksum_groups(mv, slots, [len(slots)], lambda i: None, fn, pool)
        if timings is not None:
            timings["checksum_ns"] = ns
    else:
        values = (fn(mv[e["offset"] : e["offset"] + e["nbytes"]]) for e in entries)
    opt_crcs = []
    for e, c in zip(entries, values):
        if c != e["sum"]:
            raise ReplicationError(
                f"tensor {e['name']} of shard {h.index['shard_id']} step {h.step} fails its checksum "
                f"({algo} {c:#x}, expected {e['sum']:#x})"
            )
        if e["part"] == OPT:
            opt_crcs.append(c)
    return h, combined_crc(opt_crcs)


def unpack(buf: torch.Tensor, parts: tuple[str, ...] = (OPT,), copy: bool = True) -> Unpacked:
    """Verify (see :func:`verify`) then copy the tensors of ``parts`` out of ``buf``.

    ``copy=False``: the tensors are views of ``buf`` instead, for a caller that loads them into an engine at
    once (a recovery) and knows that nobody writes ``buf`` until then: a buffer it received itself, or a
    committed or verified copy of a closed protector (written by nobody). It saves a copy of every byte."""
    h, occ = verify(buf, parts)
    tensors = {}
    for e in h.index["tensors"]:
        if e["part"] in parts:
            slot = TensorSlot(e["name"], e["part"], e["dtype"], tuple(e["shape"]), e["offset"], e["nbytes"])
            view = tensor_view(buf, slot)
            tensors[e["name"]] = view.clone() if copy else view
    ix = h.index
    return Unpacked(ix["shard_id"], h.step, h.generation, ix["grid"], ix["coord"], ix["envelope"], tensors, occ)
