"""`mint models list`: every model a request may name: bases, adapter versions, deployments."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import typer

from mint.cli.options import Remote, remote

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
