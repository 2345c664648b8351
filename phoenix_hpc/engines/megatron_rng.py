"""The Megatron engine's dropout random state: reseeded at the start of every step, a pure function of
``(training seed, step, pipeline stage, DP rank)``.

megatron-core draws dropout masks from two CUDA random states (``megatron/core/tensor_parallel/random.py``):
torch's default CUDA generator (dropout outside tensor-parallel regions, e.g. on the residual branches, the
same on every TP rank of a DP replica), and the ``model-parallel-rng`` state of its CUDA RNG tracker
(dropout inside tensor-parallel regions, e.g. on a TP rank's attention heads, and everything under
sequence parallelism; the tracker's state is ``seed + 2718 + tp rank``). ``model_parallel_cuda_manual_seed(seed)``
resets the tracker and sets both (and the expert-parallel state), as Megatron-LM's ``_set_random_seed`` does
once at start. The engine calls it before every step's forward passes with :func:`step_seed` (:func:`reseed`):
so the masks of step ``n`` are the same in the first try and in a replay after any recovery (a hot swap onto
a spare, a rebuild), whatever random state the replaying process had; no random state has to travel in a
snapshot. The seed leaves the TP rank out on purpose: the default generator must agree over the TP ranks of
a replica (they hold the same activations outside tensor-parallel regions), and megatron-core adds the TP
rank to the tracker's state itself. The DP rank is in it, so DP replicas (which read other samples) draw
independent masks (Megatron-LM's default gives every DP rank the same seed).
"""

from __future__ import annotations

import numpy as np

#: Bits of :func:`step_seed`: below ``2**62``, so megatron-core's offsets (``+ 2718 + tp rank``, ``+ 1024 +
#: 100 x ep rank + etp rank``) stay below ``2**63`` (torch seeds are 64-bit).
SEED_BITS = 62


def step_seed(seed: int, step: int, pp: int, dp: int) -> int:
    """The seed of step ``step``'s dropout masks (the step being computed, 1-based: the first step is 1) on
    pipeline stage ``pp`` of DP replica ``dp``: the top :data:`SEED_BITS` bits of numpy's
    ``SeedSequence([seed, step, pp, dp])`` (a hash of the four; pure). Raises ValueError for a negative
    input (``SeedSequence`` takes non-negative integers)."""
    if min(seed, step, pp, dp) < 0:
        raise ValueError(f"step_seed: seed, step, pp, dp must be >= 0, got {(seed, step, pp, dp)}")
    state = np.random.SeedSequence([int(seed), int(step), int(pp), int(dp)]).generate_state(1, np.uint64)[0]
    return int(state >> (64 - SEED_BITS))


def reseed(tensor_parallel, seed: int, step: int, pp: int, dp: int) -> int:
    """Set megatron-core's dropout random states for step ``step``: ``tensor_parallel.model_parallel_cuda_manual_seed``
    (``tensor_parallel``: the ``megatron.core.tensor_parallel`` module) with :func:`step_seed`, which resets the
    CUDA RNG tracker and seeds torch's default CUDA generator of the current device. Parallel state must be
    initialised (megatron-core reads the TP rank). Returns the seed."""
    s = step_seed(seed, step, pp, dp)
    tensor_parallel.model_parallel_cuda_manual_seed(s)
    return s
