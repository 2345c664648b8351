"""The configuration reference, generated from the pydantic models (pure; nothing here is hand-copied).

:func:`describe` walks a model class (:class:`~phoenix_hpc.config.schema.JobConfig` or
:class:`~phoenix_hpc.profiles.model.SiteProfile`) and returns one :class:`Section` per nested model, each
with one :class:`FieldDoc` per field: dotted path, type, required or default, constraints (pydantic's
``ge``/``gt``/``le``/``lt``/``min_length``/``max_length``), the choices of a ``Literal`` and the field's
``description``. :func:`render_markdown` and :func:`render_json` turn sections into text; ``phoenix config
reference`` prints them and ``docs/config-reference.md`` is their committed output (a unit test fails when
it is stale).

Relations between fields (validators such as ``heartbeat_interval_s < heartbeat_timeout_s``) are code, not
field metadata; each section's text is the model's docstring, which states them where they apply.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# Which schemas ``phoenix config reference --schema`` knows: name -> (title, "module:attribute").
SCHEMAS: dict[str, tuple[str, str]] = {
    "job": ("Job config (the YAML file given to `phoenix submit`)", "phoenix_hpc.config.schema:JobConfig"),
    "site": ("Site profile (`sites/*.yaml`, or a file given to `--site`)", "phoenix_hpc.profiles.model:SiteProfile"),
}

_CONSTRAINTS = (
    (annotated_types.Ge, "ge", ">="),
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "<="),
    (annotated_types.Lt, "lt", "<"),
)


@dataclass(frozen=True)
class FieldDoc:
    """One field. ``default`` is a JSON value (``None`` = null) and is meaningless when ``required``;
    ``constraints`` maps ``ge``/``gt``/``le``/``lt``/``min_length``/``max_length`` to their bound;
    ``choices`` lists a ``Literal``'s allowed values (empty when any value of ``type`` is allowed)."""

    path: str
    type: str
    required: bool
    default: Any
    constraints: dict[str, Any]
    choices: tuple[Any, ...]
    description: str


@dataclass(frozen=True)
class Section:
    """One model: ``path`` is the dotted prefix of its fields ("" for the top level; ``<name>`` stands for a
    key of a mapping), ``title`` the heading, ``description`` the model's docstring, ``checks`` the docstrings
    of its validators (the relations checked when the model is built)."""

    path: str
    title: str
    description: str
    fields: tuple[FieldDoc, ...] = field(default_factory=tuple)
    checks: tuple[str, ...] = field(default_factory=tuple)


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, BaseModel)


def _strip_none(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)):
            inner = args[0] if len(args) == 1 else typing.Union[tuple(args)]
            return inner, True
    return tp, False


def type_name(tp: Any) -> str:
    """Human name of an annotation: ``int``, ``int or null``, ``list of str``, ``map of str to Limits``."""
    inner, nullable = _strip_none(tp)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if origin is Literal:
        kinds = sorted({type(a).__name__ for a in args})
        name = " or ".join(kinds)
    elif origin in (list, tuple, set, frozenset):
        name = f"list of {type_name(args[0])}" if args else "list"
    elif origin is dict:
        name = f"map of {type_name(args[0])} to {type_name(args[1])}" if args else "map"
    elif origin in (typing.Union, types.UnionType):
        name = " or ".join(type_name(a) for a in args)
    elif _is_model(inner):
        name = "section"
    elif inspect.isclass(inner):
        name = inner.__name__
    else:
        name = str(inner)
    return f"{name} or null" if nullable else name


def _json_value(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value, default=str))


_RST_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data):`~?([^`]+)`")


def _docstring_text(text: str | None) -> str:
    """``text`` on one line, reStructuredText roles and double backticks made Markdown code spans."""
    return _RST_ROLE.sub(r"`\1`", " ".join((text or "").split())).replace("``", "`")


def _docstring(obj: Any) -> str:
    return _docstring_text(inspect.getdoc(obj))


def _checks(model: type[BaseModel]) -> tuple[str, ...]:
    """Docstrings of the model's own validators (model and field validators), in definition order."""
    decs = model.__pydantic_decorators__
    out = []
    for dec in [*decs.model_validators.values(), *decs.field_validators.values()]:
        if dec.cls_ref.split(":")[0] != f"{model.__module__}.{model.__qualname__}":
            continue  # inherited
        text = _docstring(dec.func)
        if text:
            out.append(text)
    return tuple(out)


def _field_doc(path: str, info: Any) -> FieldDoc:
    required = info.is_required()
    if required:
        default = None
    elif info.default_factory is not None:
        default = _json_value(info.default_factory())
    else:
        default = _json_value(info.default if info.default is not PydanticUndefined else None)
    constraints: dict[str, Any] = {}
    for meta in info.metadata:
        for cls, key, _ in _CONSTRAINTS:
            if isinstance(meta, cls):
                constraints[key] = getattr(meta, key)
        if isinstance(meta, annotated_types.MinLen):
            constraints["min_length"] = meta.min_length
        if isinstance(meta, annotated_types.MaxLen):
            constraints["max_length"] = meta.max_length
    inner, _ = _strip_none(info.annotation)
    choices = typing.get_args(inner) if typing.get_origin(inner) is Literal else ()
    description = _docstring_text(info.description)
    if not description and _nested_model(inner) is not None:  # a section field: its model's first sentence
        description = re.split(r"\.\s+(?=[A-Z])", _docstring(_nested_model(inner)))[0].rstrip(".")
    return FieldDoc(
        path=path, type=type_name(info.annotation), required=required, default=default,
        constraints=constraints, choices=tuple(choices), description=description,
    )


