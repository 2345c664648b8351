"""Choosing and building an engine from the job config (imports the chosen engine only).

``engine`` is ``torch``, ``megatron``, ``"package.module:Class"`` or the name of an entry point in group
``phoenix_hpc.engines`` (:mod:`.user_code`). A user engine is constructed as ``Class(cfg, coord, groups,
device)``, the signature of the built-in engines (docs/engines.md).
"""

from __future__ import annotations

import torch

from phoenix_hpc.engines.base import Engine, GridCoord, ProcessGroups
from phoenix_hpc.errors import EngineError


def check_engine_runnable(engine: str, cuda_available: bool | None = None) -> None:
    """Fail early when ``engine`` cannot run on this machine.

    Raises:
        EngineError: ``engine: megatron`` without CUDA (megatron-core allocates on CUDA in DDP, the
            distributed optimizer and the GPT forward pass) or with a megatron-core version outside
            :data:`phoenix_hpc.engines.megatron_version.SUPPORTED`. A user engine (not ``torch``/``megatron``)
            is not checked here (:func:`check_user_code` imports it).
    """
    if engine not in ("torch", "megatron"):
        return
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if engine == "megatron" and not cuda_available:
        raise EngineError(
            "engine 'megatron' needs CUDA, and no CUDA device is available here "
            "(megatron-core allocates on CUDA even in its forward pass); use engine: torch on CPU"
        )
    if engine == "megatron":
        from phoenix_hpc.engines.megatron_version import installed_version, version_problem

        problem = version_problem(installed_version())
        if problem is not None:
            raise EngineError(problem)


