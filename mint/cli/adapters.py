"""`mint adapters ...`: uploads, adapters, their versions (LoRA adapters or whole models), and downloads."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mint.cli.options import LimitOpt, Remote, first, remote
from mint.cli.output import emit, emit_one, errors, wire

app = typer.Typer(help="Adapters and their versions.", no_args_is_help=True)

LIST_COLUMNS = ["name", "id", "base_model", "versions", "newest", "created_at"]
VERSION_COLUMNS = ["model", "kind", "status", "rank", "size_bytes", "training_job_id", "created_at"]


@app.command("list")
@remote
def list_adapters(api: Remote, limit: LimitOpt = 20) -> None:
    """Adapters of the organization, newest first, with their newest version."""
    with api.client() as client:
        found = first(client.adapters.list, limit)
        versions = {adapter.id: client.adapters.versions(adapter.id) for adapter in found}
    if api.as_json:
        rows = [{**wire(adapter), "versions": [wire(v) for v in versions[adapter.id]]} for adapter in found]
        emit(rows, [], as_json=True)
        return
    rows = [
        {
            "name": adapter.name,
            "id": adapter.id,
            "base_model": adapter.base_model,
            "versions": len(versions[adapter.id]),
            "newest": versions[adapter.id][0].model if versions[adapter.id] else None,
            "created_at": adapter.created_at,
        }
        for adapter in found
    ]
    emit(rows, LIST_COLUMNS, as_json=False, title="adapters")


@app.command("versions")
@remote
def list_versions(api: Remote, name: Annotated[str, typer.Argument(help="The adapter's name (or id).")]) -> None:
    """Every version of an adapter, newest first; `model` is the reference to evaluate or deploy
    (`kind` full: a whole model, evaluated and downloaded but not deployed)."""
    with api.client() as client:
        versions = client.adapters.versions(client.adapters.find(name).id)
    api.table(versions, VERSION_COLUMNS, title=f"versions of {name}")


@app.command("upload")
@remote
def upload(
    api: Remote,
    name: Annotated[str, typer.Argument(help="The adapter's name (new, or existing: a new version).")],
    folder: Annotated[Path, typer.Argument(file_okay=False, help="A PEFT folder (adapter_config.json, safetensors).")],
    base: Annotated[str, typer.Option("--base", help="The base model it was trained on.")],
) -> None:
    """Bring in a LoRA adapter trained elsewhere; a worker of its base then checks that it loads
    (status validating, then ready or invalid: see `mint adapters versions NAME`)."""
    with api.client() as client:
        version = client.adapters.upload(name, base, folder)
    emit_one(wire(version), as_json=api.as_json)


@app.command("download")
@remote
def download(
    api: Remote,
    ref: Annotated[str, typer.Argument(help="name@N, or a name for its newest version.")],
    out: Annotated[Path, typer.Option("--out", file_okay=False, help="The folder to write the version's files into.")],
) -> None:
    """Download a version (checked against its sha256): PEFT files, or a whole model's transformers folder."""
    with api.client() as client:
        version = client.adapters.resolve(ref)
        with errors.status(f"downloading {version.model} ({version.size_bytes} bytes)"):
            folder = client.adapters.download(version, out)
    row = {
        "model": version.model,
        "kind": version.kind,
        "sha256": version.sha256,
        "size_bytes": version.size_bytes,
        "path": str(folder),
    }
    emit_one(row, as_json=api.as_json)
