"""Slurm time-limit strings <-> seconds (pure).

Accepted forms are those of ``sbatch --time`` (sbatch(1), option ``-t``): ``minutes``, ``minutes:seconds``,
``hours:minutes:seconds``, ``days-hours``, ``days-hours:minutes`` and ``days-hours:minutes:seconds``.
``UNLIMITED``/``INFINITE`` are not accepted for jobs: a resilient job needs a known end to signal before it.
"""

from __future__ import annotations

import re

_DAYS = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$")
_PLAIN = re.compile(r"^(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_slurm_time(text: str) -> int:
    """Seconds in a Slurm time limit such as ``"00:30:00"``, ``"90"`` (minutes) or ``"2-00:00:00"``.

    Raises:
        ValueError: ``text`` is not one of the sbatch ``--time`` forms, or is zero.
    """
    s = str(text).strip()
    m = _DAYS.match(s)
    if m:
        d, h, mi, se = (int(g) if g else 0 for g in m.groups())
        total = ((d * 24 + h) * 60 + mi) * 60 + se
    else:
        m = _PLAIN.match(s)
        if not m:
            raise ValueError(
                f"{text!r} is not a Slurm time limit (use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)"
            )
        parts = [int(g) for g in m.groups() if g is not None]
        if len(parts) == 1:
            total = parts[0] * 60
        elif len(parts) == 2:
            total = parts[0] * 60 + parts[1]
        else:
            total = (parts[0] * 60 + parts[1]) * 60 + parts[2]
    if total <= 0:
        raise ValueError(f"time limit {text!r} must be longer than zero")
    return total


def format_slurm_time(seconds: int) -> str:
    """``seconds`` as ``[D-]HH:MM:SS`` (the form ``squeue``/``scontrol`` print)."""
    if seconds < 0:
        raise ValueError(f"negative duration {seconds}")
    d, rem = divmod(int(seconds), 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"
