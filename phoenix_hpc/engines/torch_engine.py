"""The ``torch`` engine: GPT decoder in plain PyTorch, pipeline over pp, ZeRO-1 AdamW over dp (CPU or GPU).

One rank holds pipeline stage ``coord.pp`` of the model (:mod:`.torch_gpt`, or the module that
``model.factory`` builds, see :mod:`.custom_model`), a :class:`~.zero.ShardedAdamW` over its DP group, and
reads its share of each step's global batch from a Megatron indexed dataset
(:class:`phoenix_hpc.data.indexed.TokenSamples`) or the ``data.factory`` dataset
(:class:`.custom_model.FactorySamples`).

Batching: a step consumes ``global_batch_size`` samples at global data positions
``[step * G, (step + 1) * G)``; DP rank ``d`` takes ``G / dp`` consecutive positions starting at
``step * G + d * G / dp``, as ``n_micro = G / (micro_batch_size * dp)`` micro-batches. After a shrink
(docs/design.md section 6) ``G`` may not divide over the smaller dp: the ``M = G / micro_batch_size``
micro-batches are then dealt out in order, the first ``M mod dp`` DP ranks taking one more
(:func:`micro_split`), and each micro-batch's loss is scaled so that the reduced gradient is the same sum
over the same samples divided by ``M`` (the mean over the global batch). The data-iterator position in the
envelope is the global position of the next step (``step * G``).

Determinism: parameters start from a seed-derived init (identical on every DP peer), the model has no
dropout, the data order is a pure function of (seed, position), every collective runs over a fixed group
in a fixed order, and ``torch.use_deterministic_algorithms`` is on. Two runs of the same grid give
bit-identical parameters and optimizer state (checked by the tests; different grids give different
floating-point summation orders and therefore different bits).

Recovery: both styles (docs/design.md section 6). ``rebind`` keeps the engine and swaps its groups;
``rebuild`` ends it with :meth:`TorchEngine.teardown` and constructs a new one, whose state after
loading a param shard, an optimizer shard and an envelope is the saved state exactly: construction runs no
collective, is a pure function of the config and the coordinate, and the only global state it touches,
torch's default generator (module constructors draw from it before the seeded init overwrites every
parameter), is set again by :meth:`TorchEngine.load_envelope`.

Tensor parallelism is not implemented in this engine (``tp`` must be 1; use the ``megatron`` engine).
``model.dtype`` float32 or bfloat16 (no loss scaling needed); float16 needs the megatron engine's loss
scaler.
"""

from __future__ import annotations

import base64
from typing import Any

import torch
import torch.distributed as dist

from phoenix_hpc.engines.base import Engine, GridCoord, ProcessGroups
from phoenix_hpc.engines.schedule import lr_for, scheduler_record
from phoenix_hpc.engines.styles import ENGINE_RECOVERY_STYLES
from phoenix_hpc.engines.torch_dtypes import TORCH_ENGINE_DTYPES
from phoenix_hpc.engines.torch_gpt import GPTShape, GPTStage, empty_stage, lm_loss
from phoenix_hpc.engines.zero import KINDS, ShardedAdamW, flat_pieces
from phoenix_hpc.errors import ConfigError, EngineError

ENVELOPE_FORMAT = 1
_DTYPES = {name: getattr(torch, name) for name in TORCH_ENGINE_DTYPES}


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def micro_split(global_batch: int, micro_batch: int, dp: int, dp_rank: int) -> tuple[int, int]:
    """``(first micro-batch, micro-batches)`` of DP rank ``dp_rank`` when the ``M = G / mbs`` micro-batches
    of a step are dealt out over ``dp`` ranks in order, the first ``M mod dp`` ranks taking one more. With
    ``G`` a multiple of ``mbs * dp`` every rank takes ``G / (mbs * dp)``, as :func:`micro_batches`.

    Raises:
        EngineError: ``global_batch`` is not a multiple of ``micro_batch``, or some rank would get none.
    """
    if global_batch % micro_batch:
        raise EngineError(f"training.global_batch_size ({global_batch}) must be a multiple of "
                          f"training.micro_batch_size ({micro_batch})")
    m = global_batch // micro_batch
    if m < dp:
        raise EngineError(f"{m} micro-batches per step cannot be dealt out over dp = {dp} ranks")
    q, extra = divmod(m, dp)
    return dp_rank * q + min(dp_rank, extra), q + (1 if dp_rank < extra else 0)


