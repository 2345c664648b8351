"""The job's append-only journal: ``RUN_DIR/journal.jsonl``, one JSON object per line.

Every record has ``"ts"`` (unix time, seconds, float) and ``"event"`` (str), plus event-specific fields.
The records are the typed events of :mod:`phoenix_hpc.control.events` (one class per event name, with
its fields), written by the coordinator, the only writer while a job runs.
A coordinator restarted after a crash (:mod:`phoenix_hpc.control.restart`) writes ``coordinator_started``
with ``restart`` {N}, ``coordinator_restarted`` {what it rebuilt from the journal}, then ``rejoined`` or
``rejoin_refused`` per slot that re-registers; it appends to the same file (one writer at a time).

Durability: each append is one ``write`` of a whole line on a file opened with ``O_APPEND`` followed by
``fsync``, so a crash can at worst leave a torn *last* line; :func:`read_journal` ignores such a line (and
refuses a bad complete line; :func:`read_journal_skipping`, what a restarted coordinator and ``phoenix status``
read with, skips and names it). The next writer (a restarted coordinator, the next job of a chain) first ends a
torn last line with a newline (:attr:`Journal.torn_tail`): its own first record would otherwise be joined to
the torn bytes and lost with them. The torn line stays in the file as the trace of the crash, a complete line
that is no record, which the skipping readers name.
Group commit: :meth:`Journal.append_deferred` writes its line at once (so the file keeps the order of the
calls, and a crash of the writing *process* loses nothing: the kernel has the line) but leaves the ``fsync``
to the next :meth:`Journal.sync` or :meth:`Journal.append`, which make every line before them durable with one
``fsync``. The coordinator registers thousands of slots this way: one ``fsync`` per batch of messages, not per
slot (an ``fsync`` costs milliseconds on a disk; 16,000 of them were half a minute), and it answers a batch's
registrations only after that ``fsync``.
Privacy: the run directory is made ``0700`` and the journal ``0600`` (the journal names nodes, PIDs and
fault details of one user's job).
"""

from __future__ import annotations

import codecs
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from phoenix_hpc.control.events import Event, name_of
from phoenix_hpc.errors import StatusError
from phoenix_hpc.files import FILE_MODE, decode_utf8, read_bytes, wide_encoding
from phoenix_hpc.files import DIR_MODE, ensure_private_dir, write_private_file  # noqa: F401 -- re-exported

