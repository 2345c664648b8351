"""``phoenix config``: the configuration reference, generated from the pydantic models.

``phoenix config reference`` prints every section and field of the job config (type, default, allowed values,
description) as Markdown; ``--format json`` prints the same for scripts; ``--schema site`` documents site
profiles and ``--schema all`` both (the committed ``docs/config-reference.md`` is
``phoenix config reference --schema all``). Exit codes: 0 success, 2 bad option (click's usage error).
"""

from __future__ import annotations

import click

from phoenix_hpc.cli.from_megatron import from_megatron
from phoenix_hpc.config.reference import SCHEMAS, render_json, render_markdown


def schema_names(choice: str) -> list[str]:
    """``all`` -> every schema in :data:`SCHEMAS` (job first); a single name -> ``[name]``."""
    return list(SCHEMAS) if choice == "all" else [choice]


@click.group("config")
def config() -> None:
    """Configuration reference: every job-config and site-profile field, generated from the schema."""


@config.command("reference")
@click.option(
    "--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True,
    help="Markdown tables for people, JSON for scripts.",
)
@click.option(
    "--schema", "schema", type=click.Choice([*SCHEMAS, "all"]), default="job", show_default=True,
    help="job: the job config given to `phoenix submit`; site: site profiles (sites/*.yaml); all: both.",
)
def reference(fmt: str, schema: str) -> None:
    """Print the configuration reference: each section and field with type, default, allowed values
    (bounds and choices) and description, generated from the pydantic models."""
    names = schema_names(schema)
    text = render_markdown(names) if fmt == "markdown" else render_json(names)
    click.echo(text, nl=not text.endswith("\n"))


config.add_command(from_megatron)
