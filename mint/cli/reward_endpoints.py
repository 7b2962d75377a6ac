"""`mint reward-endpoints ...`: the reward servers `remote` graders call, by name, and their
signing secrets. The secret is printed once, by `create` and `rotate-secret`."""

from __future__ import annotations

from typing import Annotated

import typer

from mint.cli.options import LimitOpt, Remote, first, remote

app = typer.Typer(help="Reward endpoints: reward servers that remote graders call.", no_args_is_help=True)

COLUMNS = ["id", "name", "url", "description"]
SECRET_COLUMNS = [*COLUMNS, "secret"]
EndpointArg = Annotated[str, typer.Argument(help="The endpoint's id (rwe_...) or name.")]


@app.command("create")
@remote
def create(
    api: Remote,
    name: Annotated[
        str, typer.Argument(help='The name graders use: {"type": "remote", "config": {"endpoint": NAME}}.')
    ],
    url: Annotated[str, typer.Argument(help="Where items to grade are POSTed (http or https).")],
    description: Annotated[str, typer.Option("--description", help="A note for people.")] = "",
) -> None:
    """Add a reward endpoint; prints its signing secret, which is not shown again."""
    with api.client() as client:
        endpoint = client.reward_endpoints.create(name, url, description=description)
    api.show(endpoint, SECRET_COLUMNS)


@app.command("list")
@remote
def list_endpoints(api: Remote, limit: LimitOpt = 20) -> None:
    """The organization's reward endpoints, newest first."""
    with api.client() as client:
        rows = first(client.reward_endpoints.list, limit)
    api.table(rows, COLUMNS, title="reward endpoints")


@app.command("delete")
@remote
def delete(api: Remote, endpoint: EndpointArg) -> None:
    """Remove a reward endpoint: remote graders naming it score 0 from now on, saying why."""
    with api.client() as client:
        removed = client.reward_endpoints.delete(endpoint)
    api.show(removed, COLUMNS)


@app.command("rotate-secret")
@remote
def rotate_secret(api: Remote, endpoint: EndpointArg) -> None:
    """Give the endpoint a new signing secret at once; prints it."""
    with api.client() as client:
        rotated = client.reward_endpoints.rotate_secret(endpoint)
    api.show(rotated, SECRET_COLUMNS)
