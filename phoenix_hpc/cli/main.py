"""The ``phoenix`` command: a click group whose subcommands live in their own modules.

Subcommands are imported lazily (only the one that runs is imported), so ``phoenix --help`` stays fast and
importing the CLI has no side effects. Exit codes: 0 success; 2 bad input or environment (a
:class:`phoenix_hpc.errors.PhoenixError`, printed without a traceback); 130 interrupted (Ctrl-C); 1 anything
else.
"""

from __future__ import annotations

import importlib
import sys

import click

from phoenix_hpc import __version__
from phoenix_hpc.errors import PhoenixError

#: Exit code after Ctrl-C (SIGINT): 128 + 2, what a shell reports for a command that SIGINT ended.
INTERRUPTED = 130

# name -> "module:attribute" of a click command or group.
SUBCOMMANDS: dict[str, str] = {
    "submit": "phoenix_hpc.cli.submit:submit",
    "cluster": "phoenix_hpc.cli.cluster:cluster",
    "data": "phoenix_hpc.cli.data:data",
    "model": "phoenix_hpc.cli.model:model",
    "config": "phoenix_hpc.cli.config_ref:config",
    "status": "phoenix_hpc.cli.status:status",
    "inject-fault": "phoenix_hpc.cli.inject:inject_fault",
    "drain": "phoenix_hpc.cli.drain:drain",
    "drill": "phoenix_hpc.cli.drill:drill",
    "bench": "phoenix_hpc.cli.bench:bench",
    "demo": "phoenix_hpc.cli.demo:demo",
}


class LazyGroup(click.Group):
    """A click group that imports each subcommand's module only when it is needed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(SUBCOMMANDS))

    def get_command(self, ctx: click.Context, name: str):
        if name in SUBCOMMANDS:
            module, attr = SUBCOMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except PhoenixError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:  # Ctrl-C: 128 + SIGINT, as a shell reports it (click's own Abort exits 1)
            click.echo("interrupted", err=True)
            sys.exit(INTERRUPTED)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="phoenix")
def cli() -> None:
    """PHOENIX: keep Megatron/PyTorch training alive through node failures on Slurm.

    Every step each rank copies its state to host memory (D2H) and replicates its optimizer shard into a
    peer's memory (H2H); when a node dies a spare node of the same job takes its place and training resumes
    from the last committed step.
    """


if __name__ == "__main__":  # ``python -m phoenix_hpc.cli.main ...``: the same CLI as the ``phoenix`` entry point
    cli(prog_name="phoenix")
