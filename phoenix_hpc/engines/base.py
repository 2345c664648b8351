"""The engine interface: what the PHOENIX runtime needs from a training framework.

An engine owns one rank's model chunk, its sharded optimizer and its data iterator. The runtime never looks
inside; it only uses the calls below. The per-step protocol (docs/design.md section 4) drives an engine as::

    loss = engine.forward_backward()      # step k's compute (D2H/H2H of S(k-1) overlaps this)
    engine.reduce_gradients()             # gradient sync over the DP group (reduce-scatter / all-reduce)
    # ... runtime waits for its commit here (only when resilience is enabled) ...
    engine.optimizer_step()               # -> S(k); parameters change only inside this call

so the state captured by :meth:`optimizer_shard`, :meth:`param_shard` and :meth:`envelope` is stable from
the end of ``optimizer_step`` of step k-1 until ``optimizer_step`` of step k starts.

Logical names are stable across renumbering (a spare taking a dead rank's place gets the same names):

- optimizer shard: ``opt/pp{pp}/tp{tp}/dp{dp}/{param_name}/{main|exp_avg|exp_avg_sq}`` -- fp32 tensors, the
  rank's 1/dp slice of the flat fp32 main parameters and both Adam moments (ZeRO-1 style). Each is 1-D and
  holds the part of ``param_name`` that falls in the rank's slice (a parameter cut by a slice boundary
  appears, with different elements, on two DP ranks; one that lies wholly in other slices is absent).
  Size: ``3 x 4`` bytes per element of the slice, i.e. about ``12 x N_chunk / dp`` bytes for a model chunk
  of ``N_chunk`` parameters.
- param shard: ``param/pp{pp}/tp{tp}/{param_name}`` -- the model chunk's parameters in ``model.dtype``, in
  their own shapes (``N_chunk x 4`` bytes in fp32, ``x 2`` in bf16); they are identical on every DP rank of
  the same (pp, tp), so the names carry no dp.

Implementations: :class:`phoenix_hpc.engines.torch_engine.TorchEngine` (CPU/GPU, plain PyTorch) and
:class:`phoenix_hpc.engines.megatron_engine.MegatronEngine` (CUDA, megatron-core), or a subclass of the
user's own (``engine: "package.module:Class"``, docs/engines.md; check it with :mod:`phoenix_hpc.testing`);
build one with :func:`phoenix_hpc.engines.factory.create_engine`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from phoenix_hpc.engines.styles import RECOVERY_STYLES  # noqa: F401 -- re-exported
from phoenix_hpc.topology import GridCoord  # re-exported: engines speak in grid coordinates


@dataclass(frozen=True)
class ProcessGroups:
    """The torch process groups of one rank for one generation, always passed explicitly.

    ``world`` spans the active ranks of the generation; ``dp``/``pp``/``tp`` are this rank's sub-groups.
    ``generation`` is the reconfiguration counter the groups were built under.
    """

    world: Any
    dp: Any
    pp: Any
    tp: Any
    generation: int


class Engine(abc.ABC):
    """One rank's training engine. Subclasses: the torch engine (CPU/GPU) and the Megatron engine (CUDA).

    Recovery styles (:attr:`recovery_style`; ``resilience.recovery_path`` may force ``rebuild`` for an engine
    that supports both):

    - ``rebind``: a survivor keeps its engine object and calls :meth:`rebind` with the new generation's
      groups; only a joining spare constructs an engine, so construction must run no collective.
    - ``rebuild``: for engines that keep global state (Megatron's ``parallel_state``). In the new generation
      every member, survivors and joining spares together, calls :meth:`teardown` on its old engine (if any)
      and then constructs a new one, in lockstep: each collective of construction is entered by every member
      of the generation in the same order. Survivors then load S(R) from their own host copy; spares take
      parameters from a DP peer and the optimizer shard from a replica, as in ``rebind``.

    Groups (:attr:`owns_groups`): ``False`` -- the launcher builds ``world``/``dp``/``pp``/``tp`` of every
    generation and passes them to the constructor; ``True`` -- the launcher builds only the generation's
    default (world) group and passes ``ProcessGroups(world, None, None, None, g)``; the constructor creates
    the dp/pp/tp groups itself (Megatron: ``initialize_model_parallel``) and exposes the complete set as
    :attr:`groups`, which the runtime then uses for everything (no duplicate groups).
    """

    coord: GridCoord
    step: int  # number of optimizer steps completed; S(step) is the current state
    groups: ProcessGroups | None

    #: ``"rebind"`` or ``"rebuild"`` (see the class docstring); the style this engine needs by default.
    recovery_style: ClassVar[str] = "rebind"
    #: Styles this engine supports; ``resilience.recovery_path`` must name one of them.
    supported_recovery_styles: ClassVar[tuple[str, ...]] = ("rebind",)
    #: ``True`` when the constructor creates the dp/pp/tp groups itself (see the class docstring).
    owns_groups: ClassVar[bool] = False
    #: ``True`` when the engine can be built with a dp below the configured one and implements
    #: ``optimizer_numel()``, ``optimizer_shard_layout(dp_index, dp_size)`` and
    #: ``load_resharded_optimizer(old, old_dp)`` (a shrink, docs/design.md section 6; also a persistent
    #: checkpoint written at another dp, :func:`phoenix_hpc.recovery.checkpoint.load_checkpoint`); the
    #: coordinator never plans a shrink for other engines (spares exhausted: the job stops as before).
    supports_shrink: ClassVar[bool] = False

    # --- the step, split where the runtime has to act -------------------------------------------------
    @abc.abstractmethod
    def forward_backward(self) -> float | None:
        """Run the forward and backward passes of step ``self.step + 1`` over all its micro-batches.

        Returns the mean loss of the step on the last pipeline stage, ``None`` on other stages.
        Raises whatever the framework raises (collective timeouts, CUDA errors); the caller classifies.
        """

    @abc.abstractmethod
    def reduce_gradients(self) -> None:
        """Synchronise gradients over the DP group (reduce-scatter or all-reduce)."""

    @abc.abstractmethod
    def optimizer_step(self) -> None:
        """Apply the update of the rank's optimizer shard, publish updated parameters to DP peers, and
        advance ``self.step`` and the LR schedule."""

    def evaluate(self, position: int, iters: int) -> float | None:
        """The mean loss (nats/token) of the current parameters over ``iters`` global batches of the
        validation part of ``data.split``, starting at its global sample position ``position``; each DP rank
        reads its run of each batch as in training. Forward only: no gradient, dropout off (eval mode, then
        back to train mode), no RNG drawn, and no state changes (step, data position, optimizer). Collective
        over the generation (every member calls it at the same step). Returns the loss, averaged over the DP
        group, on the last pipeline stage; None elsewhere.

        Raises:
            EngineError: this engine does not implement evaluation (the default).
            DataError: the data has no validation part.
        """
        from phoenix_hpc.errors import EngineError

        raise EngineError(f"engine {type(self).__name__} does not implement evaluate() (training.eval_interval "
                          "needs it; allowed with this engine: eval_interval null)")

    # --- the state the runtime protects -----------------------------------------------------------
    @abc.abstractmethod
    def optimizer_shard(self) -> list[tuple[str, torch.Tensor]]:
        """The rank's optimizer shard as ``(logical name, tensor)`` pairs, fp32, 1-D, in a fixed order.

        Returned tensors are the live storage (no copy); the runtime copies them. Includes fp32 main
        params. Together the shards of all DP ranks of one (pp, tp) cover every parameter exactly once.
        """

    @abc.abstractmethod
    def param_shard(self) -> list[tuple[str, torch.Tensor]]:
        """The model chunk's parameters as ``(logical name, tensor)`` pairs (live storage, model dtype)."""

    @abc.abstractmethod
    def envelope(self) -> dict[str, Any]:
        """The metadata envelope as a JSON-serialisable dict: ``step``, ``coord``, RNG states of every
        generator in use (base64 strings), LR-scheduler state, data-iterator position, loss-scaler state."""

    @abc.abstractmethod
    def load_optimizer_shard(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy a saved optimizer shard (names as from :meth:`optimizer_shard`) into the live state.

        Raises:
            EngineError: a name is missing or unexpected, or a shape/dtype does not match.
        """

    @abc.abstractmethod
    def load_param_shard(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy saved parameters (names as from :meth:`param_shard`) into the model.

        Raises:
            EngineError: a name is missing or unexpected, or a shape/dtype does not match.
        """

    @abc.abstractmethod
    def load_envelope(self, envelope: dict[str, Any]) -> None:
        """Restore step counter, RNG states, LR schedule, data position and loss scaler from an envelope."""

    def rebind(self, groups: ProcessGroups, coord: GridCoord) -> None:
        """Use new process groups (a new generation after a reconfiguration); model and optimizer state
        stay as they are. Engines whose :attr:`supported_recovery_styles` include ``rebind`` implement it;
        the recovery protocol never calls it on the others.

        Raises:
            EngineError: this engine does not support ``rebind`` (the default).
        """
        from phoenix_hpc.errors import EngineError

        raise EngineError(
            f"engine {type(self).__name__} recovers by {self.recovery_style!r} only "
            f"(supported: {list(self.supported_recovery_styles)}); rebind is not one of them"
        )

    def release_groups(self) -> None:
        """Drop every reference this engine holds to its process groups (after a fault, before
        :meth:`rebind`), so that a destroyed gloo group is freed and its connections close at once. The
        engine cannot run a step until :meth:`rebind`. The default holds no references of its own."""

    def teardown(self) -> None:
        """End this engine for good before a new one is constructed in the same process (the ``rebuild``
        recovery path, or the end of the job): drop the model, optimizer, data iterator and groups, and
        clear any global state the constructor set up (Megatron: ``parallel_state.destroy_model_parallel()``,
        after which ``model_parallel_is_initialized()`` is false). Must run no collective (peers may be dead)
        and must not destroy communicators that may contain a dead peer (the launcher aborts those).
        Idempotent. The default calls :meth:`release_groups`."""
        self.release_groups()

    def state_hash(self) -> str:
        """SHA-256 hex digest over this rank's param shard and optimizer shard (names, dtypes, bytes), in
        name order (:func:`tensors_digest`). The correctness oracle compares these across runs."""
        return tensors_digest(self.param_shard() + self.optimizer_shard())


def tensors_digest(pairs: list[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 hex digest over ``(name, dtype, bytes)`` of named tensors, in name order (no copy kept)."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(pairs, key=lambda x: x[0]):
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
