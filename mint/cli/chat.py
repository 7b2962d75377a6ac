"""`mint chat MODEL [MESSAGE]`: talk to a base, an adapter version or a deployment."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Annotated, Any

import typer

from mint.cli.options import Remote, finite, remote
from mint.cli.output import errors, wire
from mint.schemas.inference import MAX_COMPLETION_TOKENS


@remote(json_help="Print each whole completion as JSON (one per line) instead of streaming.")
def chat(
    api: Remote,
    model: Annotated[str, typer.Argument(help="A base, adapter@version or deployment name.")],
    message: Annotated[str | None, typer.Argument(help="One message; without it, read lines from stdin.")] = None,
    system: Annotated[str | None, typer.Option("--system", help="A system prompt.")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, max=MAX_COMPLETION_TOKENS)] = 256,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, max=2.0, callback=finite)] = 0.7,
) -> None:
    """Chat with a model: the answer streams as it is generated.

    Without MESSAGE, each line of stdin is a turn of one conversation (an interactive chat at a
    terminal; end it with Ctrl-D).
    """
    history: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    interactive = message is None and sys.stdin.isatty()
    turns = [message] if message is not None else _stdin_lines(interactive)
    with api.client() as client:
        for turn in turns:
            history.append({"role": "user", "content": turn})
            if api.as_json:
                completion = client.chat.create(model, history, max_tokens=max_tokens, temperature=temperature)
                print(json.dumps(wire(completion)), flush=True)
                answer = completion.choices[0]["message"].get("content") or ""
            else:
                streamed = client.chat.create(
                    model, history, stream=True, max_tokens=max_tokens, temperature=temperature
                )
                with streamed as stream:
                    for delta in stream.text_deltas():
                        sys.stdout.write(delta)
                        sys.stdout.flush()
                    answer = stream.text
                sys.stdout.write("\n")
                sys.stdout.flush()
            history.append({"role": "assistant", "content": answer})


def _stdin_lines(interactive: bool) -> Iterable[str]:
    while True:
        if interactive:
            errors.print("[bold]you>[/bold] ", end="")
        line = sys.stdin.readline()
        if not line:
            return
        if line.strip():
            yield line.rstrip("\n")
