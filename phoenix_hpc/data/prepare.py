"""Build a byte-level Megatron indexed dataset (``.bin`` + ``.idx``) from a folder of text files.

Each text file becomes one document of uint8 tokens (its raw bytes; vocabulary 256), written with
megatron-core's :class:`~megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder`. Files are taken in
sorted path order, so the same folder always gives the same dataset. A file is "text" when it has no NUL
byte and decodes as UTF-8; others (``.pyc``, images) are skipped, as are ``__pycache__``,
``site-packages`` and ``dist-packages`` folders. Both outputs are written under temporary
names in the target folder and renamed into place only when complete, so an interrupted or failed run
leaves no partial dataset behind.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phoenix_hpc.errors import DataError


@dataclass(frozen=True)
class PrepareResult:
    """What :func:`prepare_dataset` wrote: ``documents`` files, ``tokens`` bytes of text in total."""

    prefix: str
    documents: int
    tokens: int
    skipped: int


def stdlib_dir() -> Path:
    """The folder of the running Python's standard library (``sysconfig.get_paths()['stdlib']``): real
    text available on every machine with Python."""
    return Path(sysconfig.get_paths()["stdlib"])


#: Folders never read: byte-code caches, and installed third-party packages (which live inside the
#: standard library's folder on most installs and are not part of it).
SKIP_DIRS = frozenset({"__pycache__", "site-packages", "dist-packages"})


def iter_files(src: Path) -> Iterator[Path]:
    """Regular files under ``src`` in sorted path order, skipping hidden folders and :data:`SKIP_DIRS`."""
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            p = Path(root) / name
            if p.is_file() and not p.is_symlink():
                yield p


def _text_bytes(path: Path) -> bytes | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data or b"\x00" in data:
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return data


def prepare_dataset(
    src_dir: str | Path,
    out_prefix: str | Path,
    max_bytes: int | None = None,
    on_file: Callable[[int, int], None] | None = None,
) -> PrepareResult:
    """Write ``OUT_PREFIX.bin`` and ``OUT_PREFIX.idx`` from the text files under ``src_dir``.

    Args:
        src_dir: folder to read (recursively).
        out_prefix: output path prefix; its parent folder is created if needed.
        max_bytes: stop after this many bytes of text (the last file is cut to fit); None: no limit.
        on_file: progress callback ``(files_seen, files_total)`` called after each file.

    Raises:
        DataError: ``src_dir`` does not exist or is not a folder, ``max_bytes`` < 1, or no text file
            was found.
    """
    from phoenix_hpc.data.indexed import megatron_indexed_module

    IndexedDatasetBuilder = megatron_indexed_module().IndexedDatasetBuilder

    src = Path(src_dir)
    if not src.is_dir():
        raise DataError(f"SRC_DIR {str(src)!r} does not exist or is not a folder")
    if max_bytes is not None and max_bytes < 1:
        raise DataError(f"--max-bytes must be >= 1, got {max_bytes}")
    out = Path(out_prefix)
    if out.name in ("", ".", ".."):
        raise DataError(f"OUT_PREFIX {str(out_prefix)!r} must name a file prefix, e.g. data/stdlib")
    out.parent.mkdir(parents=True, exist_ok=True)
    files = list(iter_files(src))
    tag = f".tmp-{os.getpid()}"
    bin_tmp, idx_tmp = Path(f"{out}.bin{tag}"), Path(f"{out}.idx{tag}")
    docs = tokens = skipped = 0
    try:
        builder = IndexedDatasetBuilder(str(bin_tmp), dtype=np.uint8)
        for i, path in enumerate(files):
            data = _text_bytes(path)
            if data is None:
                skipped += 1
            else:
                if max_bytes is not None:
                    data = data[: max_bytes - tokens]
                arr = np.frombuffer(data, dtype=np.uint8)
                builder.add_document(arr, [arr.size])
                docs += 1
                tokens += arr.size
            if on_file is not None:
                on_file(i + 1, len(files))
            if max_bytes is not None and tokens >= max_bytes:
                break
        builder.finalize(str(idx_tmp))
        if docs == 0:
            raise DataError(f"no text files under {str(src)!r} ({len(files)} files looked at, none UTF-8 text)")
        from phoenix_hpc.interrupts import hold_interrupt

        with hold_interrupt():  # the pair is replaced whole: a Ctrl-C here waits for both
            os.replace(bin_tmp, f"{out}.bin")
            os.replace(idx_tmp, f"{out}.idx")
    finally:
        for p in (bin_tmp, idx_tmp):
            p.unlink(missing_ok=True)
    return PrepareResult(prefix=str(out), documents=docs, tokens=tokens, skipped=skipped)
