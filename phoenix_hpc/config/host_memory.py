"""Host memory PHOENIX holds per node, planned at submit, and the budget it must fit in (pure).

Per rank (docs/design.md section 4; :mod:`phoenix_hpc.runtime.buffers` allocates exactly these)::

    M = 2 x snapshot + 2k x optimizer shard
    snapshot = parameters of the rank x bytes of model.dtype + optimizer shard
    optimizer shard = 12 x parameters of the rank / dp   (fp32 main parameters, exp_avg, exp_avg_sq; ZeRO-1)

for the pipeline stage with the most parameters (:func:`phoenix_hpc.config.memory.stage_params`; the first
or last stage, which hold the embeddings). The small header and index of each buffer are left out. With the
plain ring placement every rank holds exactly ``k`` replicas; with failure-domain constraints a rank may hold
up to ``2k`` (docs/design.md section 5), which this plan does not count. Per node: ``ranks_per_node x M``.

The budget per node: ``0.9 x (node.mem_gb - node.host_reserved_gb - ranks_per_node x node.host_per_rank_gb)``
-- the site profile's host memory minus the headroom for the OS and for each rank's own process (Python,
torch, CUDA context, NCCL/MPI buffers, data loaders, pinned staging), of which the rank's own start-up check
keeps 10 % free (``check_host_memory``'s ``reserve_fraction``). Over the budget: submit refuses the job;
above :data:`CLOSE_FRACTION` of it: a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from phoenix_hpc.config.memory import _BYTES, GB, stage_params

#: the rank's own start-up check keeps this fraction of MemAvailable free (runtime.buffers.check_host_memory)
RESERVE_FRACTION = 0.1
#: a plan above this fraction of the budget is "close": submit warns
CLOSE_FRACTION = 0.8


def _size(b: float) -> str:
    """Bytes as GB (1e9) from 1 GB up, else MB (1e6)."""
    return f"{b / GB:.2f} GB" if b >= GB else f"{b / 1e6:.2f} MB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


@dataclass(frozen=True)
class HostMemoryPlan:
    """Planned host memory in bytes: ``per_rank`` = 2 x ``snapshot`` + 2k x ``optimizer_shard``; ``per_node``
    = ``ranks_per_node`` x ``per_rank``; ``budget`` (None: the site gives no ``node.mem_gb``) and its parts
    in GB as the profile states them."""

    stage: int
    params: int  # parameters of one rank of that stage
    k: int
    snapshot: float
    optimizer_shard: float
    ranks_per_node: int
    mem_gb: int | None
    reserved_gb: float
    per_rank_process_gb: float

    @property
    def per_rank(self) -> float:
        return 2 * self.snapshot + 2 * self.k * self.optimizer_shard

    @property
    def per_node(self) -> float:
        return self.ranks_per_node * self.per_rank

    @property
    def budget(self) -> float | None:
        """Bytes PHOENIX may use per node (module doc); None without ``node.mem_gb``."""
        if self.mem_gb is None:
            return None
        free = self.mem_gb - self.reserved_gb - self.ranks_per_node * self.per_rank_process_gb
        return max(0.0, (1.0 - RESERVE_FRACTION) * free * GB)

    def summary(self) -> str:
        """One line: per node = ranks x (2 x snapshot + 2k x shard), against the budget."""
        head = (f"{_size(self.per_node)} per node = {self.ranks_per_node} rank(s) x (2 x snapshot "
                f"{_size(self.snapshot)} + 2 x k({self.k}) x optimizer shard {_size(self.optimizer_shard)}) "
                f"(pipeline stage {self.stage}, {_count(self.params)} parameters per rank)")
        if self.budget is None:
            return head + "; not checked: the site sets no node.mem_gb"
        return (head + f"; budget {self.budget / GB:.1f} GB = 0.9 x ({self.mem_gb} GB node.mem_gb - "
                f"{self.reserved_gb:g} GB node.host_reserved_gb - {self.ranks_per_node} x "
                f"{self.per_rank_process_gb:g} GB node.host_per_rank_gb)")


def plan_host_memory(cfg, dp: int, ranks_per_node: int, node) -> HostMemoryPlan:
    """The plan for job config ``cfg`` (built-in model: ``cfg.model``, ``cfg.parallelism``,
    ``cfg.resilience.k``) with data-parallel size ``dp`` and ``ranks_per_node`` slots per node, against site
    ``node`` (:class:`phoenix_hpc.profiles.model.NodeProfile`): the stage whose per-rank total is largest."""
    m, p, k = cfg.model, cfg.parallelism, cfg.resilience.k
    e = _BYTES[m.dtype]
    best: HostMemoryPlan | None = None
    for stage in range(p.pp):
        n = stage_params(m, p.pp, stage, p.tp)
        shard = 12.0 * n / dp
        plan = HostMemoryPlan(stage=stage, params=n, k=k, snapshot=n * e + shard, optimizer_shard=shard,
                              ranks_per_node=ranks_per_node, mem_gb=node.mem_gb, reserved_gb=node.host_reserved_gb,
                              per_rank_process_gb=node.host_per_rank_gb)
        if best is None or plan.per_rank > best.per_rank:
            best = plan
    assert best is not None
    return best


def host_memory_advice(cfg, dp: int) -> str:
    """What to change to hold less host memory per node, from the options that can still move."""
    out = []
    if cfg.resilience.k > 1:
        out.append(f"a lower resilience.k (now {cfg.resilience.k}; each replica fewer saves 2 optimizer shards per "
                   "rank)")
    out.append("a larger parallelism.tp or parallelism.pp (fewer parameters per rank)")
    out.append(f"more resources.nodes (a larger dp than {dp}: smaller optimizer shards)")
    return ", ".join(out[:-1]) + ", or " + out[-1]


def host_memory_check(plan: HostMemoryPlan, cfg, dp: int, site: str) -> tuple[str | None, str | None]:
    """``(problem, warning)`` for ``plan``: a problem when it exceeds the budget, a warning when it is above
    :data:`CLOSE_FRACTION` of it; both None when it fits or cannot be checked. Pure."""
    budget = plan.budget
    if budget is None:
        return None, None
    if plan.per_node > budget:
        return (f"host memory: PHOENIX would hold {plan.summary()}: more than the budget on site {site}; to fit, "
                f"use {host_memory_advice(cfg, dp)}"), None
    if plan.per_node > CLOSE_FRACTION * budget:
        return None, (f"host memory: PHOENIX would hold {_size(plan.per_node)} per node, "
                      f"{plan.per_node / budget:.0%} of the {budget / GB:.1f} GB budget on site {site} (close: the "
                      f"training's own host memory varies); {plan.summary()}")
    return None, None
