"""Deployments: `mint deploy | promote | rollback` change what a stable name serves, each
change a revision with its reason; `mint deployments ...` lists them and their revisions."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from mint.cli.options import LimitOpt, ReasonOpt, Remote, first, json_option, remote
from mint.cli.output import human, warn
from mint.schemas.common import MAX_VERSION

app = typer.Typer(help="Deployments and their revisions.", no_args_is_help=True)

COLUMNS = ["name", "id", "status", "revision", "serving", "action", "base_model", "capture"]
CAPTURE_COLUMNS = ["id", "model", "asked", "answered", "tokens", "latency_ms", "feedback", "created_at"]
REVISION_COLUMNS = ["revision", "action", "serving", "reason", "gate", "created_at"]
NameArg = Annotated[str, typer.Argument(help="The deployment's name or id.")]


def row_of(deployment: Any) -> dict[str, Any]:
    """A deployment and what its current revision serves, for people."""
    serving = deployment.serving
    return {
        "name": deployment.name,
        "id": deployment.id,
        "status": deployment.status,
        "revision": deployment.current_revision,
        "serving": (serving.routing.get("model") or deployment.kind) if serving else None,
        "action": serving.action if serving else None,
        "base_model": deployment.base_model,
        "capture": capture_words(deployment.capture),
    }


def capture_words(capture: Any) -> str:
    """`0.2 for 30 d`, `1 for 7 d, tokens` (episodes recorded token-exact), or `off`."""
    if not capture or not capture.rate:
        return "off"
    words = f"{capture.rate:g} for {capture.retention_days} d"
    return words + (", tokens" if capture.tokens else "")


def _last_words(payload: dict[str, Any]) -> str:
    """The last message's (or the prompt's) text, cut short for a table."""
    text = payload.get("prompt") or ""
    messages = payload.get("messages") or [choice.get("message") or {} for choice in payload.get("choices", [])]
    if messages:
        text = messages[-1].get("content") or str(messages[-1].get("tool_calls") or "")
    elif payload.get("choices"):
        text = payload["choices"][0].get("text", "")
    text = str(text).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def capture_row(capture: Any) -> dict[str, Any]:
    """A captured request: what was asked and answered, by which version, and its feedback."""
    scores = [f"{entry.score:g}" for entry in capture.feedback if entry.score is not None]
    labels = [entry.label for entry in capture.feedback if entry.label]
    return human(
        {
            "id": capture.id,
            "model": capture.model,
            "asked": _last_words(capture.request),
            "answered": _last_words(capture.response),
            "tokens": capture.prompt_tokens + capture.completion_tokens,
            "latency_ms": round(capture.latency_ms),
            "feedback": ", ".join(scores + labels) or None,
            "created_at": capture.created_at,
        }
    )


def revision_row(revision: Any) -> dict[str, Any]:
    """A revision: what it served, why, and the gate's verdict, for people."""
    verdict = revision.gate_verdict
    return human(
        {
            "revision": revision.revision,
            "action": revision.action,
            "serving": revision.routing.get("model") or ("mixture" if revision.routing else None),
            "reason": revision.reason or None,
            "gate": ("passed" if verdict.get("passed") else "refused") if verdict else None,
            "created_at": revision.created_at,
        }
    )


@remote
def deploy(
    api: Remote,
    name: Annotated[str, typer.Argument(help="The model name clients will send, e.g. support-prod.")],
    model: Annotated[str, typer.Option("--model", help="The adapter version to serve, e.g. support-bot@3.")],
    gate: Annotated[
        str | None,
        typer.Option("--gate", help='JSON required of every promotion: {"benchmark": ID, "min_pass_rate": 0.8, ...}.'),
    ] = None,
    reason: ReasonOpt = "",
) -> None:
    """Create a deployment serving an adapter version under a stable name (revision 1)."""
    with api.client() as client:
        deployment = client.deployments.create(name, model=model, gate=json_option(gate, "--gate"), reason=reason)
    _show_changed(api, deployment)


def _show_changed(api: Remote, deployment: Any) -> None:
    """A deployment just created or promoted, and what its gate's verdict warns of."""
    api.show(deployment, row_of(deployment))
    verdict = deployment.serving.gate_verdict if deployment.serving else None
    if not api.as_json and verdict:
        warn(verdict.get("warnings") or [])


@remote
def promote(
    api: Remote,
    name: NameArg,
    model: Annotated[str, typer.Option("--model", help="The adapter version to serve now.")],
    reason: ReasonOpt = "",
) -> None:
    """Serve another version under the deployment's name (a gate may refuse it: exit 5)."""
    with api.client() as client:
        deployment = client.deployments.promote(name, model=model, reason=reason)
    _show_changed(api, deployment)


@remote
def rollback(
    api: Remote,
    name: NameArg,
    to_revision: Annotated[
        int | None,
        typer.Option("--to-revision", min=1, max=MAX_VERSION, help="The revision to serve again (the previous one)."),
    ] = None,
    reason: ReasonOpt = "",
) -> None:
    """Serve again what an earlier revision served."""
    with api.client() as client:
        deployment = client.deployments.rollback(name, to_revision=to_revision, reason=reason)
    api.show(deployment, row_of(deployment))


@app.command("list")
@remote
def list_deployments(api: Remote, limit: LimitOpt = 20) -> None:
    """Deployments of the organization, newest first, with what each serves now."""
    with api.client() as client:
        rows = first(client.deployments.list, limit)
    api.table(rows, COLUMNS, title="deployments", row=row_of)


@app.command("get")
@remote
def get(api: Remote, name: NameArg) -> None:
    """A deployment and what its current revision serves."""
    with api.client() as client:
        deployment = client.deployments.get(name)
    api.show(deployment, row_of(deployment))


@app.command("revisions")
@remote
def revisions(api: Remote, name: NameArg) -> None:
    """Every revision of a deployment, newest first: what served, why, and the gate's verdict."""
    with api.client() as client:
        rows = client.deployments.revisions(name)
    api.table(rows, REVISION_COLUMNS, title=f"revisions of {name}", row=revision_row)


@app.command("capture")
@remote
def capture(
    api: Remote,
    name: NameArg,
    rate: Annotated[
        float | None, typer.Option("--rate", min=0.0, max=1.0, help="Share of requests recorded; 0 stops capture.")
    ] = None,
    retention_days: Annotated[
        int | None, typer.Option("--retention-days", min=1, max=3650, help="Days each capture is kept.")
    ] = None,
    tokens: Annotated[
        bool | None,
        typer.Option(
            "--tokens/--no-tokens",
            help="Record the turns of marked episodes (X-Mint-Episode) token-exact, for online RL.",
        ),
    ] = None,
) -> None:
    """Record a share of the requests a deployment serves (audited), and with --tokens the
    episodes its clients mark, token-exact; without options, show it."""
    with api.client() as client:
        if rate is None and retention_days is None and tokens is None:
            deployment = client.deployments.get(name)
        else:
            deployment = client.deployments.set_capture(name, rate=rate, retention_days=retention_days, tokens=tokens)
    api.show(deployment, row_of(deployment))


@app.command("captures")
@remote
def captures(api: Remote, name: NameArg, limit: LimitOpt = 20) -> None:
    """The requests a deployment captured, newest first, with their feedback."""
    with api.client() as client:
        rows = first(lambda limit: client.deployments.captures(name, limit=limit), limit)
    api.table(rows, CAPTURE_COLUMNS, title=f"captures of {name}", row=capture_row)
