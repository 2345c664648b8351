"""Reading the files the CLI is given or finds: one function, so every file gets the same checks.

Job configs, site profiles, a run directory's files (``config.yaml``, ``job.json``, ``coordinator.json``,
``journal.jsonl``, the job secret), the runs index, a dataset's ``.idx`` and the cost model's CSV and
journal inputs are all read through :func:`read_text` or :func:`read_bytes`. A file that does not exist,
is a directory, cannot be read, is empty (where emptiness is not allowed) or is not UTF-8 text raises the
caller's error class (a :class:`~phoenix_hpc.errors.PhoenixError`: exit code 2), naming the file and the
problem, never a traceback.

UTF-8 with a byte-order mark is UTF-8 and is accepted (the mark is dropped). A file that starts with a
UTF-16 or UTF-32 byte-order mark, as some editors save text, is refused with that diagnosis: YAML and JSON
here are UTF-8 (YAML 1.1 allows UTF-16, but the same file must also be readable by the job's other tools).
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path

from phoenix_hpc.errors import ConfigError, PhoenixError

_WIDE_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (codecs.BOM_UTF32_LE, "UTF-32 (little-endian)"),
    (codecs.BOM_UTF32_BE, "UTF-32 (big-endian)"),
    (codecs.BOM_UTF16_LE, "UTF-16 (little-endian)"),
    (codecs.BOM_UTF16_BE, "UTF-16 (big-endian)"),
)


def _fail(error: type[PhoenixError], what: str, path: Path, problem: str) -> PhoenixError:
    return error(f"{what} file {str(path)!r} {problem}")


def read_bytes(path: str | os.PathLike, what: str, *, error: type[PhoenixError] = ConfigError,
               allow_empty: bool = False, missing_ok: bool = False, max_bytes: int | None = None) -> bytes | None:
    """The bytes of ``path`` (only its first ``max_bytes`` when that is given: a header).

    Args:
        what: how the message names the file (``"config"``, ``"site profile"``, ``"dataset index"``).
        error: the error class raised (its exit code is the command's).
        allow_empty: an empty file is returned as ``b""`` instead of refused.
        missing_ok: a missing file gives None instead of an error.

    Raises:
        error: the file does not exist (unless ``missing_ok``), is a directory or not a regular file,
            cannot be read (permissions, I/O error), or is empty (unless ``allow_empty``).
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read() if max_bytes is None else f.read(max_bytes)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise _fail(error, what, p, "does not exist") from None
    except IsADirectoryError:
        raise _fail(error, what, p, "is a directory, not a file") from None
    except PermissionError:
        raise _fail(error, what, p, "cannot be read: permission denied") from None
    except OSError as exc:
        raise _fail(error, what, p, f"cannot be read: {exc.strerror or exc}") from None
    if not data and not allow_empty:
        kind = "is empty" if p.is_file() else "is not a regular file"
        raise _fail(error, what, p, kind) from None
    return data


def wide_encoding(data: bytes) -> str | None:
    """The UTF-16/UTF-32 encoding whose byte-order mark ``data`` starts with, in words; None for none. Pure."""
    return next((name for bom, name in _WIDE_BOMS if data.startswith(bom)), None)


def decode_utf8(data: bytes, what: str, path: str | os.PathLike, *,
                error: type[PhoenixError] = ConfigError) -> str:
    """``data`` (the content of ``path``) as text. A leading UTF-8 byte-order mark is dropped.

    Raises:
        error: the bytes start with a UTF-16/UTF-32 byte-order mark, or are not valid UTF-8 (the message
            gives the offset of the first bad byte).
    """
    p = Path(path)
    name = wide_encoding(data)
    if name is not None:
        raise _fail(error, what, p, f"is encoded as {name} (it starts with that byte-order mark); "
                                    "save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = data[exc.start:exc.start + 1].hex()
        raise _fail(error, what, p, f"is not UTF-8 text (byte 0x{bad} at offset {exc.start}); save it as "
                                    "UTF-8") from None


def read_text(path: str | os.PathLike, what: str, *, error: type[PhoenixError] = ConfigError,
              allow_empty: bool = False, missing_ok: bool = False) -> str | None:
    """The UTF-8 text of ``path`` (see :func:`read_bytes` for the arguments and :func:`decode_utf8`).

    Raises:
        error: every problem of :func:`read_bytes` and :func:`decode_utf8`; also a file whose text is only
            white space when ``allow_empty`` is false.
    """
    data = read_bytes(path, what, error=error, allow_empty=allow_empty, missing_ok=missing_ok)
    if data is None:
        return None
    text = decode_utf8(data, what, path, error=error)
    if not allow_empty and not text.strip():
        raise _fail(error, what, Path(path), "holds only white space (it is empty)")
    return text


# --- private files of a run (the job secret, coordinator.json, checkpoint markers, landing records) ------

DIR_MODE = 0o700
FILE_MODE = 0o600


def ensure_private_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` (and parents) if needed and set its mode to ``0700``. Returns it as a Path."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    os.chmod(p, DIR_MODE)
    return p


def write_private_file(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder + ``os.replace``), mode ``0600``.

    Readers never see a half-written file: they see the old content or the new one.
    """
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.write(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, p)
    return p
