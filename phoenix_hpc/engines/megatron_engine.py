"""The ``megatron`` engine: megatron-core GPTModel + DistributedDataParallel + DistributedOptimizer (CUDA).

Built on megatron-core (versions: :mod:`phoenix_hpc.engines.megatron_version`, tested with 0.16). The engine
owns its process groups and recovers by rebuilding (:class:`phoenix_hpc.engines.base.Engine`,
``recovery_style = "rebuild"``, ``owns_groups = True``): the constructor receives the generation's default
group only and has megatron-core create the tp/pp/dp groups on it (:mod:`.megatron_parallel`: every group with
``resilience.collective_timeout_s``, no gloo DP groups); :meth:`teardown` destroys that parallel state, so a
new generation's engine is built from scratch by every member in lockstep. The model is ``GPTModel`` with the
layer spec and options of the job config (:mod:`.megatron_spec`: GPT or Llama shape, Transformer Engine or
local layers, attention backend, recomputation, sequence parallelism), or the stage ``model.provider`` returns
(:mod:`.megatron_provider`, Megatron-LM's model-provider convention), wrapped in megatron-core
``DistributedDataParallel`` with ``use_distributed_optimizer=True``; the optimizer is the
``DistributedOptimizer`` returned by ``get_megatron_optimizer`` (Adam with decoupled weight decay, fp32 main
params; weight decay is not applied to biases and 1-D parameters (norms), megatron-core's default
``wd_mult = 0`` groups, applied by :func:`group_weight_decay`).

Optimizer shard. ``DistributedOptimizer.get_parameter_state_dp_reshardable()`` returns, without copies or
communication, for each grad buffer / bucket / parameter the rank's live fp32 tensors ``param`` (main
params), ``exp_avg`` and ``exp_avg_sq`` for the part of the parameter in this DP rank's range of the bucket.
They are exposed as ``opt/pp{pp}/tp{tp}/dp{dp}/{param}/{main|exp_avg|exp_avg_sq}`` (1-D fp32 views). Loading
copies into the same live tensors (what ``load_parameter_state_from_dp_reshardable`` does through
``_set_main_param_and_optimizer_states``), so nothing is ever gathered to DP rank 0. Adam's state is created
lazily by torch; the engine initialises it at construction (``init_state_fn``) so that the shard exists
before the first step. Adam's step counter is in the envelope (:mod:`.adam_step`: per parameter for torch's
Adam, per group for Transformer Engine / Apex FusedAdam).

Needs CUDA: megatron-core's DDP, the distributed optimizer and the GPT forward pass allocate on CUDA, so the
constructor raises :class:`EngineError` before touching megatron-core when CUDA is not available.
The per-step split: ``forward_backward`` runs megatron's pipeline schedule with no gradient finalisation
(``config.finalize_model_grads_func`` unset), ``reduce_gradients`` calls ``finalize_model_grads`` (DP
reduce-scatter of the grad buffers, plus embedding/LayerNorm grad all-reduces where needed),
``optimizer_step`` runs ``optimizer.step()`` (unscale, clip, Adam, copy to model params, param all-gather).

Dropout (``model.attention_dropout`` / ``hidden_dropout``, passed to ``TransformerConfig``): before every
step's forward passes the engine reseeds megatron-core's CUDA RNG tracker and torch's default CUDA generator
from ``(training.seed, step, pp, dp)`` (:mod:`.megatron_rng`), so a replayed step draws the masks of its first
try in whatever process replays it. The RNG states in the envelope are kept for the record; the masks do not
depend on them.
"""

from __future__ import annotations

import base64
import gc
import os
from typing import Any

import torch

from phoenix_hpc.engines.adam_step import ensure_step_entries, read_adam_step, step_location, write_adam_step
from phoenix_hpc.engines.base import Engine, GridCoord, ProcessGroups
from phoenix_hpc.engines.megatron_rng import reseed
from phoenix_hpc.engines.schedule import lr_for, scheduler_record
from phoenix_hpc.errors import EngineError

