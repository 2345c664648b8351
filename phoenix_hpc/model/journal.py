"""Read measured recoveries from a PHOENIX run journal.

The journal is the JSON-lines file ``journal.jsonl`` in a run directory (docs/design.md section 7): one JSON
object per line with at least ``{"ts": float, "event": str}``. A finished recovery is recorded as::

    {"ts": ..., "event": "recovery_done", "total_s": float,
     "phases": {"detect": s, "reconfigure": s, "params": s, "optimizer": s, "replay": s},
     "steps_replayed": int}

Only ``recovery_done`` records are read; every other event is ignored. A last line without a trailing
newline that does not parse is skipped (the coordinator may be appending it); any other malformed line is an
error.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from phoenix_hpc.errors import ModelError
from phoenix_hpc.files import read_text

JOURNAL_NAME = "journal.jsonl"
PHASES = ("detect", "reconfigure", "params", "optimizer", "replay")


def journal_path(path: str | Path, option: str = "--journal") -> Path:
    """``path`` itself if it is a file, ``path/journal.jsonl`` if it is a run directory.

    Raises ModelError (naming ``option``, the command's option that gave ``path``) if neither exists.
    """
    p = Path(path)
    if p.is_dir():
        p = p / JOURNAL_NAME
    if not p.exists():
        raise ModelError(f"{option}: {str(path)!r} is not allowed; expected a run directory holding "
                         f"{JOURNAL_NAME} or a journal file")
    return p


def read_recoveries(path: str | Path, field: str = "total", option: str = "--journal") -> list[float]:
    """Recovery times in seconds from the ``recovery_done`` records of a journal, in file order.

    ``field`` is ``total`` (the record's ``total_s``) or one of :data:`PHASES` (``phases[field]``); ``option``
    names where ``path`` came from in the errors.

    Raises ModelError if the file is missing, a line is not JSON (except a partial last line), or a
    ``recovery_done`` record lacks the field or holds a negative / non-finite time.
    """
    if field != "total" and field not in PHASES:
        raise ModelError(f"--phase: {field!r} is not allowed; expected total or one of {', '.join(PHASES)}")
    p = journal_path(path, option)
    text = read_text(p, "journal", error=ModelError, allow_empty=True)
    lines = text.split("\n")
    out: list[float] = []
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if no == len(lines):  # partial last line being appended
                continue
            raise ModelError(f"{option}: {str(p)!r} line {no} is not valid JSON; expected one JSON object "
                             "per line") from None
        if not isinstance(rec, dict) or rec.get("event") != "recovery_done":
            continue
        try:
            value = rec["total_s"] if field == "total" else rec["phases"][field]
            value = float(value)
        except (KeyError, TypeError, ValueError):
            key = "total_s" if field == "total" else f"phases.{field}"
            raise ModelError(f"{option}: {str(p)!r} line {no}: recovery_done record has no numeric {key}") \
                from None
        if not math.isfinite(value) or value < 0:
            raise ModelError(f"{option}: {str(p)!r} line {no}: time {value!r} is not allowed; must be >= 0 s")
        out.append(value)
    return out
