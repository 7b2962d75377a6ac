"""`mint reward-server rewards.py:accuracy`: a team's TRL, verl or OpenRLHF reward function,
unmodified, served on the team's own machine behind Mint's remote reward protocol
(`mint.integrations.reward_server`). Mint's `remote` grader calls it; the function runs here, in
this process, never inside Mint."""

from __future__ import annotations

import logging
from typing import Annotated

import typer
from rich.markup import escape

from mint import errors
from mint.cli.output import console
from mint.cli.output import errors as stderr

# Typer's own code for a usage error: a function that cannot be served is one.
USAGE_ERROR = 2


def reward_server(
    function: Annotated[
        str,
        typer.Argument(
            help="The reward function: FILE.py:NAME (loaded by its path; its package is not imported) or MODULE:NAME.",
            show_default=False,
        ),
    ],
    secret: Annotated[
        str | None,
        typer.Option(
            envvar="MINT_REWARD_SECRET",
            help="The `whsec_...` secret Mint gave when the reward endpoint was registered; every request's "
            "signature is checked with it.",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: one the system chooses).")] = 8700,
    style: Annotated[
        str | None,
        typer.Option(help="trl, verl or openrlhf; by default read from the function's parameter names."),
    ] = None,
    reference_column: Annotated[
        str, typer.Option(help="TRL style: the keyword the task's reference is passed as.")
    ] = "solution",
    max_request_bytes: Annotated[
        int, typer.Option(min=1024, max=1024**3, help="Longest request body read; a longer one is answered 413.")
    ] = 32 * 1024 * 1024,
) -> None:
    """Serve a reward function to Mint's remote grader, on this machine."""
    from mint.integrations import reward_server as server
    from mint.integrations.signed_server import check_secret, serve

    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    try:
        if style is not None and style not in server.STYLES:
            raise errors.InvalidRequest(f"unknown style {style!r}: one of {', '.join(server.STYLES)}", param="style")
        secret = check_secret(secret, server.SECRET_VARIABLE)
        loaded = server.load_function(function)
        detected = server.detect_style(loaded, style)
        scorer = server.Scorer(loaded, detected.style, reference_column)
    except errors.InvalidRequest as exc:
        stderr.print(f"[red]error:[/red] {escape(exc.message)}")
        raise typer.Exit(USAGE_ERROR) from None
    console.print(f"{escape(function)}: {detected.style} style ({escape(detected.reason)})", highlight=False)
    app = server.create_app(scorer, secret, max_request_bytes=max_request_bytes)
    serve(
        app,
        host=host,
        port=port,
        on_listening=lambda url: console.print(f"listening on {url} (signed requests only)", highlight=False),
    )
