"""`mint datasets ...`: JSONL uploads for fine-tuning."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mint.cli.options import LimitOpt, Remote, first, remote
from mint.schemas.datasets import DatasetKind

app = typer.Typer(help="Datasets: JSONL uploads for fine-tuning.", no_args_is_help=True)

FIELDS = ["id", "filename", "kind", "row_count", "size_bytes", "sha256", "created_at"]


@app.command("upload")
@remote
def upload(
    api: Remote,
    path: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="A JSONL file.")],
    kind: Annotated[
        DatasetKind | None, typer.Option("--kind", help="The rows' kind (default: read from the first row).")
    ] = None,
) -> None:
    """Upload a JSONL dataset; every row is validated, and a bad row refuses the file (exit 6)."""
    with api.client() as client:
        dataset = client.datasets.upload(path, kind=kind)
    api.show(dataset, FIELDS)


@app.command("list")
@remote
def list_datasets(api: Remote, limit: LimitOpt = 20) -> None:
    """Datasets of the organization, newest first."""
    with api.client() as client:
        rows = first(client.datasets.list, limit)
    api.table(rows, FIELDS, title="datasets")