def default_device(local_rank: int) -> torch.device:
    """``cuda:{local_rank % device_count}`` when CUDA is available, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def engine_family(cfg) -> tuple[bool, bool]:
    """``(torch_like, megatron_like)``: whether ``cfg.engine`` is the torch engine or the Megatron engine, or
    a user's engine class derived from one of them (imported with ``python_path``).

    Raises:
        ConfigError: a user's engine class cannot be imported (:func:`~.user_code.load_engine_class`).
    """
    from phoenix_hpc.engines.user_code import is_builtin_engine, load_engine_class

    if is_builtin_engine(cfg.engine):
        return cfg.engine == "torch", cfg.engine == "megatron"
    from phoenix_hpc.engines.megatron_engine import MegatronEngine
    from phoenix_hpc.engines.torch_engine import TorchEngine

    cls = load_engine_class(cfg.engine, cfg.python_path)
    return issubclass(cls, TorchEngine), issubclass(cls, MegatronEngine)


def check_user_code(cfg) -> None:
    """Import every piece of user code the config names, exactly as the ranks will (same ``python_path``),
    and check it: the engine class (and ``resilience.recovery_path`` against its recovery styles); for
    the torch engine (or a user engine derived from it)
    ``model.factory`` (every stage built on the meta device, output shapes;
    :func:`phoenix_hpc.engines.custom_model.check_model_factory`) and ``data.factory`` (item 0); for the
    Megatron engine (or one derived from it) ``model.provider`` (import and signature:
    :func:`phoenix_hpc.engines.megatron_provider.check_provider`; a provider named with the torch engine, or
    one derived from it, is refused); another user engine reads these fields, if at all, itself. Run by
    ``phoenix submit`` (also with ``--dry-run``) and by every rank before MPI starts. Collects every problem.

    Raises:
        ConfigError: one line per problem, each naming the field, the value and what is expected; a factory
            or provider set for a built-in engine that does not read it.
    """
    from phoenix_hpc.engines.user_code import is_builtin_engine, load_engine_class
    from phoenix_hpc.errors import ConfigError

    problems: list[str] = []

    def run(check, *args) -> None:
        try:
            check(*args)
        except ConfigError as exc:
            problems.extend(exc.problems)

    torch_like = megatron_like = False  # a user's class that cannot be imported is neither
    try:
        torch_like, megatron_like = engine_family(cfg)
        if not is_builtin_engine(cfg.engine):
            from phoenix_hpc.engines.styles import recovery_path_of_class

            recovery_path_of_class(load_engine_class(cfg.engine, cfg.python_path), cfg.resilience.recovery_path,
                                   cfg.engine)
    except ConfigError as exc:
        problems.extend(exc.problems)
    except ValueError as exc:  # resilience.recovery_path names a style the class does not support
        problems.append(str(exc))
    hints = {"model.factory": "its model comes from model.provider (a megatron-core model-provider function) or "
                              "from the model fields; set engine: torch (or your own engine) to use a factory",
             "data.factory": "it reads the Megatron indexed dataset of data.path; set engine: torch (or your own "
                             "engine) to use a factory"}
    for fld, val in (("model.factory", cfg.model.factory), ("data.factory", cfg.data.factory)):
        if val is not None and cfg.engine == "megatron":
            problems.append(f"{fld}: value {val!r} -- engine 'megatron' does not read {fld}: {hints[fld]}")
    if cfg.model.provider is not None and (megatron_like or torch_like):
        from phoenix_hpc.engines.megatron_provider import check_provider

        run(check_provider, cfg, megatron_like)
    if torch_like:
        if cfg.model.factory is not None:
            from phoenix_hpc.engines.custom_model import check_model_factory

            run(check_model_factory, cfg)
        if cfg.data.factory is not None:
            from phoenix_hpc.engines.custom_model import open_dataset

            run(open_dataset, cfg)
    if problems:
        raise ConfigError(problems, source=f"job {cfg.name!r}")


def open_samples(cfg):
    """The torch engine's sample reader: ``data.factory``'s dataset when set, else the indexed dataset at
    ``data.path``, or the Megatron-LM blend of ``data.blend`` (:func:`phoenix_hpc.data.blend.open_blend`; all:
    ``batch(position, count) -> (inputs, targets)``, ``(count, seq_length)`` int64).

    Raises:
        DataError: the indexed dataset is missing or malformed; ConfigError: the factory's dataset is.
    """
    if cfg.data.factory is not None:
        from phoenix_hpc.engines.custom_model import FactorySamples

        return FactorySamples(cfg)
    if cfg.data.blend is not None:
        from phoenix_hpc.data.blend import open_blend

        return open_blend(cfg)
    from phoenix_hpc.data.indexed import TokenSamples

    return TokenSamples(cfg.data.path, cfg.model.seq_length, cfg.training.seed, cfg.model.vocab_size)


def create_engine(cfg, coord: GridCoord, groups: ProcessGroups, device: torch.device, *,
                  state_follows: bool = False) -> Engine:
    """Build the engine named by ``cfg.engine`` for this rank (the dataset is opened here).

    ``state_follows``: the caller loads every parameter before the first step (a recovery); the torch
    engine then skips the built-in GPT's random initialisation (:class:`.torch_engine.TorchEngine`). The
    Megatron engine and a user's engine class are built as always.

    Raises:
        EngineError / DataError / ConfigError: see :func:`check_engine_runnable`,
            :func:`phoenix_hpc.engines.user_code.load_engine_class`, the engine's constructor and
            :func:`open_samples`.
    """
    from phoenix_hpc.engines.user_code import is_builtin_engine, load_engine_class

    if not is_builtin_engine(cfg.engine):
        return load_engine_class(cfg.engine, cfg.python_path)(cfg, coord, groups, device)
    check_engine_runnable(cfg.engine, device.type == "cuda")
    if cfg.engine == "megatron":
        from phoenix_hpc.engines.megatron_engine import MegatronEngine

        return MegatronEngine(cfg, coord, groups, device)
    from phoenix_hpc.engines.torch_engine import TorchEngine

    return TorchEngine(cfg, coord, groups, open_samples(cfg), device, state_follows=state_follows)
