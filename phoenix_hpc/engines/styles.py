"""Which recovery path an engine takes (docs/design.md section 6), as data the config can check without
importing torch or an engine.

``resilience.recovery_path`` is ``auto``, ``rebind`` or ``rebuild``: ``auto`` takes the engine's default
style, the other two must be styles the engine supports. :data:`ENGINE_RECOVERY_STYLES` is what the config
checks at load for the built-in engines; the engine classes declare the same as class attributes
(:attr:`phoenix_hpc.engines.base.Engine.recovery_style`, ``supported_recovery_styles``), which the ranks
use; a unit test keeps the two equal. A user engine (``engine: package.module:Class``) is checked against
its class's attributes where its class is imported: at submit and on every rank before MPI starts
(:func:`phoenix_hpc.engines.factory.check_user_code`).
"""

from __future__ import annotations

#: The two ways an engine takes part in a recovery (see :class:`phoenix_hpc.engines.base.Engine`).
RECOVERY_STYLES = ("rebind", "rebuild")
#: Values of ``resilience.recovery_path``.
RECOVERY_PATHS = ("auto", *RECOVERY_STYLES)

#: engine name -> (default style, supported styles). The torch engine keeps no global state and can do
#: both; megatron-core's ``parallel_state`` is global, so the Megatron engine can only be rebuilt.
ENGINE_RECOVERY_STYLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch": ("rebind", ("rebind", "rebuild")),
    "megatron": ("rebuild", ("rebuild",)),
}


def resolve_recovery_path(recovery_path: str, default: str, supported: tuple[str, ...], engine: str) -> str:
    """The recovery style a job runs: ``default`` for ``auto``, else ``recovery_path`` itself.

    Raises:
        ValueError: ``recovery_path`` is not ``auto`` and not in ``supported``; the message names the field,
            the value, the engine and the allowed values.
    """
    if recovery_path == "auto":
        return default
    if recovery_path not in supported:
        allowed = ", ".join(("auto", *supported))
        raise ValueError(
            f"resilience.recovery_path: value {recovery_path!r} is not supported by engine {engine!r} "
            f"(allowed: {allowed})"
        )
    return recovery_path


def recovery_path_of(engine: str, recovery_path: str) -> str | None:
    """:func:`resolve_recovery_path` with a built-in engine's entry of :data:`ENGINE_RECOVERY_STYLES`; None
    for a user engine (its class decides, :func:`recovery_path_of_class`).

    Raises:
        ValueError: see :func:`resolve_recovery_path`.
    """
    if engine not in ENGINE_RECOVERY_STYLES:
        return None
    default, supported = ENGINE_RECOVERY_STYLES[engine]
    return resolve_recovery_path(recovery_path, default, supported, engine)


def recovery_path_of_class(cls, recovery_path: str, engine: str) -> str:
    """:func:`resolve_recovery_path` with the class attributes of engine class ``cls`` (``recovery_style``,
    ``supported_recovery_styles``) named ``engine`` in the config.

    Raises:
        ValueError: see :func:`resolve_recovery_path`.
    """
    return resolve_recovery_path(recovery_path, cls.recovery_style, tuple(cls.supported_recovery_styles), engine)
