"""``phoenix data``: build training datasets (``prepare``) and show what one holds (``inspect``)."""

from __future__ import annotations

import click

from phoenix_hpc.errors import DataError

DEFAULT_OUT = "data/stdlib"


@click.group()
def data() -> None:
    """Build and inspect training datasets (Megatron indexed .bin/.idx)."""


@data.command("prepare")
@click.argument("src_dir", required=False, type=click.Path(file_okay=False, path_type=str))
@click.argument("out_prefix", required=False, type=click.Path(dir_okay=False, path_type=str))
@click.option("--stdlib", "use_stdlib", is_flag=True, help="read this Python's standard library source instead of SRC_DIR")
@click.option("--max-bytes", type=int, default=None, help="stop after N bytes of text (default: all)")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def prepare(src_dir: str | None, out_prefix: str | None, use_stdlib: bool, max_bytes: int | None, as_json: bool) -> None:
    """Build a byte-level dataset OUT_PREFIX.bin/.idx from the text files under SRC_DIR.

    \b
    phoenix data prepare SRC_DIR OUT_PREFIX [--max-bytes N]
    phoenix data prepare --stdlib OUT_PREFIX [--max-bytes N]
    phoenix data prepare            (= --stdlib data/stdlib)

    Each UTF-8 text file becomes one document of byte tokens (vocabulary 256). Outputs are written under
    temporary names and renamed when complete.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

    if use_stdlib or (src_dir is None and out_prefix is None):
        if out_prefix is not None:
            raise DataError("with --stdlib give only OUT_PREFIX (no SRC_DIR)")
        out_prefix, src_dir = src_dir or DEFAULT_OUT, str(stdlib_dir())
    if not src_dir or not out_prefix:
        raise DataError("need SRC_DIR and OUT_PREFIX (or --stdlib OUT_PREFIX)")
    with Progress(
        TextColumn("[bold]reading"), BarColumn(), MofNCompleteColumn(), TextColumn("files"), TimeElapsedColumn(),
        transient=True, disable=as_json,
    ) as progress:
        task = progress.add_task("files", total=None)

        def on_file(seen: int, total: int) -> None:
            progress.update(task, completed=seen, total=total)

        try:
            result = prepare_dataset(src_dir, out_prefix, max_bytes=max_bytes, on_file=on_file)
        except OSError as exc:  # the output location cannot be written (read-only, a file in the path, ...)
            raise DataError(f"OUT_PREFIX {out_prefix!r}: cannot write the dataset there: "
                            f"{exc.strerror or exc} ({exc.filename})") from None
    if as_json:
        import json

        click.echo(json.dumps(result.__dict__ | {"source": src_dir}))
    else:
        click.echo(
            f"wrote {result.prefix}.bin and {result.prefix}.idx: {result.documents} documents, {result.tokens:,} byte tokens "
            f"from {src_dir} ({result.skipped} non-text files skipped)"
        )


@data.command("inspect")
@click.argument("prefix", type=click.Path(dir_okay=False, path_type=str))
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON")
def inspect(prefix: str, as_json: bool) -> None:
    """Show what the dataset PREFIX.bin/.idx holds: documents, tokens and the vocabulary it needs.

    The smallest model.vocab_size that fits is the largest token id + 1 (256 for the byte-level datasets of
    `phoenix data prepare`).
    """
    from phoenix_hpc.data.summary import summarize_dataset

    s = summarize_dataset(prefix)
    if as_json:
        import json

        click.echo(json.dumps(s.to_json()))
        return
    click.echo(f"{s.prefix}.bin/.idx: {s.documents:,} documents, {s.sequences:,} sequences, {s.tokens:,} tokens "
               f"({s.dtype})")
    click.echo(f"vocabulary: {s.distinct_tokens:,} distinct token ids, largest {s.max_token_id}; "
               f"needs model.vocab_size >= {s.min_vocab_size}")
