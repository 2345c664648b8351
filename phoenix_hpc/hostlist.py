"""Slurm hostlists (``nid[00001-00004,00007]``) through python-hostlist, and the active/spare split (pure).

The split follows the job's node order as Slurm reports it (``SLURM_JOB_NODELIST`` / ``scontrol show job``
``NodeList``, which is sorted): the first ``nodes`` nodes hold active slots, the rest are spares. This matches
``SLURM_NODEID < nodes`` in the rank launcher, because srun numbers nodes in the same sorted order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import hostlist as _hl

from phoenix_hpc.errors import SlurmError


def expand(nodelist: str) -> list[str]:
    """``"nid[00001-00003]"`` -> ``["nid00001", "nid00002", "nid00003"]`` (order kept, duplicates removed).

    Raises:
        SlurmError: ``nodelist`` is not a valid hostlist.
    """
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    try:
        return _hl.expand_hostlist(nodelist)
    except _hl.BadHostlist as exc:
        raise SlurmError(f"bad Slurm hostlist {nodelist!r}: {exc}") from None


_NAME_CHARS = re.compile(r"^[A-Za-z0-9_.-]*$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _terms(text: str) -> list[str]:
    """The top-level comma-separated terms of a hostlist (commas inside brackets separate ranges)."""
    out, depth, cur = [], 0, ""
    for c in text:
        if c == "," and depth == 0:
            out.append(cur)
            cur = ""
            continue
        depth += 1 if c == "[" else -1 if c == "]" else 0
        cur += c
    return [*out, cur]


def _term_problem(term: str) -> str | None:
    """Why Slurm refuses one hostlist term (``nid[001-004]``, ``a[1-2]b[3-4]``), or None."""
    if not term:
        return "an empty host name (two commas in a row, or a comma at an end)"
    depth, last_close = 0, -1
    for i, c in enumerate(term):
        if c == "[":
            if depth:
                return f"{term!r} opens a bracket inside a bracket"
            depth = 1
        elif c == "]":
            if not depth:
                return f"{term!r} closes a bracket it did not open"
            depth, last_close = 0, i
    if depth:
        return f"{term!r} opens a bracket it does not close"
    if last_close >= 0 and last_close != len(term) - 1:
        # Slurm's hostlist.c: after the last ']' only ',' or the end may follow
        return f"{term!r} has text after its last ']' ({term[last_close + 1:]!r}), which Slurm does not accept"
    for part in re.split(r"\[[^\]]*\]", term):
        if not _NAME_CHARS.match(part):
            return f"{term!r} holds characters not allowed in a host name (letters, digits, '-', '_', '.')"
    for body in re.findall(r"\[([^\]]*)\]", term):
        for rng in body.split(","):
            m = _RANGE.match(rng)
            if m is None:
                return f"{term!r}: range {rng!r} is not N or N-M with decimal numbers"
            if m.group(2) is not None and int(m.group(2)) < int(m.group(1)):
                return f"{term!r}: range {rng!r} is reversed (the first number must not exceed the second)"
    return None


def check_hostlist(text: str, option: str) -> list[str]:
    """Parse a hostlist a user typed (``--nodelist``/``--exclude``) as Slurm would and return its host names.

    The names come from python-hostlist (:func:`expand`, the parser used everywhere in phoenix_hpc); what
    Slurm's own parser (``hostlist.c``, as ``sbatch -w`` and ``scontrol show hostnames`` use it) refuses
    but python-hostlist would read some way is refused too: unbalanced or nested brackets, text after the
    last ``]`` of a term (``nid[1-3]x``), reversed ranges (``nid[3-1]``), empty ranges or names, and
    characters that are not part of host names.

    Raises:
        ConfigError: naming ``option``, the value and the problem.
    """
    from phoenix_hpc.errors import ConfigError

    allowed = "a Slurm hostlist such as nid[00001-00004,00007] or nid00001,nid00002"
    if not text or not text.strip():
        raise ConfigError(f"{option}: value {text!r} is empty; expected {allowed}")
    for term in _terms(text):
        why = _term_problem(term)
        if why is not None:
            raise ConfigError(f"{option}: value {text!r} is not a valid hostlist: {why}; expected {allowed}")
    try:
        names = expand(text)
    except SlurmError as exc:
        raise ConfigError(f"{option}: value {text!r} is not a valid hostlist ({exc}); expected {allowed}") from None
    if not names:
        raise ConfigError(f"{option}: value {text!r} names no host; expected {allowed}")
    return names


def compress(nodes: list[str]) -> str:
    """``["nid00001", "nid00002"]`` -> ``"nid[00001-00002]"`` (sorted, as Slurm prints it)."""
    return _hl.collect_hostlist(list(nodes)) if nodes else ""


@dataclass(frozen=True)
class NodeSplit:
    """The nodes of a job divided into active nodes (first ``nodes``) and spares (the rest)."""

    active: tuple[str, ...]
    spare: tuple[str, ...]


def split_active_spare(nodelist: str | list[str], nodes: int) -> NodeSplit:
    """Split a job's node list into ``nodes`` active nodes and the spares.

    Raises:
        SlurmError: the list has fewer than ``nodes`` nodes, or ``nodes`` < 1.
    """
    names = expand(nodelist) if isinstance(nodelist, str) else list(nodelist)
    if nodes < 1 or len(names) < nodes:
        raise SlurmError(f"cannot take {nodes} active nodes from {len(names)} nodes ({compress(names)})")
    return NodeSplit(active=tuple(names[:nodes]), spare=tuple(names[nodes:]))