def _nested_model(inner: Any) -> type[BaseModel] | None:
    """The model of a section field (``Model``, or the value type of ``dict[str, Model]``), else None."""
    if _is_model(inner):
        return inner
    if typing.get_origin(inner) is dict and _is_model(typing.get_args(inner)[1]):
        return typing.get_args(inner)[1]
    return None


def describe(model: type[BaseModel], prefix: str = "", title: str | None = None) -> list[Section]:
    """Sections of ``model`` and of every model nested in it, depth first, in field order.

    A field whose type is a model (or ``model | None``) gets its own section named by its path; a
    ``dict[str, Model]`` field gets a section named ``path.<name>``. The field itself is still listed in its
    parent's table (type ``section `Model```).

    Raises:
        TypeError: ``model`` is not a pydantic model class.
    """
    if not _is_model(model):
        raise TypeError(f"describe() needs a pydantic model class, got {model!r}")
    own: list[FieldDoc] = []
    nested: list[Section] = []
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        own.append(_field_doc(path, info))
        inner, _ = _strip_none(info.annotation)
        if _is_model(inner):
            nested.extend(describe(inner, path))
        elif typing.get_origin(inner) is dict and _is_model(typing.get_args(inner)[1]):
            nested.extend(describe(typing.get_args(inner)[1], f"{path}.<name>"))
    head = Section(
        path=prefix, title=title or (f"`{prefix}`" if prefix else "Top level"),
        description=_docstring(model), fields=tuple(own), checks=_checks(model),
    )
    return [head, *nested]


def load_schema(name: str) -> tuple[str, type[BaseModel]]:
    """(title, model class) of a schema in :data:`SCHEMAS`.

    Raises:
        KeyError: unknown name (callers check against :data:`SCHEMAS` first).
    """
    import importlib

    title, target = SCHEMAS[name]
    module, attr = target.split(":")
    return title, getattr(importlib.import_module(module), attr)


# ---------------------------------------------------------------------------------------------------- text

def _md(text: str) -> str:
    """Escape a table cell: pipes would end the cell, newlines the row."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _yaml_scalar(value: Any) -> str:
    """A default written as it would be in the YAML file (JSON is valid YAML)."""
    return json.dumps(value)


def allowed_text(doc: FieldDoc) -> str:
    """The "Allowed" cell: Literal choices and numeric / length bounds, e.g. ``>= 1`` or ``one of a, b``."""
    parts = []
    if doc.choices:
        parts.append("one of " + ", ".join(f"`{c}`" for c in doc.choices))
    for _, key, sym in _CONSTRAINTS:
        if key in doc.constraints:
            parts.append(f"{sym} {doc.constraints[key]}")
    if "min_length" in doc.constraints:
        parts.append(f"length >= {doc.constraints['min_length']}")
    if "max_length" in doc.constraints:
        parts.append(f"length <= {doc.constraints['max_length']}")
    return "; ".join(parts)


def _default_text(doc: FieldDoc) -> str:
    if doc.required:
        return "**required**"
    if doc.type == "section":
        return "see its section"
    return f"`{_yaml_scalar(doc.default)}`"


def command_for(schemas: list[str]) -> str:
    """The ``phoenix config reference`` command line that prints ``schemas``."""
    if list(schemas) == list(SCHEMAS):
        return "phoenix config reference --schema all"
    if list(schemas) == ["job"]:
        return "phoenix config reference"
    return "phoenix config reference " + " ".join(f"--schema {n}" for n in schemas)


def render_markdown(schemas: list[str], *, heading_level: int = 1) -> str:
    """Markdown reference of the named schemas (keys of :data:`SCHEMAS`), one table per section.

    Raises:
        KeyError: an unknown schema name.
    """
    h = "#" * heading_level
    out = [
        f"{h} Configuration reference",
        "",
        f"Generated from the pydantic models by `{command_for(schemas)}`; do not edit by hand.",
        "Every field is checked when a file is loaded: an unknown field, a wrong type or a value outside",
        "\"Allowed\" is rejected (exit code 2) with the field's path, the value and what is allowed.",
        "Relations inside one file are listed under \"Checked when loaded\"; relations between the job config",
        "and the site profile (tp x pp x dp = nodes x GPUs per node, QOS/partition limits, failure-domain",
        "levels, replica placement) are checked by `phoenix submit`, before anything is written or submitted.",
        "",
    ]
    for name in schemas:
        title, model = load_schema(name)
        out += [f"{h}# {title}", ""]
        for sec in describe(model):
            out += [f"{h}## {sec.title}", ""]
            if sec.description:
                out += [sec.description, ""]
            if sec.checks:
                out += ["Checked when loaded:", ""] + [f"- {c}" for c in sec.checks] + [""]
            out += ["| Field | Type | Default | Allowed | Description |", "|---|---|---|---|---|"]
            for f in sec.fields:
                out.append(
                    f"| `{_md(f.path)}` | {_md(f.type)} | {_md(_default_text(f))} | {_md(allowed_text(f))} "
                    f"| {_md(f.description)} |"
                )
            out.append("")
    return "\n".join(out)


def render_json(schemas: list[str]) -> str:
    """JSON reference: ``{"schemas": [{"name", "title", "sections": [{"path", "title", "description",
    "fields": [{"path", "type", "required", "default", "constraints", "choices", "description"}]}]}]}``.

    Raises:
        KeyError: an unknown schema name.
    """
    doc = {"schemas": []}
    for name in schemas:
        title, model = load_schema(name)
        doc["schemas"].append({"name": name, "title": title, "sections": [asdict(s) for s in describe(model)]})
    return json.dumps(doc, indent=2) + "\n"
