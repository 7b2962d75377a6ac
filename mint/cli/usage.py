"""`mint usage`: the tokens the caller's organization trained, sampled and served, and their cost."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from mint.cli.options import Remote, remote
from mint.cli.output import emit, money

COLUMNS = ["kind", "base_model", "tokens", "records", "cost_usd"]


@remote
def usage(
    api: Remote,
    since: Annotated[datetime | None, typer.Option("--since", help="From this time (UTC), e.g. 2026-01-01.")] = None,
    until: Annotated[datetime | None, typer.Option("--until", help="Before this time (UTC).")] = None,
) -> None:
    """Tokens trained, sampled and served by your organization, per kind and base model, with their cost (any key)."""
    with api.client() as client:
        summary = client.organization.usage(since=since, until=until)
    if api.as_json:
        print(summary.model_dump_json(indent=2))
        return
    rows = [line.model_dump() for line in summary.data]
    emit(rows, COLUMNS, as_json=False, title=f"usage: {money(summary.total_cost_usd)}")