def micro_batches(global_batch: int, micro_batch: int, dp: int) -> int:
    """Micro-batches per step per DP rank, ``G / (mbs * dp)``.

    Raises:
        EngineError: ``global_batch`` is not a multiple of ``micro_batch * dp``.
    """
    if global_batch % (micro_batch * dp):
        raise EngineError(
            f"training.global_batch_size ({global_batch}) must be a multiple of training.micro_batch_size "
            f"({micro_batch}) x dp ({dp}) = {micro_batch * dp}"
        )
    return global_batch // (micro_batch * dp)


class TorchEngine(Engine):
    """See the module docstring.

    Args:
        cfg: the job config (:class:`phoenix_hpc.config.schema.JobConfig`).
        coord: this rank's grid coordinate; ``groups``: its process groups (dp/pp groups ordered by
            coordinate; sizes are read from them).
        samples: the dataset reader (:class:`~phoenix_hpc.data.indexed.TokenSamples` or
            :class:`~.custom_model.FactorySamples`: ``batch(position, count) -> (inputs, targets)``).
        device: where the model lives (default CPU).
        state_follows: the caller loads every parameter before the first step (a joining spare, a member
            rebuilt in a recovery): the built-in GPT is then allocated without its random initialisation
            (:func:`.torch_gpt.empty_stage`); a ``model.factory`` module is built as always. Until
            :meth:`load_param_shard` or :meth:`params_from_optimizer` has run, :meth:`forward_backward`
            raises EngineError instead of training on uninitialised memory.

    Raises:
        EngineError: tp != 1, float16, a batch size that does not split over dp, or a group size that
            does not match the config.
        ConfigError: ``model.factory`` fails or its module is malformed (see :mod:`.custom_model`).
    """

    supports_shrink = True
    recovery_style = ENGINE_RECOVERY_STYLES["torch"][0]
    supported_recovery_styles = ENGINE_RECOVERY_STYLES["torch"][1]

    def __init__(self, cfg, coord: GridCoord, groups: ProcessGroups, samples, device: torch.device | None = None,
                 state_follows: bool = False):
        self.cfg = cfg
        self.coord = coord
        self.groups = groups
        self.device = device or torch.device("cpu")
        self.samples = samples
        m, t = cfg.model, cfg.training
        self.tp = dist.get_world_size(groups.tp)
        self.pp = dist.get_world_size(groups.pp)
        self.dp = dist.get_world_size(groups.dp)
        if self.tp != 1 or cfg.parallelism.tp != 1:
            raise EngineError(
                f"parallelism.tp ({cfg.parallelism.tp}) must be 1 for engine 'torch' (no tensor parallelism); "
                "use engine: megatron for tp > 1"
            )
        # dp may be below the configured one after a shrink (docs/design.md section 6), never above it
        if self.pp != cfg.parallelism.pp or (cfg.parallelism.dp is not None and self.dp > cfg.parallelism.dp):
            raise EngineError(
                f"process groups (pp={self.pp}, dp={self.dp}) do not match parallelism "
                f"(pp={cfg.parallelism.pp}, dp={cfg.parallelism.dp})"
            )
        if m.dtype not in _DTYPES:
            raise EngineError(f"model.dtype {m.dtype!r} is not supported by engine 'torch' (allowed: float32, bfloat16)")
        self.dtype = _DTYPES[m.dtype]
        self.even = t.global_batch_size % (t.micro_batch_size * self.dp) == 0
        self.first_micro, self.n_micro = micro_split(t.global_batch_size, t.micro_batch_size, self.dp, coord.dp)
        self.total_micro = t.global_batch_size // t.micro_batch_size
        self.tokens_per_step = t.global_batch_size * m.seq_length
        self.params_pending = bool(state_follows)  # parameters promised by the caller, not loaded yet
        self.model = self._build_model(coord.pp, empty=self.params_pending)
        self.optimizer = ShardedAdamW(
            list(self.model.named_parameters()), coord.dp, self.dp, weight_decay=t.weight_decay
        )
        self.step = 0
        self.data_position = 0
        self.last_lr = 0.0
        self.last_grad_norm = 0.0
        self._param_prefix = f"param/pp{coord.pp}/tp{coord.tp}"
        self._opt_state = self.optimizer.named_state(coord.shard_prefix())
        self._runner = self._make_runner()

    # --- model construction ---------------------------------------------------------------------------
    def _build_model(self, stage: int, empty: bool = False) -> torch.nn.Module:
        """The stage's module: the built-in GPT (``empty``: without initialisation, its parameters to be
        loaded), or ``model.factory``'s module after a shape probe (one micro-batch of zeros through the
        stage, no gradients), cast to ``model.dtype`` on ``self.device``.

        Raises:
            ConfigError: the factory's module is malformed (:mod:`.custom_model`), or raises on the probe.
        """
        m, t = self.cfg.model, self.cfg.training
        if m.factory is None:
            shape = GPTShape(**{f: getattr(m, f) for f in GPTShape.__dataclass_fields__})
            if empty:
                return empty_stage(shape, self.pp, stage, self.dtype, self.device)
            return GPTStage(shape, self.pp, stage, t.seed, self.dtype).to(self.device)
        from phoenix_hpc.engines.custom_model import build_stage, check_stage_output, stage_io_shapes

        module = build_stage(self.cfg, stage, self.pp).to(device=self.device, dtype=self.dtype)
        inp, _ = stage_io_shapes(self.cfg, stage, self.pp)
        x = torch.zeros(inp, dtype=torch.long if stage == 0 else self.dtype, device=self.device)
        try:
            with torch.no_grad():
                y = module(x)
        except Exception as exc:  # noqa: BLE001 - the user's module: report, do not crash
            raise ConfigError(
                f"model.factory: value {m.factory!r} -- the module of stage {stage} of {self.pp} raised "
                f"{type(exc).__name__}: {exc} on one micro-batch of zeros of shape {tuple(inp)} (expected: "
                "docs/engines.md, 'A model of your own')") from None
        check_stage_output(self.cfg, stage, self.pp, y)
        return module

    # --- pipeline ------------------------------------------------------------------------------------
    def _make_runner(self):
        if self.pp == 1:
            return None
        from phoenix_hpc.engines.pipeline import PipelineRunner

        m = self.cfg.model
        return PipelineRunner(
            self.model, self.coord.pp, self.pp, self.groups.pp, self.device, self.n_micro,
            self.cfg.training.micro_batch_size, m.seq_length, m.hidden_size, m.vocab_size, self.dtype, lm_loss,
        )

    # --- the step --------------------------------------------------------------------------------------
    def _first_sample(self) -> int:
        """Global position of this rank's first sample of the step (a pure function of the step)."""
        return self.data_position + self.first_micro * self.cfg.training.micro_batch_size

    def _local_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.samples.batch(self._first_sample(), self.n_micro * self.cfg.training.micro_batch_size)
        return x.to(self.device), y.to(self.device)

    def forward_backward(self) -> float | None:
        """Forward and backward of step ``self.step + 1`` (``n_micro`` micro-batches). Returns the step's
        mean loss (nats/token, averaged over the DP group) on the last stage, None elsewhere.

        Raises:
            EngineError: the engine was built with ``state_follows`` and its parameters were never loaded."""
        if self.params_pending:
            raise EngineError(f"{self.coord.shard_prefix()}: built to receive its parameters (a recovery), but "
                              "they were never loaded; refusing to train on uninitialised memory")
        for p in self.model.parameters():
            p.grad = None
        is_first, is_last = self.coord.pp == 0, self.coord.pp == self.pp - 1
        mbs = self.cfg.training.micro_batch_size
        if hasattr(self.model, "begin_step"):  # the built-in GPT: dropout masks from the micro-batches' positions
            self.model.begin_step(self.cfg.training.seed, self._first_sample(), mbs)
        x, y = self._local_batch() if (is_first or is_last) else (None, None)
        if self._runner is None:
            total = torch.zeros((), dtype=torch.float32, device=self.device)
            # even split: loss / n_micro, then the DP average; uneven: loss * dp / M, so that the DP average
            # is the sum over the step's M micro-batches / M (module doc)
            uneven = self.dp / self.total_micro
            for i in range(self.n_micro):
                sl = slice(i * mbs, (i + 1) * mbs)
                loss = lm_loss(self.model(x[sl]), y[sl])
                (loss / self.n_micro if self.even else loss * uneven).backward()
                total += loss.detach()
            loss_val: float | None = float(total / self.n_micro)
        else:
            loss_val = self._runner.run(x if is_first else None, y if is_last else None)
            if not self.even:  # the schedule divided by n_micro: make it dp / M (module doc)
                f = self.n_micro * self.dp / self.total_micro
                for p in self.model.parameters():
                    if p.grad is not None:
                        p.grad.mul_(f)
        if loss_val is not None and self.dp > 1:  # the mean over the step's micro-batches, each rank's weighted
            t = torch.tensor([loss_val * self.n_micro], dtype=torch.float64, device=self.device)
            dist.all_reduce(t, group=self.groups.dp)
            loss_val = float(t) / self.total_micro
        return loss_val

    def evaluate(self, position: int, iters: int) -> float | None:
        """:meth:`.base.Engine.evaluate`: the validation batch ``i`` (``0 <= i < iters``) is the validation
        part's positions ``[position + i G, position + (i+1) G)``, dealt out over the DP ranks and micro-batches
        as a training step's (:func:`micro_split`); at pp > 1 through the pipeline schedule's forward-only pass.
        The loss is summed in float64 over the micro-batches in a fixed order, then over the DP group.

        Raises:
            EngineError: parameters not loaded yet (``state_follows``), or the dataset has no validation part
                (``data.path``, ``data.factory``: only ``data.blend`` has a split).
            DataError: the split gives the validation part no sample."""
        if self.params_pending:
            raise EngineError(f"{self.coord.shard_prefix()}: parameters never loaded; nothing to evaluate")
        if not hasattr(self.samples, "valid_batch"):
            raise EngineError("training.eval_interval: the dataset has no validation part (data.blend has one)")
        t = self.cfg.training
        mbs, G = t.micro_batch_size, t.global_batch_size
        is_first, is_last = self.coord.pp == 0, self.coord.pp == self.pp - 1
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for it in range(iters):
                    first = position + it * G + self.first_micro * mbs
                    x, y = (None, None)
                    if is_first or is_last:
                        x, y = self.samples.valid_batch(first, self.n_micro * mbs)
                        x, y = x.to(self.device), y.to(self.device)
                    if self._runner is None:
                        for i in range(self.n_micro):
                            sl = slice(i * mbs, (i + 1) * mbs)
                            total += lm_loss(self.model(x[sl]), y[sl]).double()
                    else:
                        loss = self._runner.eval(x if is_first else None, y if is_last else None)
                        if loss is not None:
                            total += loss * self.n_micro
        finally:
            self.model.train(was_training)
        if not is_last:
            return None
        if self.dp > 1:
            dist.all_reduce(total, group=self.groups.dp)
        return float(total) / (self.total_micro * iters)

    def reduce_gradients(self) -> None:
        """Average gradients over the DP group into the own fp32 slice, then compute the global grad norm
        (one all-reduce over the world group) for clipping."""
        self.optimizer.reduce_gradients(self.groups.dp)
        sq = self.optimizer.grad_sq_sum().reshape(1).to(self.device)
        dist.all_reduce(sq, group=self.groups.world)
        self.last_grad_norm = float(sq.sqrt())

    def optimizer_step(self) -> None:
        """AdamW on the own slice (grad-norm clip to ``training.grad_clip``), all-gather parameters over
        the DP group, advance ``step`` and the data position."""
        t = self.cfg.training
        nxt = self.step + 1
        lr = lr_for(t, nxt)
        scale = 1.0
        if t.grad_clip > 0 and self.last_grad_norm > t.grad_clip:
            scale = t.grad_clip / (self.last_grad_norm + 1e-6)
        self.optimizer.step(lr, nxt, scale)
        self.optimizer.gather_params(self.groups.dp)
        self.step = nxt
        self.last_lr = lr
        self.data_position = nxt * t.global_batch_size

    # --- state -----------------------------------------------------------------------------------------
    def optimizer_shard(self) -> list[tuple[str, torch.Tensor]]:
        """``opt/pp{pp}/tp0/dp{dp}/{param}/{main|exp_avg|exp_avg_sq}``: fp32 1-D views of the own slice
        (see :mod:`.zero`); ``3 * 4 * shard_len`` bytes in total."""
        return list(self._opt_state)

    def param_shard(self) -> list[tuple[str, torch.Tensor]]:
        """``param/pp{pp}/tp0/{param}``: the stage's parameters, model dtype, their own shapes."""
        return [(f"{self._param_prefix}/{n}", p.data) for n, p in self.model.named_parameters()]

    def envelope(self) -> dict[str, Any]:
        """JSON-serialisable metadata: ``format``, ``engine``, ``step``, ``coord``, ``grid``, ``rng``
        (torch CPU and, on GPU, CUDA generator states, base64), ``lr_scheduler`` (the schedule is a pure
        function of the step; its settings and last lr are recorded), ``data`` (``position``: global sample
        position of the next step, ``seed``), ``loss_scaler`` (None: no scaling in float32/bfloat16),
        ``grad_norm`` of the last step."""
        t = self.cfg.training
        rng: dict[str, Any] = {"torch_cpu": _b64(torch.get_rng_state())}
        if self.device.type == "cuda":
            rng["torch_cuda"] = _b64(torch.cuda.get_rng_state(self.device))
        return {
            "format": ENVELOPE_FORMAT,
            "engine": "torch",
            "step": self.step,
            "coord": {"pp": self.coord.pp, "dp": self.coord.dp, "tp": self.coord.tp},
            "grid": {"tp": self.tp, "pp": self.pp, "dp": self.dp},
            "rng": rng,
            "lr_scheduler": scheduler_record(t, self.step, self.last_lr),
            "data": {"position": self.data_position, "seed": t.seed, "global_batch_size": t.global_batch_size},
            "loss_scaler": None,
            "grad_norm": self.last_grad_norm,
        }

    def _check_and_copy(self, what: str, live: list[tuple[str, torch.Tensor]], tensors: dict[str, torch.Tensor]) -> None:
        names = {n for n, _ in live}
        missing, extra = sorted(names - tensors.keys()), sorted(tensors.keys() - names)
        if missing or extra:
            raise EngineError(
                f"{what} for {self.coord.shard_prefix()} does not match: missing {missing[:3]}"
                f"{'...' if len(missing) > 3 else ''}, unexpected {extra[:3]}{'...' if len(extra) > 3 else ''}"
            )
        for n, t in live:
            src = tensors[n]
            if src.shape != t.shape or src.dtype != t.dtype:
                raise EngineError(
                    f"{what} tensor {n}: got {tuple(src.shape)} {src.dtype}, expected {tuple(t.shape)} {t.dtype}"
                )
        with torch.no_grad():
            for n, t in live:
                t.copy_(tensors[n])

    def load_optimizer_shard(self, tensors: dict[str, torch.Tensor]) -> None:
        self._check_and_copy("optimizer shard", self._opt_state, tensors)

    def load_resharded_optimizer(self, old: dict[str, torch.Tensor], old_dp: int) -> None:
        """After a shrink: fill this rank's optimizer slice from slices of the old DP size ``old_dp``
        (``old``: ``opt/pp{pp}/tp0/dp{d}/{param}/{kind}`` -> 1-D fp32 tensor, the old slices that intersect
        this rank's; :meth:`.zero.ShardedAdamW.load_resharded`).

        Raises:
            EngineError: a needed piece is missing or malformed, or the pieces do not cover the slice once.
        """
        c = self.coord
        try:
            self.optimizer.load_resharded(old, old_dp, lambda d: f"opt/pp{c.pp}/tp{c.tp}/dp{d}")
        except ValueError as exc:
            raise EngineError(f"{c.shard_prefix()}: {exc}") from None

    def optimizer_shard_layout(self, dp_index: int, dp_size: int) -> dict[str, int]:
        """The optimizer shard that DP index ``dp_index`` of this stage holds when the stage's flat vector is cut
        over ``dp_size`` ranks: its names (``opt/pp{pp}/tp0/dp{dp_index}/{param}/{kind}``, as
        :meth:`optimizer_shard` names them at that dp) -> elements of each fp32 1-D piece
        (:func:`.zero.flat_pieces`). Pure layout; what a checkpoint written at ``dp_size`` holds."""
        c = self.coord
        sizes = [(n, p.numel()) for n, p in self.optimizer.named_params]
        _, pieces = flat_pieces(sizes, int(dp_index), int(dp_size))
        return {f"opt/pp{c.pp}/tp{c.tp}/dp{dp_index}/{pc.name}/{kind}": pc.length for pc in pieces for kind in KINDS}

    def params_from_optimizer(self) -> None:
        """Set the stage's parameters from the optimizer slice's fp32 main copy, cast to the model dtype, as
        every optimizer step leaves them (:meth:`.zero.ShardedAdamW.gather_params`); the whole stage only
        when dp == 1 (a recovery with no live DP peer to take them from).

        Raises:
            EngineError: dp > 1 (the slice holds only part of the stage).
        """
        if self.dp != 1:
            raise EngineError(f"{self.coord.shard_prefix()}: parameters can be rebuilt from the optimizer only "
                              f"with dp == 1 (dp is {self.dp})")
        self.optimizer.gather_params(None)
        self.params_pending = False

    def optimizer_numel(self) -> int:
        """Elements of this stage's flat optimizer vector (the same on every DP rank of the stage)."""
        return int(self.optimizer.numel)

    def load_param_shard(self, tensors: dict[str, torch.Tensor]) -> None:
        self._check_and_copy("param shard", self.param_shard(), tensors)
        self.params_pending = False

    def load_envelope(self, envelope: dict[str, Any]) -> None:
        """Restore step, data position, LR-schedule position and RNG states.

        Raises:
            EngineError: the envelope is of another engine/format, or its coord or grid differs from this
                rank's (a shard must be restored by its logical id).
        """
        if envelope.get("engine") != "torch" or envelope.get("format") != ENVELOPE_FORMAT:
            raise EngineError(
                f"envelope of engine {envelope.get('engine')!r} format {envelope.get('format')!r} cannot be "
                f"loaded by engine 'torch' format {ENVELOPE_FORMAT}"
            )
        want = {"pp": self.coord.pp, "dp": self.coord.dp, "tp": self.coord.tp}
        grid = {"tp": self.tp, "pp": self.pp, "dp": self.dp}
        if envelope.get("coord") != want or envelope.get("grid") != grid:
            raise EngineError(
                f"envelope is for coord {envelope.get('coord')} grid {envelope.get('grid')}, this rank is "
                f"{want} grid {grid}"
            )
        self.step = int(envelope["step"])
        self.data_position = int(envelope["data"]["position"])
        self.last_lr = float(envelope["lr_scheduler"]["last_lr"])
        self.last_grad_norm = float(envelope.get("grad_norm", 0.0))
        torch.set_rng_state(_unb64(envelope["rng"]["torch_cpu"]))
        if self.device.type == "cuda" and "torch_cuda" in envelope["rng"]:
            torch.cuda.set_rng_state(_unb64(envelope["rng"]["torch_cuda"]), self.device)

    def rebind(self, groups: ProcessGroups, coord: GridCoord) -> None:
        """Use the process groups of a new generation. The coordinate must stay the same (a shard keeps
        its logical id; a spare takes over a coordinate by building a fresh engine and loading state).

        Raises:
            EngineError: ``coord`` differs from this engine's, or the new groups have other sizes.
        """
        if coord != self.coord:
            raise EngineError(f"rebind cannot move {self.coord} to {coord}; build a new engine for {coord}")
        sizes = tuple(dist.get_world_size(g) for g in (groups.tp, groups.pp, groups.dp))
        if sizes != (self.tp, self.pp, self.dp):
            raise EngineError(f"rebind: new groups have sizes tp/pp/dp={sizes}, engine has {(self.tp, self.pp, self.dp)}")
        self.groups = groups
        self._runner = self._make_runner()

    def release_groups(self) -> None:
        """Forget the groups and the pipeline runner bound to the pp group (:meth:`rebind` makes new ones)."""
        self.groups = None
        self._runner = None

    def teardown(self) -> None:
        """End this engine before a new one is built in its place (the ``rebuild`` recovery path): drop the
        model, the optimizer and its shard views, the pipeline runner, the dataset reader and the groups. Runs
        no collective; the engine cannot be used afterwards. Idempotent."""
        self.release_groups()
        self.model = None
        self.optimizer = None
        self._opt_state = []
        self.samples = None
