"""Typed errors of phoenix_hpc.

Every error a user can cause derives from :class:`PhoenixError`. The CLI turns a ``PhoenixError`` into
exit code 2 and its message (never a traceback); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PhoenixError(Exception):
    """Base of all errors caused by input or environment, reported to the user without a traceback."""

    exit_code = 2


class ConfigError(PhoenixError):
    """A job config or site profile is invalid. ``problems`` lists every problem found, one string each;
    ``note``: a line printed after them (e.g. which checks have not run yet)."""

    def __init__(self, problems: list[str] | str, source: str | None = None, note: str | None = None):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        self.source = source
        self.note = note
        head = f"invalid configuration{f' in {source}' if source else ''}"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in self.problems) + (f"\n{note}" if note else ""))


class ProfileError(ConfigError):
    """A site profile cannot be found or is invalid."""


class SubmitError(PhoenixError):
    """The job could not be rendered or submitted (sbatch failed, placement impossible, ...)."""


class SlurmError(PhoenixError):
    """A Slurm command failed or returned output that could not be parsed."""


class ClusterError(PhoenixError):
    """The local test cluster cannot be started, inspected or stopped."""


class DataError(PhoenixError):
    """A dataset is missing, malformed or not a Megatron indexed dataset."""


class EngineError(PhoenixError):
    """A training engine cannot run with the given grid, device or data."""


class ReplicationError(PhoenixError):
    """Snapshot or replica handling failed (bad chunk size, not enough host memory, checksum mismatch)."""


class ReplicaDisagreement(ReplicationError):
    """The commit fence of ``step`` showed data-parallel replicas whose parameters differ (silent corruption,
    docs/design.md section 6, Replica agreement): the snapshot that would overwrite the last copy every
    replica agreed on is held instead. Every rank of the job raises it from the same fence result.

    ``step``: the first committed step found to differ; ``agreed_step``: the newest step the fences showed
    every stage in agreement before it (None: none in this generation); ``stages``: ``((pp, tp, smallest
    digest, largest digest), ...)`` of the stages that differ; ``params``: this rank's ``(step, digest)`` of
    its newest commits. ``fault_kind``: the kind it reports; ``fault_detail``: what the fault report carries
    besides (the recovery must restore a step before ``step``)."""

    fault_kind = "silent_corruption"

    def __init__(self, step: int, agreed_step: int | None, stages, params=(), held_step: int | None = None):
        self.step, self.agreed_step = int(step), agreed_step
        self.stages = tuple(tuple(x) for x in stages)
        self.params = tuple((int(s), int(d)) for s, d in params)
        where = ", ".join(f"pp={pp} tp={tp} (digests {lo:016x} .. {hi:016x})" for pp, tp, lo, hi in self.stages)
        super().__init__(
            f"silent corruption: the parameters of the data-parallel replicas differ at step {self.step} "
            f"(commit fence; {where}); "
            + (f"the snapshot that would overwrite step {held_step} is held; " if held_step is not None else "")
            + (f"the replicas last agreed at step {agreed_step}" if agreed_step is not None
               else "no earlier step of this generation was seen to agree"))

    @property
    def fault_detail(self) -> dict:
        return {"corrupt_step": self.step, "agreed_step": self.agreed_step,
                "params": [[s, f"{d:016x}"] for s, d in self.params]}


class RecoveryError(PhoenixError):
    """A recovery cannot proceed (no spare, no verified replica, invariant violated)."""


class TransportWedged(RecoveryError):
    """This process's MPI library is stuck (its H2H thread never left an MPI call after a peer died,
    :data:`phoenix_hpc.runtime.h2h.ABANDON_JOIN_S`): the slot cannot take part in another generation and
    leaves with exit code 74 (``EX_IOERR``), reporting a ``host_fault`` so that the coordinator replaces it
    at once. ``fault_kind``: the kind it reports."""

    exit_code = 74
    fault_kind = "host_fault"


class FaultError(PhoenixError):
    """A fault injection request is invalid (unknown target, unsupported phase, finished job)."""


class FaultMissed(FaultError):
    """An injection was armed by its targets but did not land (the target was lost or the job ended before
    its step): exit code 1, the request ran and its outcome is a miss, not bad input. ``outcome``: the
    summary of what landed and what was missed."""

    exit_code = 1

    def __init__(self, message: str, outcome: dict | None = None):
        super().__init__(message)
        self.outcome = outcome or {}


class ModelError(PhoenixError):
    """Invalid input to the cost model, Monte Carlo simulator or scaling fit."""


class ControlError(PhoenixError):
    """The job's coordinator cannot be reached or rejected a request (the reason is in the message)."""


class StatusError(PhoenixError):
    """A job's status cannot be shown: unknown job id, not a PHOENIX run directory, no job recorded."""


class BenchError(PhoenixError):
    """A benchmark cannot run or be computed as asked (bad option, too few samples, a job that failed)."""


class DemoError(PhoenixError):
    """The demo cannot go on: bad option, a cluster or job that did not start or end in time. ``exit_code``
    is 2 for bad input or environment, 1 when the demo ran and a check failed."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
