"""`mint captures ...`: read a captured completion and give feedback on it."""

from __future__ import annotations

from typing import Annotated

import typer

from mint.cli.deployments import capture_row
from mint.cli.options import Remote, remote
from mint.cli.output import human

app = typer.Typer(help="Completions a deployment captured, and feedback on them.", no_args_is_help=True)

CompletionArg = Annotated[str, typer.Argument(help="The completion's id, e.g. chatcmpl-....")]


@app.command("get")
@remote
def get(api: Remote, completion_id: CompletionArg) -> None:
    """A captured completion: what was asked and answered, by which version, and its feedback."""
    with api.client() as client:
        capture = client.captures.get(completion_id)
    api.show(capture, capture_row(capture))


@app.command("feedback")
@remote
def feedback(
    api: Remote,
    completion_id: CompletionArg,
    score: Annotated[float | None, typer.Option("--score", min=0.0, max=1.0, help="How good, 0 to 1.")] = None,
    label: Annotated[str | None, typer.Option("--label", help="A label, e.g. wrong_tool.")] = None,
    comment: Annotated[str | None, typer.Option("--comment", help="Free text.")] = None,
    correct: Annotated[str | None, typer.Option("--correct", help="The answer it should have been (text).")] = None,
) -> None:
    """Say how good a captured answer was, and what it should have been (viewer keys may)."""
    with api.client() as client:
        correction = None
        if correct is not None:
            kind = client.captures.get(completion_id).kind
            correction = {"message": {"role": "assistant", "content": correct}} if kind == "chat" else {"text": correct}
        given = client.captures.feedback(
            completion_id, score=score, label=label, comment=comment, correction=correction
        )
    api.show(given, human(given.model_dump(exclude={"object"})))
