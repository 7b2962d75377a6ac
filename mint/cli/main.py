"""The `mint` command. Errors Mint raises on purpose print their message and exit with a
code that scripts can trust (see EXIT_CODES); anything else is a bug and shows a traceback."""

from __future__ import annotations

import sys

import typer

from mint import errors
from mint.cli import commands, demo, processes
from mint.cli.admin import admin
from mint.cli.output import errors as stderr

app = typer.Typer(
    name="mint", help="Mint: post-train and serve LoRA adapters on your own base models.", no_args_is_help=True
)
app.command("api")(processes.api)
app.command("worker")(processes.worker)
app.command("beat")(processes.beat)
app.command("serve")(processes.serve)
app.command("demo")(demo.demo)
app.command("up")(processes.up)
app.add_typer(admin, name="admin")
commands.register(app)

# 1 is any other failure; 2 is a usage error (typer/click's own).
EXIT_CODES: dict[type[errors.MintError], int] = {
    errors.NotFound: 3,
    errors.Unauthenticated: 4,
    errors.PermissionDenied: 4,
    errors.Conflict: 5,
    errors.InvalidRequest: 6,
    errors.ServiceUnavailable: 7,
}


def exit_code_for(error: errors.MintError) -> int:
    for cls in type(error).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return 1


def main() -> None:
    try:
        app()
    except errors.MintError as exc:
        stderr.print(f"[red]error:[/red] {exc.message}")
        sys.exit(exit_code_for(exc))
