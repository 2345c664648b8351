"""The generated configuration reference: its content, the CLI, and the committed docs/config-reference.md.

docs/config-reference.md is the output of ``phoenix config reference --schema all``. When a schema changes,
the committed file is stale and ``test_committed_reference_is_current`` fails; regenerate it with
``PHOENIX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_config_reference.py``.
"""

from __future__ import annotations

import difflib
import json
import os
import typing
from pathlib import Path
from typing import Literal

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict, Field, model_validator

from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.reference import SCHEMAS, allowed_text, describe, render_json, render_markdown
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.profiles.model import SiteProfile

DOC = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"


def _all_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field path of ``model``, walking nested models (independent of the generator's walk)."""
    out = []
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        out.append(path)
        ann = info.annotation
        models = [a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1 and type(None) in typing.get_args(ann):  # an optional section (``Model | None``)
            ann = models[0]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _all_paths(ann, path)
    return out


def _fields(model) -> dict:
    return {f.path: f for sec in describe(model) for f in sec.fields}


# --------------------------------------------------------------------------------------- the committed file

def test_committed_reference_is_current():
    want = render_markdown(list(SCHEMAS))
    if os.environ.get("PHOENIX_UPDATE_GOLDEN") == "1":
        DOC.parent.mkdir(parents=True, exist_ok=True)
        tmp = DOC.with_suffix(".md.tmp")
        tmp.write_text(want)
        tmp.replace(DOC)
    assert DOC.exists(), (
        f"{DOC.name} is missing; create it with PHOENIX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest {__file__}"
    )
    have = DOC.read_text()
    if have != want:
        diff = "".join(difflib.unified_diff(
            have.splitlines(keepends=True), want.splitlines(keepends=True),
            fromfile="docs/config-reference.md (committed)", tofile="generated from the schema", n=1,
        ))
        pytest.fail(
            "docs/config-reference.md is stale: it differs from what the schema generates (the schema changed, or "
            "the file was edited by hand). Regenerate it with\n"
            "  PHOENIX_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_config_reference.py\n"
            "(or: phoenix config reference --schema all > docs/config-reference.md). Difference:\n"
            + diff[:4000],
            pytrace=False,
        )


# ------------------------------------------------------------------------------ content from the real schema

@pytest.mark.parametrize("model", [JobConfig, SiteProfile])
def test_every_field_is_documented(model):
    documented = set(_fields(model))
    missing = [p for p in _all_paths(model) if p not in documented]
    assert not missing, f"fields missing from the reference: {missing}"


def test_every_job_field_has_a_description():
    blank = [p for p, f in _fields(JobConfig).items() if not f.description]
    assert not blank, f"job-config fields without a Field(description=...): {blank}"


def test_job_reference_values_come_from_the_schema():
    f = _fields(JobConfig)
    assert f["name"].required and f["data"].required
    assert f["resilience.k"].default == 1 and f["resilience.k"].constraints == {"ge": 1}
    assert f["training.lr"].constraints == {"gt": 0}
    assert f["engine"].default == "torch" and f["engine"].constraints == {"min_length": 1}
    assert f["python_path"].default == ["."] and f["model.options"].default == {}
    assert f["resilience.placement_levels"].default == ["node", "switch"]
    assert f["resilience.chunk_bytes"].default == JobConfig.model_fields["resilience"].default_factory().chunk_bytes
    assert f["parallelism.dp"].type == "int or null"
    assert f["name"].constraints == {"min_length": 1, "max_length": 128}
    # a mapping of models gets its own section; an optional model too
    paths = [s.path for s in describe(SiteProfile)]
    assert "scheduler.qos_limits.<name>" in paths and "failure_domains.rule" in paths
    assert _fields(SiteProfile)["scheduler.signal_before_end_s"].constraints == {"ge": 0, "le": 65535}


def test_relations_are_listed_from_validator_docstrings():
    md = render_markdown(["job"])
    assert "Checked when loaded:" in md
    assert "`heartbeat_interval_s < heartbeat_timeout_s < collective_timeout_s`" in md


def test_markdown_rows_and_json_agree():
    md = render_markdown(["job"])
    assert "| `resilience.k` | int | `1` | >= 1 |" in md
    assert "| `engine` | str | `\"torch\"` | length >= 1 |" in md
    doc = json.loads(render_json(["job", "site"]))
    assert [s["name"] for s in doc["schemas"]] == ["job", "site"]
    jfields = {f["path"]: f for s in doc["schemas"][0]["sections"] for f in s["fields"]}
    assert jfields["resilience.heartbeat_timeout_s"] == {
        "path": "resilience.heartbeat_timeout_s", "type": "float", "required": False, "default": 10.0,
        "constraints": {"ge": 1.0}, "choices": [], "description": jfields["resilience.heartbeat_timeout_s"]["description"],
    }
    assert set(jfields) == set(_all_paths(JobConfig))


# ------------------------------------------------------------------------------------ generator on a toy model

class _Inner(BaseModel):
    """Inner part. Uses ``code`` and :class:`x.Y`."""

    model_config = ConfigDict(extra="forbid")
    ratio: float = Field(0.5, gt=0, lt=1, description="a | pipe")

    @model_validator(mode="after")
    def _rel(self):
        """``ratio`` is not 0.25."""
        return self


class _Outer(BaseModel):
    """Outer."""

    kind: Literal["a", "b"] = "a"
    tags: list[str] = Field(default_factory=lambda: ["x"])
    inner: _Inner = Field(default_factory=_Inner)
    maybe: _Inner | None = None
    named: dict[str, _Inner] = Field(default_factory=dict)
    must: int = Field(..., ge=3, le=9)


def test_generator_on_a_toy_model():
    secs = describe(_Outer)
    assert [s.path for s in secs] == ["", "inner", "maybe", "named.<name>"]
    f = {x.path: x for s in secs for x in s.fields}
    assert f["kind"].choices == ("a", "b") and f["kind"].type == "str"
    assert f["tags"].default == ["x"] and f["tags"].type == "list of str"
    assert f["inner"].type == "section" and f["inner"].default == {"ratio": 0.5}
    assert f["maybe"].type == "section or null" and f["maybe"].default is None
    assert f["named"].type == "map of str to section"
    assert f["must"].required and allowed_text(f["must"]) == ">= 3; <= 9"
    assert allowed_text(f["inner.ratio"]) == "> 0; < 1"
    assert secs[1].description == "Inner part. Uses `code` and `x.Y`."
    assert secs[1].checks == ("`ratio` is not 0.25.",)
    assert secs[0].checks == ()


def test_describe_rejects_a_non_model():
    with pytest.raises(TypeError):
        describe(dict)


# ------------------------------------------------------------------------------------------------------ CLI

def test_cli_prints_the_generated_reference():
    r = CliRunner().invoke(cli, ["config", "reference"])
    assert r.exit_code == 0, r.output
    assert r.output == render_markdown(["job"])
    r = CliRunner().invoke(cli, ["config", "reference", "--schema", "all"])
    assert r.exit_code == 0 and r.output == render_markdown(list(SCHEMAS))
    r = CliRunner().invoke(cli, ["config", "reference", "--format", "json", "--schema", "site"])
    assert r.exit_code == 0
    assert json.loads(r.output)["schemas"][0]["name"] == "site"


@pytest.mark.parametrize("args", [["--format", "xml"], ["--schema", "nope"]])
def test_cli_bad_option_exits_2_and_names_it(args):
    r = CliRunner().invoke(cli, ["config", "reference", *args])
    assert r.exit_code == 2
    assert args[0] in r.output and args[1] in r.output
    assert "Traceback" not in r.output


# ------------------------------------------------------------------------------------------ docs/sites.md

def test_site_profile_example_in_docs_is_valid(tmp_path):
    """The complete example of docs/sites.md loads as a site profile (the doc cannot drift from the schema)."""
    import re

    from phoenix_hpc.profiles import load_profile

    text = (DOC.parent / "sites.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if b.startswith("name:")]
    assert len(blocks) == 1, "docs/sites.md should hold one complete profile example (a yaml block starting name:)"
    f = tmp_path / "example.yaml"
    f.write_text(blocks[0])
    prof = load_profile(str(f))
    assert prof.name == "mycluster" and prof.failure_domains.source == "rule"
