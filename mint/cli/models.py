"""`mint models list`: every model a request may name: bases, adapter versions, deployments.
`mint models resources`: what each base in the registry needs in GPUs to train and to serve."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from mint.cli.options import JSON_HELP, Remote, finite, remote
from mint.cli.output import emit

app = typer.Typer(help="Models to evaluate, deploy or chat with.", no_args_is_help=True)

COLUMNS = ["id", "owned_by", "created"]


def row_of(card: Any) -> dict[str, Any]:
    return {"id": card.id, "owned_by": card.owned_by, "created": datetime.fromtimestamp(card.created, UTC)}


@app.command("list")
@remote
def list_models(api: Remote) -> None:
    """Every model your key may call (OpenAI's `/v1/models`): bases, `adapter@version`s and deployments."""
    with api.client() as client:
        cards = client.models.list()
    api.table(cards, COLUMNS, title="models", row=row_of)


RESOURCE_COLUMNS = ["base_model", "parameters", "weights", "lora", "full", "serve"]


def resources_row(row: Any) -> dict[str, Any]:
    """A `BaseResources` for people: sizes, and memory with the GPUs that hold it."""
    from mint.schemas.sizing import billions, memory_cell

    return {
        "base_model": row.base_model,
        "parameters": f"{billions(row.total_billions)} / {billions(row.active_billions)}",
        "weights": f"{row.weights_gib:,.1f} GiB",
        "lora": memory_cell(row.lora_gib, row.lora_gpus),
        "full": memory_cell(row.full_gib, row.full_gpus),
        "serve": memory_cell(row.serve_gib, row.serve_gpus),
    }


@app.command("resources")
def resources(
    names: Annotated[
        list[str] | None,
        typer.Argument(help="Bases to size (default: every base in the registry).", metavar="[NAME]..."),
    ] = None,
    gpu_gib: Annotated[
        float, typer.Option("--gpu-gib", min=1.0, callback=finite, help="Memory of one GPU, in GiB.")
    ] = 80.0,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the table as README.md shows it.")] = False,
) -> None:
    """Memory (GiB) and GPUs each base needs to train with LoRA, to train every parameter
    (FSDP2), and to serve; read from the registry files, no API needed."""
    from mint.config import get_settings
    from mint.schemas.base_models import get_base_model_spec, load_registry
    from mint.schemas.sizing import base_resources, markdown_table

    folder = get_settings().model_configs_dir
    if names:
        specs = [get_base_model_spec(name, folder, include_disabled=True) for name in names]
    else:
        specs = sorted(load_registry(folder).values(), key=lambda spec: spec.parameters.total_billions)
    rows = [base_resources(spec, gpu_gib) for spec in specs]
    if markdown:
        print(markdown_table(rows), end="")
        return
    shown = [row.model_dump() if as_json else resources_row(row) for row in rows]
    emit(
        shown,
        RESOURCE_COLUMNS,
        as_json=as_json,
        title=f"memory and GPUs of {gpu_gib:g} GiB (total / active parameters)",
    )
