"""Typed models from YAML files: reading a YAML mapping and turning pydantic's validation errors into
messages that name the field, the value and what is allowed (every problem at once, exit code 2).

Used by the job config (:mod:`phoenix_hpc.config.load`) and the site profiles
(:mod:`phoenix_hpc.profiles.load`), the only places that read configuration files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from phoenix_hpc.errors import ConfigError
from phoenix_hpc.files import read_text


# What a value read from YAML is, in the words of a YAML user (for "wrong type" messages).
_YAML_TYPE = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
              dict: "a mapping", type(None): "null"}


def _of_type(value: Any) -> str:
    return _YAML_TYPE.get(type(value), type(value).__name__)


def format_validation_error(exc: ValidationError) -> list[str]:
    """One line per problem: ``field.path: value <v> -- <what is allowed>``; for a value of the wrong type
    also what it is (``resilience.k: value True (a boolean) -- Input should be a valid integer``). A check that
    finds several problems raises one ValueError with one problem per line; each line is a problem of its own."""
    lines = []
    for err in exc.errors():
        for msg in err["msg"].removeprefix("Value error, ").split("\n"):
            lines.append(_problem_line(err, msg))
    return lines


def _problem_line(err: dict[str, Any], msg: str) -> str:
    """The line of one problem ``msg`` of pydantic's error ``err`` (:func:`format_validation_error`)."""
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown field (check the spelling; see the config reference)"
    if err["type"] == "missing":
        return f"{loc}: required field is missing"
    if err["loc"] and err["type"].endswith("_type"):
        return f"{loc}: value {err.get('input')!r} ({_of_type(err.get('input'))}) -- {msg}"
    if err["loc"] and err["type"] != "value_error":
        return f"{loc}: value {err.get('input')!r} -- {msg}"
    # a section's own check gets the section's mapping; a field's check its value (a list too), named
    # once: a message that starts with the value itself (``['switch'] must contain 'node'``) is not prefixed
    field_value = err["loc"] and not isinstance(err.get("input"), dict)
    shown = repr(err.get("input"))
    # a section's relation check that names its field itself (``resilience.k: ...``) is not prefixed again
    return (f"{loc}: value {shown} -- {msg}" if field_value and not msg.startswith(shown)
            else f"{loc}: {msg}" if err["loc"] and not msg.startswith(f"{loc}.") else msg)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error: plain YAML keeps the
    last value silently (``pp: 2`` then ``pp: 4`` would change the grid without a word)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first at line {seen[key].line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, what: str = "config", error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """Parse a YAML mapping from ``path`` (read with :func:`phoenix_hpc.files.read_text`).

    Raises:
        error (ConfigError or a subclass): the file is missing, a directory, unreadable, empty, not UTF-8, not
            YAML, not a mapping, or gives a key twice in one mapping.
    """
    p = Path(path)
    text = read_text(p, what, error=error)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(f"{what} file {str(p)!r} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise error(f"{what} file {str(p)!r} must hold a YAML mapping, got {type(data).__name__}")
    return data


def parse_model(cls: type[BaseModel], data: dict[str, Any], source: str) -> BaseModel:
    """Validate ``data`` as ``cls``; raise :class:`ConfigError` listing every problem."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc), source=source) from None
