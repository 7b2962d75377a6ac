"""How CLI commands print: human tables by default, JSON with `--json` for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

# soft_wrap: never break a message or a path across lines when output goes to a pipe or a file.
console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, list | tuple):
        return ", ".join(str(item) for item in value)
    return str(value)


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], *, as_json: bool, title: str | None = None) -> None:
    """Print `rows` as a table of `columns`, or as a JSON array with every field."""
    if as_json:
        print(json.dumps(list(rows), default=str, indent=2))
        return
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(_cell(row.get(column)) for column in columns))
    console.print(table)


def emit_one(row: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(row, default=str, indent=2))
    else:
        for key, value in row.items():
            console.print(f"[bold]{key}[/bold]: {_cell(value)}")
