"""`mint episodes ...`: the episodes a deployment recorded token-exact, turn by turn, and their
rewards (what online RL trains from)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from mint.cli.options import LimitOpt, Remote, finite, first, remote
from mint.cli.output import cell, console, emit_one, pick, wire
from mint.sdk.errors import BadRequestError

app = typer.Typer(
    help="Episodes of an agent on a deployment, recorded token-exact, and their rewards.", no_args_is_help=True
)

COLUMNS = ["id", "task", "status", "reward", "label", "steps", "tokens", "models", "last_turn_at"]
SUMMARY = [
    "id",
    "deployment_id",
    "task",
    "status",
    "reward",
    "turn_scores",
    "label",
    "comment",
    "rewarded_by",
    "rewarded_at",
    "steps",
    "tokens_in",
    "tokens_out",
    "latency_ms",
    "models",
    "created_at",
    "last_turn_at",
    "expires_at",
]
# What a reward's answer says (it carries no turns, so no tokens or versions either).
REWARD_FIELDS = ["id", "task", "status", "reward", "turn_scores", "label", "comment", "rewarded_by", "rewarded_at"]
KeyArg = Annotated[str, typer.Argument(help="The episode's key (its X-Mint-Episode).")]
# Characters of a message shown per line, and token ids shown per turn, before `...`.
TEXT_WIDTH = 400
IDS_SHOWN = 64


def row_of(episode: Any) -> dict[str, Any]:
    """An episode in a table: its reward, size and the versions that sampled it."""
    return {
        "id": episode.id,
        "task": episode.task,
        "status": episode.status,
        "reward": episode.reward,
        "label": episode.label,
        "steps": episode.steps,
        "tokens": f"{episode.tokens_in} in, {episode.tokens_out} out",
        "models": episode.models,
        "last_turn_at": episode.last_turn_at,
    }


def _short(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= TEXT_WIDTH else text[: TEXT_WIDTH - 3] + "..."


def _content(content: Any) -> str:
    """A message's content as one line: text, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", part)) if isinstance(part, dict) else str(part) for part in content)
    return json.dumps(content)


def message_lines(message: Any, *, added: bool) -> list[str]:
    """A message as people read it: `role: text`, a tool result with the call it answers, and
    each tool call as `calls name(arguments)`; `+ ` marks what the harness added."""
    mark = "+ " if added else ""
    if not isinstance(message, dict):
        return [f"{mark}{_short(json.dumps(message))}"]
    role = str(message.get("role", "?"))
    if role == "tool" and message.get("tool_call_id"):
        role = f"tool ({message['tool_call_id']})"
    lines = []
    text = _content(message.get("content"))
    if text or not message.get("tool_calls"):
        lines.append(f"{mark}{role}: {_short(text)}")
    for call in message.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        lines.append(f"{mark}{role} calls {function.get('name', '?')}({_short(arguments or '')})")
    return lines


def _ids(values: list[Any]) -> str:
    shown = ", ".join(cell(value) for value in values[:IDS_SHOWN])
    return f"[{shown}{', ...' if len(values) > IDS_SHOWN else ''}]"


def turn_lines(episode: Any, *, tokens: bool) -> list[str]:
    """The turns in order: a heading with the version that sampled it and its tokens, the
    messages the harness added before it, the assistant's answer or tool calls; with `tokens`,
    the sampled ids and their logprobs."""
    lines: list[str] = []
    scores = episode.turn_scores or []
    for turn in episode.turns or []:
        heading = (
            f"turn {turn.index + 1}  {turn.id}  {turn.model} (revision {turn.revision})  "
            f"{len(turn.prompt_token_ids)} prompt + {len(turn.token_ids)} sampled tokens  "
            f"{cell(round(turn.latency_ms))} ms  finish {turn.finish_reason or '-'}"
        )
        if turn.index < len(scores):
            heading += f"  score {cell(scores[turn.index])}"
        lines += ["", heading]
        for message in turn.added_messages:
            lines += [f"  {line}" for line in message_lines(message, added=True)]
        if turn.message is not None:
            lines += [f"  {line}" for line in message_lines(turn.message, added=False)]
        if tokens:
            lines.append(f"  prompt ids  {_ids(turn.prompt_token_ids)}")
            lines.append(f"  sampled ids {_ids(turn.token_ids)}")
            lines.append(f"  logprobs    {_ids([round(value, 4) for value in turn.logprobs])}")
    return lines