ENVELOPE_FORMAT = 1
KINDS = {"param": "main", "exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq"}


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def import_megatron_core() -> dict[str, Any]:
    """Import the megatron-core pieces this engine uses (Apex / Transformer Engine fallback warnings and
    deprecations silenced) and return them by name. Seconds on a busy node; a standby slot does it before it
    waits (:func:`phoenix_hpc.launch.execute.warm_up`). Raises ImportError when megatron-core is missing."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
        warnings.filterwarnings("ignore", message=".*Apex is not installed.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
        from megatron.core.models.gpt import GPTModel
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.transformer import TransformerConfig
    return dict(
        parallel_state=parallel_state, tensor_parallel=tensor_parallel, DDP=DistributedDataParallel,
        DDPConfig=DistributedDataParallelConfig, finalize_model_grads=finalize_model_grads, GPTModel=GPTModel,
        OptimizerConfig=OptimizerConfig, get_megatron_optimizer=get_megatron_optimizer,
        get_forward_backward_func=get_forward_backward_func, TransformerConfig=TransformerConfig,
    )


def lm_loss(output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The ``loss_func`` of a micro-batch for megatron-core's schedule: the mean of the per-token losses
    ``output_tensor`` (shape ``[batch, seq]``, any float dtype) in fp32, and the value to log, ``{"lm loss":
    a 0-d fp32 copy}``. The logged value is a copy, not ``loss.detach()``: megatron-core's
    ``forward_step`` divides the returned loss by the number of micro-batches in place
    (``output_tensor /= num_microbatches``, megatron/core/pipeline_parallel/schedules.py), and a detached
    view shares its storage, so the logged loss would be divided too."""
    loss = output_tensor.float().mean()
    return loss, {"lm loss": loss.detach().clone()}


def group_weight_decay(group: dict, weight_decay: float) -> float:
    """The weight decay of one optimizer parameter group: ``weight_decay x group["wd_mult"]`` (megatron-core
    puts biases and 1-D parameters, i.e. norms, in groups with ``wd_mult = 0``; its own LR scheduler applies
    the multiplier the same way, ``OptimizerParamScheduler.step``). A group without ``wd_mult`` decays fully."""
    return weight_decay * float(group.get("wd_mult", 1.0))


def build_gpt_model(cfg, pre_process: bool, post_process: bool, mc=None):
    """``(TransformerConfig, GPTModel)`` of ``cfg`` for one pipeline stage, on the current device
    (megatron-core's default; ``use_cpu_initialization`` is not set). Parallel state must be initialised.

    Raises:
        EngineError: ``megatron.transformer_impl: transformer_engine`` without Transformer Engine installed.
    """
    from phoenix_hpc.engines.megatron_spec import gpt_model_kwargs, layer_spec, transformer_config_kwargs

    mc = mc or import_megatron_core()
    tconfig = mc["TransformerConfig"](**transformer_config_kwargs(cfg))
    try:
        spec = layer_spec(cfg)
    except ImportError as exc:
        raise EngineError(
            f"megatron.transformer_impl: 'transformer_engine' needs Transformer Engine on this node ({exc}); "
            "install it or use transformer_impl: local"
        ) from None
    gpt = mc["GPTModel"](config=tconfig, transformer_layer_spec=spec, pre_process=pre_process,
                         post_process=post_process, **gpt_model_kwargs(cfg))
    return tconfig, gpt


