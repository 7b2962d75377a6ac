"""How every `mint` command prints: tables or a few lines for people, JSON with `--json` for
scripts.

Tables fit the terminal (or 80 columns in a pipe, or $COLUMNS) without losing a column:
columns people copy into the next command (ids, names, model references) stay whole, and
the others fold onto more lines, but never below the width of their header or of a short
word such as a status, a method or `12/300`. When even that cannot fit, each row prints as
a block of `column  value` lines instead (as psql's expanded display does), so that every
column of every row is still there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

# soft_wrap: never break a message or a path across lines when output goes to a pipe or a file.
console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)

# Columns people copy into the next command: printed whole, never folded (and every `..._id`).
WHOLE_COLUMNS = frozenset({"id", "name", "fine_tuned_model", "newest", "model", "ref"})
# Amounts in dollars whose names do not say `usd`.
MONEY_COLUMNS = frozenset({"cost", "spent", "price"})
# A folded column keeps at least its header's width, and that of its longest word up to this.
WORD_WIDTH_CAP = 16


def whole(column: str) -> bool:
    """Whether a column is one people copy into the next command (never folded)."""
    return column in WHOLE_COLUMNS or column.endswith("_id")


def cell(value: Any, column: str = "") -> str:
    """A value as a table shows it: `-` for none, times to the second, lists and mappings
    joined, amounts in columns named in dollars (`cost_usd`, `trained_usd_per_million`) as
    money, and other numbers in plain decimals (never `1.2e-05`)."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, list | tuple):
        return ", ".join(cell(item) for item in value)
    if isinstance(value, dict):
        return ", ".join(f"{key}={cell(item, str(key))}" for key, item in value.items())
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and ("usd" in column.split("_") or column in MONEY_COLUMNS)
    ):
        return money(value)
    if isinstance(value, float):
        return decimal(value)
    return str(value)


def money(usd: float) -> str:
    """Dollars as people read them: cents at least, and the digits of a fraction of a cent
    (`$0.000012`), never scientific notation."""
    text = f"{abs(usd):,.6f}".rstrip("0")
    whole_part, _, fraction = text.partition(".")
    return ("-" if usd < 0 else "") + f"${whole_part}.{fraction.ljust(2, '0')}"


def decimal(number: float) -> str:
    """A float in plain decimals, at most six of them (`0.000012`, `1.5`, `3`)."""
    if number != number or number in (float("inf"), float("-inf")):
        return str(number)
    text = f"{number:.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def wire(item: BaseModel) -> dict[str, Any]:
    """The object as the API sent it (times as the schema writes them)."""
    return item.model_dump(mode="json")


def human(row: dict[str, Any]) -> dict[str, Any]:
    """Unix times (OpenAI-shaped objects) as dates, for people."""
    return {
        key: datetime.fromtimestamp(value, UTC) if key.endswith("_at") and isinstance(value, int) else value
        for key, value in row.items()
    }


def pick(item: BaseModel, fields: Iterable[str]) -> dict[str, Any]:
    """The named fields of an API object, for people."""
    row = item.model_dump()
    return human({field: row.get(field) for field in fields})


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[str], *, as_json: bool, title: str | None = None) -> None:
    """Print `rows` as a table of `columns` that fits the terminal, or as a JSON array with every field."""
    if as_json:
        print(json.dumps(list(rows), default=str, indent=2))
        return
    cells = [[cell(row.get(column), column) for column in columns] for row in rows]
    widths = fit_widths(list(columns), cells, console.width)
    if widths is None:
        _print_expanded(list(columns), cells, title)
        return
    table = _table(title)
    for column, width in zip(columns, widths, strict=True):
        table.add_column(column, width=width, overflow="fold", no_wrap=whole(column))
    for line in cells:
        table.add_row(*line)
    console.print(table)


def emit_one(row: dict[str, Any], *, as_json: bool) -> None:
    """Print one object: `key: value` lines, or JSON."""
    if as_json:
        print(json.dumps(row, default=str, indent=2))
    else:
        for key, value in row.items():
            console.print(f"[bold]{key}[/bold]: {cell(value, key)}")


def warn(warnings: Iterable[str]) -> None:
    """Print what a result should be read with (e.g. a judge the experts disagree with) on
    stderr, one `warning:` line each, after the result itself."""
    for line in warnings:
        errors.print(f"warning: {line}", style="yellow", markup=False, highlight=False)


def _table(title: str | None) -> Table:
    # A rule under the header and spaces between columns: the cheapest frame in width, and
    # lines that `grep` and `awk` read well.
    return Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)


def fit_widths(columns: list[str], cells: list[list[str]], width: int) -> list[int] | None:
    """Widths of the columns so that the table is at most `width` wide, or None if it cannot be.

    Columns that may fold shrink down to their floor (their header and words up to
    WORD_WIDTH_CAP stay whole); whole columns never shrink.
    """
    natural = [max([len(column), *(len(line[index]) for line in cells)]) for index, column in enumerate(columns)]
    floors = [
        natural[index] if whole(column) else max(len(column), _longest_word([line[index] for line in cells]))
        for index, column in enumerate(columns)
    ]
    budget = width - _frame_width(len(columns))
    widths = list(natural)
    excess = sum(widths) - budget
    while excess > 0:
        shrinkable = [index for index in range(len(widths)) if widths[index] > floors[index]]
        if not shrinkable:
            return None
        # The column with the most room above its floor gives way first: dates and messages
        # wrap at their spaces before a model name is cut.
        loosest = max(shrinkable, key=lambda index: (widths[index] - floors[index], widths[index]))
        widths[loosest] -= 1
        excess -= 1
    return widths


def _longest_word(values: list[str]) -> int:
    """The longest word of a column, up to WORD_WIDTH_CAP: narrower, the column would break words."""
    return min(WORD_WIDTH_CAP, max([0, *(len(word) for value in values for word in value.split())]))


def _frame_width(count: int) -> int:
    """Columns a table's padding and separators take beside its cells."""
    table = _table(None)
    for _ in range(count):
        table.add_column(width=1)
    measured = Measurement.get(console, console.options.update_width(10_000), table)
    return measured.maximum - count


def _print_expanded(columns: list[str], cells: list[list[str]], title: str | None) -> None:
    """Each row as `column  value` lines, rows apart: for tables wider than the terminal."""
    if title:
        console.print(f"[bold]{title}[/bold]", highlight=False)
    label_width = max(len(column) for column in columns)
    for number, line in enumerate(cells, start=1):
        console.print(f"[dim]-[ {number} ]-[/dim]", highlight=False)
        for column, value in zip(columns, line, strict=True):
            console.print(f"{column:<{label_width}}  {value}", markup=False, highlight=False)
