"""Who a restarted coordinator takes back: the pure rule for a slot that re-registers with ``rejoin``."""

from __future__ import annotations

from phoenix_hpc.control.view_records import SlotView


def rejoin_verdict(slot: SlotView | None, pid: int, role: str, logical_rank: int | None,
                   generation: int | None, job_generation: int) -> str | None:
    """Whether a re-registering slot (``register`` with ``rejoin``) is taken back: None when it is, else the
    reason it is refused. ``slot``: the slot as the coordinator knows it (rebuilt from the journal by
    :func:`phoenix_hpc.control.view.fold`), None if unknown. A slot is taken back only as the same process
    (pid) the journal knows, not declared dead, holding the logical rank the journal gives it, at a generation
    not newer than the job's. Pure."""
    if slot is None:
        return "the journal has no registration of this world rank in this job"
    if slot.state == "dead":
        return "it was declared dead; a fenced slot cannot rejoin"
    if slot.pid != pid:
        return f"registered pid is {slot.pid}, this is pid {pid}"
    if role == "active" and slot.logical_rank is not None and logical_rank is not None \
            and int(logical_rank) != slot.logical_rank:
        return f"it holds logical rank {logical_rank}, the journal says {slot.logical_rank}"
    if generation is not None and int(generation) > job_generation:
        return f"its generation {generation} is newer than the job's ({job_generation})"
    return None
