"""The `mint` command: one module per command group, assembled here.

User commands (datasets, benchmarks, evals, jobs, adapters, deployments, captures, episodes, chat,
models, keys, audit, usage, webhooks, reward-endpoints, reviews) speak HTTP through the SDK and share their
connection and `--json` options (`mint.cli.options`); `mint admin` acts on the database;
`api | worker | beat | serve | up` run the processes; `mint reward-server` serves a team's reward
function, and `mint env-server` a team's verifiers environment, on the team's machine.
Errors Mint raises on purpose print their message, naming commands where the API's names
routes (`mint.cli.hints`), and exit with a code that scripts can trust (see EXIT_CODES);
anything else is a bug and shows a traceback. Waited-for work (a job or eval run with
`--wait`) that does not succeed exits 1."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from mint import errors
from mint.cli import (
    adapters,
    autotune,
    benchmarks,
    captures,
    datasets,
    demo,
    deployments,
    env_server,
    episodes,
    evals,
    jobs,
    models,
    organization,
    processes,
    reviews,
    reward_endpoints,
    reward_server,
    webhooks,
)
from mint.cli.admin import admin
from mint.cli.chat import chat
from mint.cli.hints import in_cli_words
from mint.cli.output import errors as stderr
from mint.cli.usage import usage
from mint.sdk.errors import WaitTimeoutError

app = typer.Typer(
    name="mint", help="Mint: post-train and serve LoRA adapters on your own base models.", no_args_is_help=True
)
app.command("api")(processes.api)
app.command("worker")(processes.worker)
app.command("beat")(processes.beat)
app.command("serve")(processes.serve)
app.command("demo")(demo.demo)
app.command("up")(processes.up)
app.add_typer(datasets.app, name="datasets")
app.add_typer(benchmarks.app, name="benchmarks")
app.add_typer(evals.app, name="evals")
app.add_typer(autotune.app, name="auto")
app.add_typer(jobs.app, name="jobs")
app.add_typer(adapters.app, name="adapters")
app.add_typer(deployments.app, name="deployments")
app.add_typer(captures.app, name="captures")
app.add_typer(episodes.app, name="episodes")
app.command("deploy")(deployments.deploy)
app.command("promote")(deployments.promote)
app.command("rollback")(deployments.rollback)
app.command("chat")(chat)
app.add_typer(models.app, name="models")
app.add_typer(organization.keys, name="keys")
app.command("audit")(organization.audit)
app.add_typer(webhooks.app, name="webhooks")
app.add_typer(reward_endpoints.app, name="reward-endpoints")
app.add_typer(reviews.app, name="reviews")
app.command("usage")(usage)
app.command("reward-server")(reward_server.reward_server)
app.command("env-server")(env_server.env_server)
app.add_typer(admin, name="admin")

# 1 is any other failure; 2 is a usage error (typer/click's own).
EXIT_CODES: dict[type[errors.MintError], int] = {
    errors.NotFound: 3,
    errors.Unauthenticated: 4,
    errors.PermissionDenied: 4,
    errors.Conflict: 5,
    errors.InvalidRequest: 6,
    errors.ServiceUnavailable: 7,
    WaitTimeoutError: 8,  # --wait --timeout gave up; the work goes on
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
        stderr.print(f"[red]error:[/red] {escape(in_cli_words(exc.message))}")
        sys.exit(exit_code_for(exc))
