"""Slurm hostlists (``nid[00001-00004,00007]``) through python-hostlist, and the active/spare split (pure).

The split follows the job's node order as Slurm reports it (``SLURM_JOB_NODELIST`` / ``scontrol show job``
``NodeList``, which is sorted): the first ``nodes`` nodes hold active slots, the rest are spares. This matches
``SLURM_NODEID < nodes`` in the rank launcher, because srun numbers nodes in the same sorted order.
"""

from __future__ import annotations

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
