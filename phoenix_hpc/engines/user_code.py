"""Loading the user's own code named in a job config: ``"package.module:attribute"`` references.

Three config fields name user code (docs/engines.md): ``engine`` (an :class:`~phoenix_hpc.engines.base.Engine`
subclass, or the name of an installed entry point in the group ``phoenix_hpc.engines``), ``model.factory``
and ``data.factory`` (callables). Both ``phoenix submit`` and every rank resolve them with this module, with
the same import path: the folders of the config's ``python_path`` (absolute once loaded; a relative entry is
relative to the config file's folder, default ``["."]``, the config file's own folder) are put in front of
``sys.path`` before the import. So a check that passes at submit is the import the ranks will do, provided
the folders are on a file system the compute nodes see.

Every failure raises :class:`~phoenix_hpc.errors.ConfigError` naming the field, the value and what is
expected (the CLI turns it into exit code 2).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any

from phoenix_hpc.errors import ConfigError

#: Entry-point group in which installed packages can register engines by name.
ENTRY_POINT_GROUP = "phoenix_hpc.engines"
#: Engine names built into phoenix_hpc (anything else is user code).
BUILTIN_ENGINES = ("torch", "megatron")


def split_reference(field: str, value: str) -> tuple[str, str]:
    """``"pkg.mod:attr"`` -> ``("pkg.mod", "attr")`` (``attr`` may be dotted: ``Outer.build``). Pure.

    Raises:
        ConfigError: no ``:``, an empty side, or a side that is not a dotted Python identifier.
    """
    mod, sep, attr = value.partition(":")
    ok = sep and all(p.isidentifier() for p in mod.split(".")) and all(p.isidentifier() for p in attr.split("."))
    if not ok:
        raise ConfigError(
            f"{field}: value {value!r} -- expected 'package.module:attribute' (a module importable from "
            "python_path, a colon, then the name of the attribute in it)"
        )
    return mod, attr


def add_python_path(folders: Iterable[str]) -> None:
    """Put ``folders`` (absolute) in front of ``sys.path``, in order, each once (the import path the ranks and
    ``phoenix submit`` use). Idempotent."""
    for f in reversed(list(folders)):
        if f in sys.path:
            sys.path.remove(f)
        sys.path.insert(0, f)


def load_reference(field: str, value: str, python_path: Iterable[str] = ()) -> Any:
    """Import ``value`` (``"pkg.mod:attr"``) with ``python_path`` in front of ``sys.path``; the attribute.

    Raises:
        ConfigError: the reference is malformed, the module does not import (the import error is quoted:
            its type and message), or the module has no such attribute.
    """
    mod_name, attr = split_reference(field, value)
    add_python_path(python_path)
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - any error in the user's module is reported, not raised
        raise ConfigError(
            f"{field}: value {value!r} -- module {mod_name!r} does not import: {type(exc).__name__}: {exc} "
            f"(searched python_path {list(python_path)} and the installed packages)"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{field}: value {value!r} -- module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_callable(field: str, value: str, python_path: Iterable[str] = ()) -> Callable[..., Any]:
    """:func:`load_reference`, then require a callable.

    Raises:
        ConfigError: as :func:`load_reference`, or the attribute is not callable (naming its type).
    """
    obj = load_reference(field, value, python_path)
    if not callable(obj):
        raise ConfigError(f"{field}: value {value!r} -- expected a callable, got a {type(obj).__name__}")
    return obj


def _entry_point(name: str):
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    return found[0] if found else None


def load_engine_class(value: str, python_path: Iterable[str] = ()) -> type:
    """The :class:`~phoenix_hpc.engines.base.Engine` subclass named by the config's ``engine`` field: a
    built-in name (``torch``, ``megatron``), ``"pkg.mod:Class"``, or an entry point of group
    ``phoenix_hpc.engines``.

    Raises:
        ConfigError: an unknown name, a reference that does not load (see :func:`load_reference`), or an
            object that is not an ``Engine`` subclass (or is ``Engine`` itself, which is abstract).
    """
    from phoenix_hpc.engines.base import Engine

    if value == "torch":
        from phoenix_hpc.engines.torch_engine import TorchEngine

        return TorchEngine
    if value == "megatron":
        from phoenix_hpc.engines.megatron_engine import MegatronEngine

        return MegatronEngine
    if ":" in value:
        obj = load_reference("engine", value, python_path)
    else:
        ep = _entry_point(value)
        if ep is None:
            raise ConfigError(
                f"engine: value {value!r} -- expected one of {list(BUILTIN_ENGINES)}, 'package.module:Class', or "
                f"the name of an installed entry point in group {ENTRY_POINT_GROUP!r} (none has this name)"
            )
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(
                f"engine: value {value!r} -- entry point {ep.value!r} does not load: {type(exc).__name__}: {exc}"
            ) from None
    if not (isinstance(obj, type) and issubclass(obj, Engine)) or obj is Engine:
        what = obj.__name__ if isinstance(obj, type) else f"a {type(obj).__name__}"
        raise ConfigError(
            f"engine: value {value!r} -- expected a subclass of phoenix_hpc.engines.base.Engine, got {what}"
        )
    return obj


def is_builtin_engine(value: str) -> bool:
    """Whether ``engine`` names a built-in engine (no user code to import)."""
    return value in BUILTIN_ENGINES