JOURNAL_NAME = "journal.jsonl"
class Journal:
    """Appends records to ``RUN_DIR/journal.jsonl``. Thread-safe; one instance per writing process.

    Args:
        run_dir: the job's run directory (created ``0700`` if missing).
        clock: returns unix time in seconds; injectable for tests.
    """

    def __init__(self, run_dir: str | os.PathLike, clock: Callable[[], float] = time.time):
        self.run_dir = ensure_private_dir(run_dir)
        self.path = self.run_dir / JOURNAL_NAME
        self._clock = clock
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
        os.chmod(self.path, FILE_MODE)
        self._unsynced = 0  # lines written since the last fsync
        self.fsyncs = 0  # fsync calls so far (the cost group commit saves)
        # the bytes of a torn last line (a writer that crashed mid-line) this writer ended with a newline;
        # b"" when the file was empty or ended with one
        self.torn_tail = _torn_tail(self.path)
        if self.torn_tail:
            os.write(self._fd, b"\n")
            os.fsync(self._fd)
            self.fsyncs += 1

    def append(self, event: Event | str, **fields: Any) -> dict[str, Any]:
        """Append one record ``{"ts", **event.to_record()}`` (:mod:`phoenix_hpc.control.events`; a bare name
        with ``fields`` writes ``{"ts", "event", **fields}``) and fsync it (with every deferred line before
        it). Returns the record.

        Raises:
            TypeError: a field is not JSON-serialisable, or fields are given with an event object.
            ValueError: ``event`` is empty, a field is named ``ts``/``event``, or the journal is closed.
        """
        return self._write(*_split(event, fields), sync=True)[0]

    def append_deferred(self, event: Event | str, **fields: Any) -> dict[str, Any]:
        """Like :meth:`append`, but the ``fsync`` waits for the next :meth:`sync` or :meth:`append` (group
        commit, see the module docstring). The line is written now, in call order. Same errors."""
        return self._write(*_split(event, fields), sync=False)[0]

    def write(self, event: Event, *, sync: bool = True) -> tuple[dict[str, Any], bytes]:
        """:meth:`append` (``sync``) or :meth:`append_deferred` of an event object, returning the record and the
        line written (UTF-8 JSON and its newline): what a reader of the file reads back, for a caller that
        applies the record as read (:class:`phoenix_hpc.control.recorder.Recorder`) without encoding it twice.
        Same errors."""
        return self._write(*_split(event, {}), sync=sync)

    def sync(self) -> int:
        """Make every deferred line durable with one ``fsync`` (none when nothing is pending). Returns how
        many lines that covered.

        Raises:
            ValueError: the journal is closed while lines are pending.
        """
        with self._lock:
            n = self._unsynced
            if n:
                if self._fd < 0:
                    raise ValueError(f"journal {self.path} is closed")
                os.fsync(self._fd)
                self.fsyncs += 1
                self._unsynced = 0
            return n

    def _write(self, event: str, fields: dict[str, Any], sync: bool) -> tuple[dict[str, Any], bytes]:
        if not event:
            raise ValueError("journal event name must be a non-empty string")
        if "ts" in fields or "event" in fields:
            raise ValueError("journal fields may not be named 'ts' or 'event'")
        record = {"ts": self._clock(), "event": event, **fields}
        line = (json.dumps(record, separators=(",", ":"), sort_keys=False) + "\n").encode()
        with self._lock:
            if self._fd < 0:
                raise ValueError(f"journal {self.path} is closed")
            os.write(self._fd, line)
            if sync:
                os.fsync(self._fd)
                self.fsyncs += 1
                self._unsynced = 0
            else:
                self._unsynced += 1
        return record, line

    def close(self) -> None:
        """Make deferred lines durable and close the file; further appends raise ValueError."""
        with self._lock:
            if self._fd >= 0:
                if self._unsynced:
                    os.fsync(self._fd)
                    self._unsynced = 0
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _torn_tail(path: Path, chunk: int = 1 << 16) -> bytes:
    """The bytes after the last newline of the file at ``path`` (b"" when it is empty or ends with one).
    Reads backwards in ``chunk``-byte pieces, so a long journal is not read whole."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        tail = b""
        pos = end
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            tail = f.read(pos - start) + tail
            cut = tail.rfind(b"\n")
            if cut >= 0:
                return tail[cut + 1:]
            pos = start
        return tail


def _split(event: Event | str, fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, fields) of what :meth:`Journal.append` was given."""
    if isinstance(event, Event):
        if fields:
            raise TypeError(f"journal event {event.NAME!r} given as an object takes no more fields: {sorted(fields)}")
        rec = event.to_record()
        return rec.pop("event"), rec
    return event, fields


def iter_journal(path: str | os.PathLike, skipped: list[str] | None = None,
                 lines: list[int] | None = None) -> Iterator[dict[str, Any]]:
    """Yield the records of a journal file in order (with ``lines``: the file line of each yielded record,
    from 1, is appended there).

    A torn last line (no trailing newline and not valid JSON, as left by a crash mid-write) is skipped.
    A complete line that is not UTF-8, not JSON (or JSON nested deeper than Python's parser allows), or not
    a JSON object with ``ts`` (a finite number: unix seconds) and ``event`` (a non-empty string) raises
    ValueError naming the line, or, when a ``skipped`` list is given, is skipped and named there
    (``"PATH:LINE: why: skipped"``; the reader reads on). A run directory or a journal path may be given; a
    missing journal yields nothing.

    Raises:
        StatusError: the journal is a directory, cannot be read, or is UTF-16/UTF-32 (a byte-order mark)
            (:func:`phoenix_hpc.files.read_bytes`).
    """
    p = Path(path)
    if p.is_dir():
        p = p / JOURNAL_NAME
    data = read_bytes(p, "journal", error=StatusError, allow_empty=True, missing_ok=True)
    if data is None:
        return
    if wide_encoding(data):
        decode_utf8(data[:4], "journal", p, error=StatusError)  # raises, naming the encoding
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    raws = data.split(b"\n")
    torn_tail = not data.endswith(b"\n")
    for i, raw in enumerate(raws):
        if not raw.strip():
            continue
        rec, why = _parse_line(raw)
        if why is None:
            if lines is not None:
                lines.append(i + 1)
            yield rec
            continue
        if torn_tail and i == len(raws) - 1 and why.startswith(("not a JSON line", "not UTF-8")):
            return  # a crash mid-write (it may end mid-character)
        why = f"{p}:{i + 1}: {why}: {raw[:80]!r}"
        if skipped is None:
            raise ValueError(why)
        skipped.append(why + ": skipped")


