"""`mint datasets ...`: JSONL or parquet uploads for fine-tuning (Mint, TRL, verl or OpenRLHF rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mint.cli.options import LimitOpt, Remote, first, remote
from mint.schemas.datasets import DatasetFormat, DatasetKind
from mint.sdk.files import RowFormat

app = typer.Typer(help="Datasets: JSONL or parquet uploads for fine-tuning.", no_args_is_help=True)

FIELDS = ["id", "filename", "kind", "row_count", "size_bytes", "sha256", "created_at"]


@app.command("upload")
@remote
def upload(
    api: Remote,
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="A JSONL or parquet file.")],
    kind: Annotated[
        DatasetKind | None, typer.Option("--kind", help="The rows' kind (default: read from the first row).")
    ] = None,
    format: Annotated[
        DatasetFormat | None,
        typer.Option("--format", help="mint | trl | verl | openrlhf (default: read from each row's keys)."),
    ] = None,
    input_key: Annotated[str | None, typer.Option("--input-key", help="OpenRLHF's input key (input).")] = None,
    output_key: Annotated[str | None, typer.Option("--output-key", help="OpenRLHF's output key (output).")] = None,
    label_key: Annotated[str | None, typer.Option("--label-key", help="OpenRLHF's label key (label).")] = None,
) -> None:
    """Upload a JSONL or parquet dataset of Mint's, TRL's, verl's or OpenRLHF's rows; every row is
    validated and stored in Mint's shape, and a bad row refuses the file (exit 6)."""
    rows = RowFormat(format=format, input_key=input_key, output_key=output_key, label_key=label_key)
    with api.client() as client:
        dataset = client.datasets.upload(path, kind=kind, rows=rows)
    api.show(dataset, FIELDS)


@app.command("list")
@remote
def list_datasets(api: Remote, limit: LimitOpt = 20) -> None:
    """Datasets of the organization, newest first."""
    with api.client() as client:
        rows = first(client.datasets.list, limit)
    api.table(rows, FIELDS, title="datasets")