def reward_line(episode: Any) -> str:
    if episode.reward is None:
        return "reward: none yet (`mint episodes reward KEY SCORE`)"
    line = f"reward: {cell(episode.reward)}"
    if episode.label:
        line += f"  label {episode.label}"
    if episode.rewarded_by:
        line += f"  by {episode.rewarded_by}"
    return line + (f"  ({episode.comment})" if episode.comment else "")


def turn_scores_option(value: str | None) -> list[float] | None:
    """`--turn-scores 0,1,0.5`: one finite number per turn (exit 6 unless they are)."""
    if value is None:
        return None
    try:
        scores = [float(part) for part in value.split(",")]
    except ValueError as exc:
        raise BadRequestError(
            f"--turn-scores takes numbers separated by commas, one per turn (e.g. 0,1): {exc}", param="turn_scores"
        ) from exc
    for score in scores:
        finite(score)
    return scores


@app.command("list")
@remote
def list_episodes(
    api: Remote,
    deployment: Annotated[str, typer.Argument(help="The deployment's name or id.")],
    rewarded: Annotated[
        bool | None, typer.Option("--rewarded/--open", help="Only rewarded episodes, or only open ones.")
    ] = None,
    task: Annotated[str | None, typer.Option("--task", help="Only the episodes of this task.")] = None,
    limit: LimitOpt = 20,
) -> None:
    """A deployment's recorded episodes, newest first: reward, turns, tokens, the versions that sampled them."""
    with api.client() as client:
        rows = first(lambda limit: client.episodes.list(deployment, rewarded=rewarded, task=task, limit=limit), limit)
    api.table(rows, COLUMNS, title=f"episodes of {deployment}", row=row_of)


@app.command("get")
@remote
def get(
    api: Remote,
    key: KeyArg,
    tokens: Annotated[bool, typer.Option("--tokens", help="Also print each turn's token ids and logprobs.")] = False,
) -> None:
    """One episode, turn by turn: the messages the harness added, the assistant's answer or tool
    calls, the tokens and the version that sampled each turn, and the reward."""
    with api.client() as client:
        episode = client.episodes.get(key)
    if api.as_json:
        emit_one(wire(episode), as_json=True)
        return
    emit_one(pick(episode, SUMMARY), as_json=False)
    for line in [*turn_lines(episode, tokens=tokens), "", reward_line(episode)]:
        console.print(line, markup=False, highlight=False)


@app.command("reward")
@remote
def reward(
    api: Remote,
    key: KeyArg,
    score: Annotated[
        float,
        typer.Argument(
            callback=finite, help="The episode's reward, [0, 1] by convention (a negative one after `--`: -- -1)."
        ),
    ],
    label: Annotated[str | None, typer.Option("--label", help="A label, e.g. solved or gave_up.")] = None,
    comment: Annotated[str | None, typer.Option("--comment", help="Free text.")] = None,
    turn_scores: Annotated[
        str | None, typer.Option("--turn-scores", help="One score per turn, in order, e.g. 0,1.")
    ] = None,
) -> None:
    """Reward a finished episode; a later reward replaces it (viewer keys may)."""
    scores = turn_scores_option(turn_scores)
    with api.client() as client:
        given = client.episodes.reward(key, score, turn_scores=scores, label=label, comment=comment)
    api.show(given, REWARD_FIELDS)