def _parse_line(raw: bytes) -> tuple[Any, str | None]:
    """(record, None) of one journal line, or (None, why it is no record). Pure."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start} of the line)"
    try:
        rec = json.loads(text)
    except json.JSONDecodeError:
        return None, "not a JSON line"
    except RecursionError:
        return None, "not a JSON line (nested deeper than the JSON reader allows)"
    if not isinstance(rec, dict) or "ts" not in rec or "event" not in rec:
        return None, "journal record needs 'ts' and 'event'"
    ts, name = rec["ts"], rec["event"]
    if not (type(ts) is int or (type(ts) is float and math.isfinite(ts))):
        return None, f"journal record needs 'ts' and 'event': 'ts' is {json.dumps(ts)}, allowed a finite number (unix seconds)"
    if type(name) is not str or not name:
        return None, f"journal record needs 'ts' and 'event': 'event' is {json.dumps(name)}, allowed a non-empty string"
    return rec, None


class JournalRead(NamedTuple):
    """What :func:`read_journal_numbered` read: ``records`` in file order, ``lines`` the file line (from 1) of
    each, ``skipped`` the lines that are no record (``"PATH:LINE: why: skipped"``), ``path`` the journal file,
    ``line_count`` the complete lines of the file (the next line written is ``line_count + 1``)."""

    records: list[dict[str, Any]]
    lines: list[int]
    skipped: list[str]
    path: Path
    line_count: int


def read_journal_numbered(path: str | os.PathLike) -> JournalRead:
    """The records of a journal with their file lines, and the lines it skipped, for the readers that must
    not stop at a bad line: a restarted coordinator (:mod:`phoenix_hpc.control.recorder`) and ``phoenix
    status`` (:mod:`phoenix_hpc.status.collect`). One rule for both (:func:`iter_journal` with a ``skipped``
    list): a torn last line is dropped silently; any other line that is no record (a disk error, a hand edit)
    is skipped and named, in file order. Hand :meth:`JournalRead.where` to
    :func:`phoenix_hpc.control.view.fold` so that what the fold skips is named by its file line too.

    Raises:
        StatusError: the journal is a directory, cannot be read, or is UTF-16/UTF-32 (:func:`iter_journal`).
    """
    p = Path(path)
    if p.is_dir():
        p = p / JOURNAL_NAME
    skipped: list[str] = []
    lines: list[int] = []
    records = list(iter_journal(path, skipped=skipped, lines=lines))  # a journal that is a directory: refused
    count = max(lines[-1:] + [_line_of(s) for s in skipped[-1:]], default=0)
    return JournalRead(records, lines, skipped, p, count)


def _line_of(skipped: str) -> int:
    """The line number of a ``"PATH:LINE: why: skipped"`` entry."""
    return int(skipped.split(": ", 1)[0].rsplit(":", 1)[1])


def line_namer(read: JournalRead) -> Callable[[int, Any], str]:
    """``where(number, record)``: ``"PATH:LINE"`` of a record of ``read`` (the same dict object), else
    ``"record NUMBER"`` (a record from elsewhere, e.g. a landing file merged in). For
    :func:`phoenix_hpc.control.view.fold`'s ``where``."""
    line_of = {id(r): n for r, n in zip(read.records, read.lines)}
    path = read.path

    def where(number: int, record: Any) -> str:
        n = line_of.get(id(record))
        return f"{path}:{n}" if n is not None else f"record {number}"
    return where


def read_journal_skipping(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of a journal and the lines it skipped (:func:`read_journal_numbered` without the line
    numbers).

    Raises:
        StatusError: the journal is a directory, cannot be read, or is UTF-16/UTF-32 (:func:`iter_journal`).
    """
    read = read_journal_numbered(path)
    return read.records, read.skipped


def read_journal(path: str | os.PathLike, event: type[Event] | str | None = None) -> list[dict[str, Any]]:
    """All records of a journal (optionally only those of the event class ``event``, or of that name).

    Raises:
        EventError: ``event`` is a name no event class declares (:func:`phoenix_hpc.control.events.name_of`).
    """
    name = None if event is None else name_of(event)
    return [r for r in iter_journal(path) if name is None or r["event"] == name]
