"""The one place the coordinator records an event: its journal line, then the same record applied to the
job's view (:func:`phoenix_hpc.control.view.fold`), so the running coordinator holds the journal's fold.

:class:`Recorder` owns the journal (:class:`~phoenix_hpc.control.journal.Journal`) and the view
(:class:`~phoenix_hpc.control.view.JobView`). :meth:`Recorder.append` writes the line and applies the record
*as it reads back* (a JSON round trip: tuples become lists, keys strings), so that after every append the view
equals ``fold(iter_journal(run_dir))`` of the records written since the view was taken: for a restarted
coordinator the whole journal (:meth:`Recorder.open` folds what is there), for a job's first coordinator its
own records (its ``coordinator_started`` drops an earlier job of the run anyway; only ``view.skipped`` would
name that job's bad lines). A record the fold cannot take is named in ``view.skipped``, as the fold does;
the journal line is written first in any case.
"""

from __future__ import annotations

import json
from typing import Any

from phoenix_hpc.control.events import Event
from phoenix_hpc.control.journal import Journal, line_namer, read_journal_numbered
from phoenix_hpc.control.view import JobView, fold


class Recorder:
    """The coordinator's journal and the view its records fold to. Single-threaded (the coordinator's loop).

    ``journal``: None until :meth:`open` (or a test sets it); ``view``: the fold so far; ``records``: how many
    records the view took; ``lines``: the journal's line the last one is on (a record the fold skips is named
    in :attr:`JobView.skipped` by its ``PATH:LINE``, as ``phoenix status`` names it)."""

    def __init__(self) -> None:
        self.journal: Journal | None = None
        self.view = JobView()
        self.records = 0
        self.lines = 0
        self._opened: list[dict[str, Any]] = []  # the records open() folded, until take_opened()

    def open(self, journal: Journal, *, fold_existing: bool) -> None:
        """Take ``journal``; with ``fold_existing`` (a restarted coordinator), start the view from the fold of
        the records already in it (a line that is no record is named in ``view.skipped``).

        Raises:
            StatusError: the journal cannot be read (:func:`~phoenix_hpc.control.journal.read_journal_skipping`).
        """
        self.journal, self.view, self.records, self.lines, self._opened = journal, JobView(), 0, 0, []
        if fold_existing and journal.path.exists():
            read = read_journal_numbered(journal.path)  # a bad line is skipped and named, never fatal
            self.view = fold(read.records, JobView(skipped=list(read.skipped)), where=line_namer(read))
            self.records, self.lines, self._opened = len(read.records), read.line_count, read.records

    def take_opened(self) -> list[dict[str, Any]]:
        """The records :meth:`open` folded (the journal as the restarted coordinator found it, lines that are no
        record left out), handed over once: the caller that rebuilds more than the view from them
        (:func:`phoenix_hpc.control.restart.rebuild_from_journal`) does not read the journal a second time, and
        the recorder does not keep them. Empty without ``fold_existing`` and on a second call."""
        out, self._opened = self._opened, []
        return out

    def append(self, event: Event, *, deferred: bool = False) -> dict[str, Any]:
        """Journal ``event`` (:meth:`Journal.write`: synced, or deferred to the batch's fsync with ``deferred``),
        then apply its record to :attr:`view`. Returns the record. Raises what the journal raises."""
        rec, text = self.journal.write(event, sync=not deferred)
        self.records += 1
        self.lines += 1
        path, line = self.journal.path, self.lines
        # the record as a reader reads the line back (tuples become lists, keys strings), decoded from the
        # line written: encoding the record a second time cost a 16k-rank job's commit record 40 ms
        self.view = fold([json.loads(text)], self.view, start=self.records, where=lambda _n, _r: f"{path}:{line}")
        return rec