def cast_to_params_dtype(module: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    """Cast every floating-point parameter and buffer of ``module`` that is not ``dtype`` to ``dtype``, in
    place, as Megatron-LM's training loop does by wrapping a bf16/fp16 model in ``Float16Module``
    (``module.bfloat16()`` / ``module.half()``, megatron/core/transformer/module.py). Needed because
    megatron-core's torch fallback norm (``WrappedTorchNorm``, used when neither Apex nor Transformer Engine
    is installed) builds ``torch.nn.RMSNorm``/``LayerNorm`` without ``params_dtype``: fp32 weights in a bf16
    model, which the shards would carry as a second dtype and which torch cannot fuse (measured on an H200
    with megatron-core 0.16.1). Integer and bool tensors are left alone. Returns the names of the
    parameters cast (empty for an fp32 model or one built fully in ``dtype``)."""
    cast = [n for n, p in module.named_parameters() if p.is_floating_point() and p.dtype != dtype]
    stale = any(b.is_floating_point() and b.dtype != dtype for b in module.buffers())
    if cast or stale:
        module.to(dtype=dtype)  # floating-point parameters and buffers only (torch.nn.Module.to)
    return cast


class MegatronEngine(Engine):
    """See the module docstring.

    Args:
        cfg: the job config; ``groups``: the generation's default group in ``groups.world`` (dp/pp/tp may be
            None; any given are not used: megatron-core builds its own); ``coord``: the launcher's
            coordinate, checked against megatron-core's;
        device: a CUDA device.

    Raises:
        EngineError: no CUDA; an unsupported megatron-core version; megatron-core's parallel state is
            still initialised (the previous engine was not torn down); the launcher's coordinate differs from
            Megatron's; Transformer Engine chosen but missing.
        ConfigError: ``model.provider`` does not import, raises, or returns something other than a
            ``MegatronModule`` for this stage (:func:`phoenix_hpc.engines.megatron_provider.build_stage`).
        DataError: the dataset cannot be read (see :class:`phoenix_hpc.data.indexed.TokenSamples`).
    """

    recovery_style = "rebuild"
    supported_recovery_styles = ("rebuild",)
    owns_groups = True

    def __init__(self, cfg, coord: GridCoord, groups: ProcessGroups, device: torch.device):
        if not torch.cuda.is_available() or device.type != "cuda":
            raise EngineError(
                "engine 'megatron' needs CUDA, and no CUDA device is available here "
                "(megatron-core allocates on CUDA even in its forward pass); use engine: torch on CPU"
            )
        from phoenix_hpc.engines.megatron_parallel import init_parallel_state
        from phoenix_hpc.engines.megatron_version import installed_version, version_problem

        problem = version_problem(installed_version())
        if problem is not None:
            raise EngineError(problem)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        # deterministic Transformer Engine attention: megatron-core's TE attention refuses deterministic_mode
        # unless this is 0 (megatron/core/extensions/transformer_engine.py)
        os.environ.setdefault("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")
        self.cfg, self.device = cfg, device
        p = cfg.parallelism
        self._mc = import_megatron_core()
        ps = self._mc["parallel_state"]
        try:
            init_parallel_state(p.tp, p.pp, cfg.resilience.collective_timeout_s)
        except RuntimeError as exc:
            raise EngineError(f"engine 'megatron': {exc} (the previous engine's teardown() did not run)") from None
        try:  # a failed construction leaves no parallel state behind (the next attempt builds afresh)
            self._build(cfg, coord, groups, device)
        except BaseException:
            ps.destroy_model_parallel()
            raise

    def _build(self, cfg, coord: GridCoord, groups: ProcessGroups, device: torch.device) -> None:
        import torch.distributed as dist

        from phoenix_hpc.data.indexed import TokenSamples
        from phoenix_hpc.engines.megatron_parallel import groups_and_coord
        from phoenix_hpc.engines.torch_engine import micro_batches

        m, t, p = cfg.model, cfg.training, cfg.parallelism
        mc, ps = self._mc, self._mc["parallel_state"]
        mg_groups, mg_coord = groups_and_coord(groups.world if groups.world is not None else dist.group.WORLD,
                                               groups.generation)
        if mg_coord != coord:
            raise EngineError(f"Megatron places this rank at {mg_coord}, the launcher at {coord}")
        self.coord, self.groups = coord, mg_groups
        self.tp, self.pp = p.tp, p.pp
        self.dp = ps.get_data_parallel_world_size()
        self.n_micro = micro_batches(t.global_batch_size, t.micro_batch_size, self.dp)
        if cfg.data.blend is not None:
            from phoenix_hpc.data.blend import open_blend

            self.samples = open_blend(cfg)  # built before the process groups (launch/execute.import_runtime)
        else:
            self.samples = TokenSamples(cfg.data.path, m.seq_length, t.seed, m.vocab_size)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[m.dtype]
        self.dtype = dtype
        torch.manual_seed(t.seed + 100 * coord.pp)
        mc["tensor_parallel"].model_parallel_cuda_manual_seed(t.seed + 100 * coord.pp)
        first, last = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
        if m.provider is not None:  # the user's model-provider function (docs/engines.md)
            from phoenix_hpc.engines.megatron_provider import build_stage

            gpt = build_stage(cfg, coord.pp, first, last)
            self.tconfig = gpt.config  # the provider's own (possibly derived) TransformerConfig
        else:
            self.tconfig, gpt = build_gpt_model(cfg, first, last, mc)
        gpt = gpt.to(device)
        self.params_cast = cast_to_params_dtype(gpt, dtype)  # before DDP and the optimizer's main params
        ddp_config = mc["DDPConfig"](grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=True)
        self.model = mc["DDP"](self.tconfig, ddp_config, gpt)
        self.model.broadcast_params()  # identical start on every DP rank of a (pp, tp)
        self.optimizer = mc["get_megatron_optimizer"](
            mc["OptimizerConfig"](
                optimizer="adam", lr=t.lr, min_lr=t.min_lr, weight_decay=t.weight_decay, adam_beta1=0.9,
                adam_beta2=0.95, adam_eps=1e-8, clip_grad=t.grad_clip, bf16=dtype == torch.bfloat16,
                fp16=dtype == torch.float16, params_dtype=dtype, use_distributed_optimizer=True,
            ),
            [self.model],
            use_gloo_process_groups=False,
        )
        if dtype == torch.float16:
            self.tconfig.grad_scale_func = self.optimizer.scale_loss
        self.dist_opts = [o for o in getattr(self.optimizer, "chained_optimizers", [self.optimizer])]
        for o in self.dist_opts:  # create Adam state now, so the shard exists before step 1
            if getattr(o, "init_state_fn", None) is not None:
                o.init_state_fn(o.optimizer, o.config)
            ensure_step_entries(o.optimizer)
        for g in self.optimizer.param_groups:
            g["weight_decay"] = group_weight_decay(g, t.weight_decay)
        self._names = {p: n.removeprefix("module.") for n, p in self.model.named_parameters()}
        self._param_prefix = f"param/pp{coord.pp}/tp{coord.tp}"
        self.step, self.data_position, self.last_lr, self.last_grad_norm = 0, 0, 0.0, 0.0
        self._loss_dicts: list = []
        self._dist = dist

    # --- the step --------------------------------------------------------------------------------------
    def _iterator(self, batch=None, position: int | None = None):
        """The step's micro-batches of this DP rank: from ``batch`` (default the train part's) at global
        ``position`` (default the next step's data position)."""
        t, m = self.cfg.training, self.cfg.model
        per_dp = t.global_batch_size // self.dp
        batch = batch or self.samples.batch
        x, y = batch((self.data_position if position is None else position) + self.coord.dp * per_dp, per_dp)
        x, y = x.to(self.device), y.to(self.device)
        mbs, s = t.micro_batch_size, m.seq_length
        pos = torch.arange(s, device=self.device).unsqueeze(0).expand(mbs, s)
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=self.device), diagonal=1).view(1, 1, s, s)
        for i in range(self.n_micro):
            yield x[i * mbs : (i + 1) * mbs], y[i * mbs : (i + 1) * mbs], pos, mask

    def forward_backward(self) -> float | None:
        """The step's forward and backward passes over this rank's micro-batches (megatron-core's pipeline
        schedule), after reseeding megatron-core's dropout random states for the step
        (:func:`phoenix_hpc.engines.megatron_rng.reseed`: a pure function of the training seed, the step and
        this rank's pp and dp coordinates), so a replayed step draws the masks of its first try. Returns the
        step's mean loss over the DP group on the last pipeline stage, None elsewhere."""
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        reseed(self._mc["tensor_parallel"], self.cfg.training.seed, self.step + 1, self.coord.pp, self.coord.dp)

        def forward_step(data_iterator, model):
            tokens, labels, pos, mask = next(data_iterator)
            out = model(tokens, pos, mask, labels=labels)

            return out, lm_loss

        t, m = self.cfg.training, self.cfg.model
        fb = self._mc["get_forward_backward_func"]()
        dicts = fb(
            forward_step_func=forward_step, data_iterator=self._iterator(), model=[self.model],
            num_microbatches=self.n_micro, seq_length=m.seq_length, micro_batch_size=t.micro_batch_size,
            forward_only=False,
        )
        if not self._mc["parallel_state"].is_pipeline_last_stage():
            return None
        loss = torch.stack([d["lm loss"].float() for d in dicts]).mean().reshape(1).double()
        if self.dp > 1:
            self._dist.all_reduce(loss, group=self.groups.dp)
            loss /= self.dp
        return float(loss)

    def evaluate(self, position: int, iters: int) -> float | None:
        """:meth:`.base.Engine.evaluate` through megatron-core's forward-backward function with
        ``forward_only=True`` (as Megatron-LM's ``evaluate``): ``iters`` global batches of the validation part
        from ``position``, each DP rank its ``G / dp`` run of each, the model in eval mode under
        ``torch.no_grad``. The micro-batch losses are summed in float64 in a fixed order, then over the DP group.

        Raises:
            EngineError: the dataset has no validation part (only ``data.blend`` has a split).
            DataError: the split gives the validation part no sample."""
        if not hasattr(self.samples, "valid_batch"):
            raise EngineError("training.eval_interval: the dataset has no validation part (data.blend has one)")

        def forward_step(data_iterator, model):
            tokens, labels, pos, mask = next(data_iterator)
            return model(tokens, pos, mask, labels=labels), lm_loss

        t, m = self.cfg.training, self.cfg.model
        fb = self._mc["get_forward_backward_func"]()
        last = self._mc["parallel_state"].is_pipeline_last_stage()
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        self.model.eval()
        try:
            with torch.no_grad():
                for it in range(iters):
                    dicts = fb(forward_step_func=forward_step,
                               data_iterator=self._iterator(self.samples.valid_batch, position + it * t.global_batch_size),
                               model=[self.model], num_microbatches=self.n_micro, seq_length=m.seq_length,
                               micro_batch_size=t.micro_batch_size, forward_only=True)
                    if last:
                        for d in dicts:
                            total += d["lm loss"].double().reshape(1)
        finally:
            self.model.train()
        if not last:
            return None
        if self.dp > 1:
            self._dist.all_reduce(total, group=self.groups.dp)
        return float(total) / (self.n_micro * self.dp * iters)

    def reduce_gradients(self) -> None:
        self._mc["finalize_model_grads"]([self.model])

    def optimizer_step(self) -> None:
        t = self.cfg.training
        nxt = self.step + 1
        lr = lr_for(t, nxt)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
            g["weight_decay"] = group_weight_decay(g, t.weight_decay)
        ok, grad_norm, _ = self.optimizer.step()
        self.last_grad_norm = float(grad_norm) if grad_norm is not None else 0.0
        self.step, self.last_lr = nxt, lr
        self.data_position = nxt * t.global_batch_size

    # --- state -----------------------------------------------------------------------------------------
    def _opt_entries(self):
        prefix = self.coord.shard_prefix()
        out = []
        for oi, o in enumerate(self.dist_opts):
            state = o.get_parameter_state_dp_reshardable()
            for gbuf_idx, gbuf_ranges in enumerate(o.gbuf_ranges):
                for dtype, buckets in gbuf_ranges.items():
                    for b_idx, bucket in enumerate(buckets):
                        for (model_param, _), tensors in zip(bucket["param_map"].items(), state[gbuf_idx][dtype][b_idx]):
                            name = self._names[model_param]
                            for key, kind in KINDS.items():
                                out.append((f"{prefix}/{name}/{kind}", tensors[key].view(-1)))
        return out

    def optimizer_shard(self) -> list[tuple[str, torch.Tensor]]:
        """Live fp32 1-D views of the DistributedOptimizer's main params and Adam moments of this rank
        (``3 x 4`` bytes per element of the rank's part of the grad buffers)."""
        return self._opt_entries()

    def param_shard(self) -> list[tuple[str, torch.Tensor]]:
        return [(f"{self._param_prefix}/{n.removeprefix('module.')}", p.data) for n, p in self.model.named_parameters()]

    def envelope(self) -> dict[str, Any]:
        t = self.cfg.training
        tracker = self._mc["tensor_parallel"].get_cuda_rng_tracker().get_states()
        scaler = None
        for o in self.dist_opts:
            if getattr(o, "grad_scaler", None) is not None:
                scaler = {k: (float(v) if torch.is_tensor(v) else v) for k, v in o.grad_scaler.state_dict().items()}
        return {
            "format": ENVELOPE_FORMAT, "engine": "megatron", "step": self.step,
            "coord": {"pp": self.coord.pp, "dp": self.coord.dp, "tp": self.coord.tp},
            "grid": {"tp": self.tp, "pp": self.pp, "dp": self.dp},
            "rng": {"torch_cpu": _b64(torch.get_rng_state()), "torch_cuda": _b64(torch.cuda.get_rng_state(self.device)),
                    "tracker": {k: _b64(v) for k, v in tracker.items()}},
            "lr_scheduler": scheduler_record(t, self.step, self.last_lr),
            "data": {"position": self.data_position, "seed": t.seed, "global_batch_size": t.global_batch_size},
            "adam_step": read_adam_step([o.optimizer for o in self.dist_opts]),
            "adam_step_location": sorted({step_location(o.optimizer) for o in self.dist_opts}),
            "loss_scaler": scaler,
            "grad_norm": self.last_grad_norm,
        }

    def _check_and_copy(self, what, live, tensors) -> None:
        names = {n for n, _ in live}
        missing, extra = sorted(names - tensors.keys()), sorted(tensors.keys() - names)
        if missing or extra:
            raise EngineError(f"{what} for {self.coord.shard_prefix()} does not match: missing {missing[:3]}, unexpected {extra[:3]}")
        for n, t in live:
            if tensors[n].shape != t.shape or tensors[n].dtype != t.dtype:
                raise EngineError(f"{what} tensor {n}: got {tuple(tensors[n].shape)} {tensors[n].dtype}, expected {tuple(t.shape)} {t.dtype}")
        with torch.no_grad():
            for n, t in live:
                t.copy_(tensors[n])

    def load_optimizer_shard(self, tensors: dict[str, torch.Tensor]) -> None:
        self._check_and_copy("optimizer shard", self._opt_entries(), tensors)

    def load_param_shard(self, tensors: dict[str, torch.Tensor]) -> None:
        self._check_and_copy("param shard", self.param_shard(), tensors)

    def load_envelope(self, envelope: dict[str, Any]) -> None:
        if envelope.get("engine") != "megatron" or envelope.get("format") != ENVELOPE_FORMAT:
            raise EngineError(f"envelope of engine {envelope.get('engine')!r} cannot be loaded by engine 'megatron'")
        want = {"pp": self.coord.pp, "dp": self.coord.dp, "tp": self.coord.tp}
        if envelope.get("coord") != want:
            raise EngineError(f"envelope is for coord {envelope.get('coord')}, this rank is {want}")
        self.step = int(envelope["step"])
        self.data_position = int(envelope["data"]["position"])
        self.last_lr = float(envelope["lr_scheduler"]["last_lr"])
        self.last_grad_norm = float(envelope.get("grad_norm", 0.0))
        torch.set_rng_state(_unb64(envelope["rng"]["torch_cpu"]))
        torch.cuda.set_rng_state(_unb64(envelope["rng"]["torch_cuda"]), self.device)
        self._mc["tensor_parallel"].get_cuda_rng_tracker().set_states(
            {k: _unb64(v) for k, v in envelope["rng"]["tracker"].items()}
        )
        write_adam_step([o.optimizer for o in self.dist_opts], int(envelope.get("adam_step", self.step)))
        for o in self.dist_opts:
            if envelope.get("loss_scaler") and getattr(o, "grad_scaler", None) is not None:
                o.grad_scaler.load_state_dict(
                    {k: torch.tensor(v, device=self.device) if isinstance(v, float) else v for k, v in envelope["loss_scaler"].items()}
                )

    def release_groups(self) -> None:
        """Forget this generation's groups: ``destroy_model_parallel()`` (megatron-core's references) and the
        engine's own. The model and optimizer still hold theirs until :meth:`teardown`. No collective."""
        from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state

        self.groups = None
        destroy_parallel_state()

    def teardown(self) -> None:
        """End this engine before the next generation's is built (the rebuild recovery path): destroy
        megatron-core's parallel state (afterwards ``model_parallel_is_initialized()`` is False), drop the
        model, optimizer and data iterator, and return cached CUDA memory. Runs no collective, destroys no
        communicator (the launcher aborts those). Idempotent."""
        self.release_groups()
        for name in ("model", "optimizer", "dist_opts", "samples", "_names", "tconfig"):
            if hasattr(self, name):
                setattr(self, name, None)
        self._loss_dicts = []
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
