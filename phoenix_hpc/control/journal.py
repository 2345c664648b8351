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
read with, skips and names it).
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

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from phoenix_hpc.control.events import Event, name_of
from phoenix_hpc.errors import StatusError
from phoenix_hpc.files import FILE_MODE, decode_utf8, read_bytes
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

    def append(self, event: Event | str, **fields: Any) -> dict[str, Any]:
        """Append one record ``{"ts", **event.to_record()}`` (:mod:`phoenix_hpc.control.events`; a bare name
        with ``fields`` writes ``{"ts", "event", **fields}``) and fsync it (with every deferred line before
        it). Returns the record.

        Raises:
            TypeError: a field is not JSON-serialisable, or fields are given with an event object.
            ValueError: ``event`` is empty, a field is named ``ts``/``event``, or the journal is closed.
        """
        return self._write(*_split(event, fields), sync=True)

    def append_deferred(self, event: Event | str, **fields: Any) -> dict[str, Any]:
        """Like :meth:`append`, but the ``fsync`` waits for the next :meth:`sync` or :meth:`append` (group
        commit, see the module docstring). The line is written now, in call order. Same errors."""
        return self._write(*_split(event, fields), sync=False)

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

    def _write(self, event: str, fields: dict[str, Any], sync: bool) -> dict[str, Any]:
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
        return record

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


def _split(event: Event | str, fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, fields) of what :meth:`Journal.append` was given."""
    if isinstance(event, Event):
        if fields:
            raise TypeError(f"journal event {event.NAME!r} given as an object takes no more fields: {sorted(fields)}")
        rec = event.to_record()
        return rec.pop("event"), rec
    return event, fields


def iter_journal(path: str | os.PathLike, skipped: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """Yield the records of a journal file in order.

    A torn last line (no trailing newline and not valid JSON, as left by a crash mid-write) is skipped.
    A complete line that is not a JSON object with ``ts`` and ``event`` raises ValueError naming the line,
    or, when a ``skipped`` list is given, is skipped and named there (a restarted coordinator reads on).
    A run directory or a journal path may be given; a missing journal yields nothing.

    Raises:
        StatusError: the journal is a directory, cannot be read, or is not UTF-8
            (:func:`phoenix_hpc.files.read_bytes`).
    """
    p = Path(path)
    if p.is_dir():
        p = p / JOURNAL_NAME
    data = read_bytes(p, "journal", error=StatusError, allow_empty=True, missing_ok=True)
    if data is None:
        return
    decode_utf8(data[:data.rfind(b"\n") + 1], "journal", p, error=StatusError)  # a torn tail may end mid-character
    lines = data.split(b"\n")
    torn_tail = not data.endswith(b"\n")
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        last = i == len(lines) - 1
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:
            if last and torn_tail:
                return
            why = f"{p}:{i + 1}: not a JSON line: {raw[:80]!r}"
        else:
            why = None if isinstance(rec, dict) and "ts" in rec and "event" in rec \
                else f"{p}:{i + 1}: journal record needs 'ts' and 'event': {raw[:80]!r}"
        if why is None:
            yield rec
        elif skipped is None:
            raise ValueError(why)
        else:
            skipped.append(why + ": skipped")


def read_journal_skipping(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of a journal and the lines it skipped, for the readers that must not stop at a bad line:
    a restarted coordinator (:mod:`phoenix_hpc.control.restart`) and ``phoenix status``
    (:mod:`phoenix_hpc.status.collect`). One rule for both (:func:`iter_journal` with a ``skipped`` list): a
    torn last line is dropped silently; any other line that is not a JSON object with ``ts`` and ``event`` (a
    disk error, a hand edit) is skipped and named, ``"PATH:LINE: why: skipped"``, in file order.

    Raises:
        StatusError: the journal is a directory, cannot be read, or is not UTF-8 (:func:`iter_journal`).
    """
    skipped: list[str] = []
    return list(iter_journal(path, skipped=skipped)), skipped


def read_journal(path: str | os.PathLike, event: type[Event] | str | None = None) -> list[dict[str, Any]]:
    """All records of a journal (optionally only those of the event class ``event``, or of that name).

    Raises:
        EventError: ``event`` is a name no event class declares (:func:`phoenix_hpc.control.events.name_of`).
    """
    name = None if event is None else name_of(event)
    return [r for r in iter_journal(path) if name is None or r["event"] == name]
