"""The valid part of an invalid job config, so that one bad field does not hide the other checks.

``phoenix submit`` lists every problem of a config at once. Schema problems (wrong types, unknown fields,
values out of range) stop :func:`phoenix_hpc.config.load.load_job_config` before the site checks (grid vs
GPUs per node, node, spare and time limits) can run. :func:`without_invalid_fields` drops each field the
schema refused, so the rest validates with those fields at their defaults, and the site checks can run on
it; problems they report about a dropped field are left out (they would judge the default, not the user's
value). Pure.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from phoenix_hpc.config.schema import JobConfig

MAX_ROUNDS = 5  # dropping fields can reveal relation problems of the defaults; give up after this many


def _drop(data: dict[str, Any], loc: tuple) -> tuple | None:
    """Remove the key at ``loc`` (a pydantic error location) from ``data``, or, when the config does not give
    that key (a relation check failed on a field at its default, because of another one the user set), the
    nearest enclosing key it gives; returns the location removed, None when there is none."""
    for n in range(len(loc), 0, -1):
        node: Any = data
        for key in loc[: n - 1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and loc[n - 1] in node:
            del node[loc[n - 1]]
            return tuple(loc[:n])
    return None


def without_invalid_fields(data: dict[str, Any]) -> tuple[JobConfig | None, list[str], list[str]]:
    """``(config, dropped, revealed)``: ``data`` validated as :class:`JobConfig` after dropping every field the
    schema refused (``dropped``: their dotted paths), or None when it still does not validate (a required
    field is missing, or a relation between the remaining fields is broken). ``revealed``: the problems that
    only showed once the refused fields were gone (relation checks run only on well-typed fields), except
    those that name a dropped field."""
    from phoenix_hpc.config.load import format_validation_error

    data = copy.deepcopy(data)
    dropped: list[str] = []
    revealed: list[str] = []
    for round_ in range(MAX_ROUNDS):
        try:
            return JobConfig.model_validate(data), dropped, revealed
        except ValidationError as exc:
            if round_:
                revealed += [p for p in format_validation_error(exc)
                             if not about_dropped(p, dropped) and p not in revealed]
            locs = [tuple(e["loc"]) for e in exc.errors() if e["loc"] and e["type"] != "missing"]
            gone = [g for g in (_drop(data, loc) for loc in locs) if g is not None]
            if not gone:
                return None, dropped, revealed
            dropped += [".".join(map(str, loc)) for loc in gone]
    return None, dropped, revealed


def relative_data_path(cfg: JobConfig, config_path: str | Path) -> JobConfig:
    """``cfg`` with a relative ``data.path`` (or ``data.blend`` path) made absolute against the config file's
    folder (as :func:`phoenix_hpc.config.load.load_job_config` does)."""
    return cfg.model_copy(update={"data": cfg.data.resolved(Path(config_path).parent)})


def about_dropped(problem: str, dropped: list[str]) -> bool:
    """Whether a site-check ``problem`` names one of the ``dropped`` fields (it judged a default)."""
    return any(d in problem for d in dropped)
