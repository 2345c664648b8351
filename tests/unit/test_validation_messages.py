"""Validation messages name the field, the value and what is allowed: a field's own check reports the value it
got whatever its shape (a list included); a section's relation check is not followed by the whole section."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError, field_validator, model_validator

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.validation import format_validation_error, parse_model

ROOT = Path(__file__).resolve().parents[2]


class _Section(BaseModel):
    window: int = 0
    low: int = 0
    high: int = 1
    levels: list[str] = ["node"]

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, v):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError("not allowed (allowed: an integer)")
        return v

    @field_validator("levels")
    @classmethod
    def _levels(cls, v):
        if "node" not in v:
            raise ValueError(f"{v!r} must contain 'node'")
        return v

    @model_validator(mode="after")
    def _order(self):
        if self.low > self.high:
            raise ValueError("low must be <= high")
        return self


class _Top(BaseModel):
    section: _Section = _Section()


def _lines(data) -> list[str]:
    with pytest.raises(ValidationError) as exc:
        _Top.model_validate(data)
    return format_validation_error(exc.value)


@pytest.mark.parametrize("value, shown", [([1], "[1]"), ([], "[]"), ("abc", "'abc'"), (None, "None")])
def test_a_fields_own_check_names_the_value_whatever_its_shape(value, shown):
    assert _lines({"section": {"window": value}}) == [f"section.window: value {shown} -- not allowed (allowed: an "
                                                      "integer)"]


def test_a_message_that_starts_with_the_value_names_it_once():
    assert _lines({"section": {"levels": ["switch"]}}) == ["section.levels: ['switch'] must contain 'node'"]


def test_a_sections_relation_check_does_not_repeat_the_section():
    assert _lines({"section": {"low": 5, "high": 1}}) == ["section: low must be <= high"]


def test_a_list_for_the_strikes_window_is_refused_naming_the_value():
    data = yaml.safe_load((ROOT / "examples" / "gpt-small.yaml").read_text())
    data.setdefault("resilience", {})["agreement_strikes_window_steps"] = [1]
    with pytest.raises(ConfigError) as exc:
        parse_model(JobConfig, data, source="cfg.yaml")
    assert [p for p in exc.value.problems if "agreement_strikes_window_steps" in p] == [
        "resilience.agreement_strikes_window_steps: value [1] -- not allowed (allowed: an integer from 0 to "
        "1000000000; 0: never)"]
