"""`mint env-server environment.py`: a team's `verifiers` environment, unmodified, served on the
team's own machine behind Mint's remote environment protocol (`mint.integrations.verifiers`).
Eval runs and RL jobs whose tasks name it (`{"name": "remote", "config": {"endpoint": ...,
"task": ...}}`) play its episodes with Mint's model; its code runs here, never inside Mint."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from mint import errors
from mint.cli.output import console
from mint.cli.output import errors as stderr

# Typer's own code for a usage error: an environment that cannot be served is one.
USAGE_ERROR = 2


def env_server(
    environment: Annotated[
        Path,
        typer.Argument(
            help="The environment's module file, whose __all__ names its verifiers Taskset.", show_default=False
        ),
    ],
    secret: Annotated[
        str | None,
        typer.Option(
            envvar="MINT_ENVIRONMENT_SECRET",
            help="The `whsec_...` secret Mint gave when the endpoint was registered; every request's signature "
            "is checked with it.",
            show_default=False,
        ),
    ] = None,
    python: Annotated[
        str | None,
        typer.Option(
            envvar="MINT_VERIFIERS_PYTHON",
            help="The Python of the virtualenv where verifiers is installed (default: this one).",
            show_default=False,
        ),
    ] = None,
    harness: Annotated[str, typer.Option(help="The verifiers harness that plays each episode.")] = "null",
    taskset_args: Annotated[
        str, typer.Option(help="The taskset config's fields, as JSON (e.g. '{\"num_tasks\": 20}').")
    ] = "{}",
    host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: one the system chooses).")] = 8701,
) -> None:
    """Serve a verifiers environment to Mint's eval runs and RL jobs, on this machine."""
    from mint.integrations.signed_server import check_secret, serve
    from mint.integrations.verifiers import server

    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    try:
        secret = check_secret(secret, server.SECRET_VARIABLE)
        if not environment.is_file():
            raise errors.InvalidRequest(
                f"no file {environment}: give the environment's module file", param="environment"
            )
        try:
            arguments = json.loads(taskset_args)
        except ValueError as exc:
            raise errors.InvalidRequest(f"--taskset-args is not JSON: {exc}", param="taskset_args") from None
        if not isinstance(arguments, dict):
            raise errors.InvalidRequest("--taskset-args must be a JSON object", param="taskset_args")
        process = server.EpisodeProcess(
            environment, python=python or sys.executable, harness=harness, taskset_args=arguments
        )
    except errors.InvalidRequest as exc:
        stderr.print(f"[red]error:[/red] {escape(exc.message)}")
        raise typer.Exit(USAGE_ERROR) from None
    except server.EnvironmentProcessFailed as exc:
        stderr.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from None
    console.print(f"{escape(str(environment))}: {process.tasks} tasks", highlight=False)
    app = server.create_app(process, secret)
    try:
        serve(
            app,
            host=host,
            port=port,
            on_listening=lambda url: console.print(f"listening on {url} (signed requests only)", highlight=False),
        )
    finally:
        process.stop()
