"""What the user commands of `mint` share: the connection to the API, `--json`, and the
options and checks that several of them take.

A user command is a function whose first parameter is a `Remote`; `@remote` gives it the
options `--json`, `--base-url` and `--api-key` (declared here once) and builds the `Remote`
from them. The URL comes from `--base-url`, else `MINT_BASE_URL`, else the local API on
`MINT_API_PORT`, else the URL `mint up` writes to `$MINT_HOME/api.url`; the key from
`--api-key`, else `MINT_API_KEY`, else the admin key that `mint up` writes to
`$MINT_HOME/admin.key`.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel

from mint.cli.output import emit, emit_one, errors, pick, wire
from mint.sdk import Mint
from mint.sdk.errors import BadRequestError

JSON_HELP = "Print JSON for scripts."
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        help="The API's URL; else MINT_BASE_URL, else the local API on MINT_API_PORT, else the URL `mint up` "
        "wrote to MINT_HOME.",
        show_default="http://127.0.0.1:8000",
    ),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key", envvar="MINT_API_KEY", help="An API key (default: $MINT_HOME/admin.key).", show_default=False
    ),
]


def finite(value: float | None) -> float | None:
    """A float option's callback: click's ranges let NaN through (every comparison with it is
    false), and no option of Mint's means anything as NaN or infinity."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


LimitOpt = Annotated[int, typer.Option("--limit", min=1, max=1_000_000, help="Most rows to show.")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Wait until it has finished, with a progress bar.")]
TimeoutOpt = Annotated[
    float | None,
    typer.Option("--timeout", min=1.0, help="With --wait: give up after this many seconds (exit 8); the work goes on."),
]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why; kept in the revision and the audit log.")]

# Pages the API serves at most; longer listings take several pages.
PAGE_LIMIT = 100


@dataclass(frozen=True)
class Remote:
    """One user command's connection to the API and its choice of output."""

    base_url: str | None
    api_key: str | None
    as_json: bool

    def client(self) -> Mint:
        return Mint(base_url=self.base_url, api_key=self.api_key)

    def show(self, item: BaseModel, fields: Iterable[str] | dict[str, Any]) -> None:
        """One object: the API's JSON, or for people `fields` of it (or the row given)."""
        if self.as_json:
            emit_one(wire(item), as_json=True)
        else:
            emit_one(fields if isinstance(fields, dict) else pick(item, fields), as_json=False)

    def table(
        self,
        items: Iterable[BaseModel],
        columns: list[str],
        *,
        title: str,
        row: Callable[[Any], dict[str, Any]] | None = None,
    ) -> None:
        """A list: the API's JSON objects whole, or for people a table of `columns` of each
        object (or of `row(object)`)."""
        items = list(items)
        if self.as_json:
            emit([wire(item) for item in items], columns, as_json=True)
        else:
            rows = [row(item) if row else pick(item, columns) for item in items]
            emit(rows, columns, as_json=False, title=title)


CommandT = TypeVar("CommandT", bound=Callable[..., None])


def remote(func: CommandT | None = None, *, json_help: str = JSON_HELP) -> Any:
    """Turn `func(remote: Remote, ...)` into a typer command with `--json`, `--base-url` and
    `--api-key` after its own options (`@remote`, or `@remote(json_help=...)`)."""

    def wrap(func: CommandT) -> Callable[..., None]:
        own = list(inspect.signature(func, eval_str=True).parameters.values())[1:]
        shared = [
            inspect.Parameter(
                "as_json",
                inspect.Parameter.KEYWORD_ONLY,
                default=False,
                annotation=Annotated[bool, typer.Option("--json", help=json_help)],
            ),
            inspect.Parameter("base_url", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=BaseUrlOpt),
            inspect.Parameter("api_key", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ApiKeyOpt),
        ]

        def command(*args: Any, as_json: bool, base_url: str | None, api_key: str | None, **kwargs: Any) -> None:
            func(Remote(base_url=base_url, api_key=api_key, as_json=as_json), *args, **kwargs)

        parameters = [*own, *shared]
        # typeshed's function type has no `__signature__`, the attribute inspect.signature reads first.
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
        command.__name__ = func.__name__
        command.__qualname__ = func.__qualname__
        command.__doc__ = func.__doc__
        command.__module__ = func.__module__
        return command

    return wrap if func is None else wrap(func)


def first(list_method: Callable[..., Iterable[Any]], limit: int) -> list[Any]:
    """The first `limit` items of an SDK listing such as `client.jobs.list`, in pages of at most PAGE_LIMIT."""
    return list(islice(list_method(limit=min(limit, PAGE_LIMIT)), limit))


def grader_option(value: str | None) -> str | dict[str, Any] | None:
    """A grader by name (`numeric`) or as JSON (`{"type": "regex", "config": {...}}`)."""
    if value is None or not value.lstrip().startswith("{"):
        return value
    return json_option(value, "--grader")


def dataset_id(value: str | None, option: str) -> str | None:
    """A dataset id option (`file-...`), refusing a path to a local file with the command that
    makes it a dataset: a user who passes `--file good.jsonl` means that file."""
    if value is not None and not value.startswith("file-") and (Path(value).is_file() or Path(value).suffix):
        raise BadRequestError(
            f"{option} takes a dataset id (file-...), and {value!r} looks like a file on this machine: "
            f"upload it first with `mint datasets upload {value}`, then pass the id it prints",
            param=option.lstrip("-"),
        )
    return value


def json_option(value: str | None, option: str) -> dict[str, Any] | None:
    """An option's JSON object, refused (exit 6) unless it is one."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"{option} is not valid JSON: {exc}", param=option.lstrip("-")) from exc
    if not isinstance(parsed, dict):
        raise BadRequestError(f"{option} must be a JSON object", param=option.lstrip("-"))
    return parsed


def exit_unless_succeeded(status: str, what: str) -> None:
    """Exit 1 when waited-for work did not succeed, so that `&&` chains stop there."""
    if status != "succeeded":
        errors.print(f"[red]{what} {status}[/red]")
        raise typer.Exit(1)
