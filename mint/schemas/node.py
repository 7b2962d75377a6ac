"""What the API and a serving node say to each other: the request (`NodeCompletion`) and the
reply's lines (`NodeLine`).

The public API builds a `NodeCompletion` once, from OpenAI's body (chat messages or a text
prompt, sampling, stop strings, seed) and the model it resolved (an adapter version, a
mixture revision, or the base alone); it is posted to the node as is (`POST
/internal/v1/complete`, its JSON dump), the eval runner sends its batches as the same type,
and the node's app hands it to its `ServingNode`, which routes a mixture to one adapter and
turns the request into the engine's per-row requests (prompt tokens rendered with the base's
chat template).

A mixture travels as a `NodeMixture`: its revision, its routing spec and its adapters'
versions. The spec's own type, `MixtureSpec`, and its validation are serving's
(`MixtureTarget` there is a `NodeMixture` whose spec is a `MixtureSpec`, and is what the API
and the eval runner send); here the spec is its JSON object, which the node validates when it
builds the revision's router.

The node answers with JSON lines (one per line, `application/x-ndjson`): first what served
the request (`NodeServedLine`), then one `NodeChoiceLine` per batch of new tokens of one
choice, the last of a choice with its finish reason and usage (and, for chat messages, the
assistant message, tool calls parsed). A line holds only the keys the node sets: optional
ones are left out, not null (`exclude_unset` on the way out), as the wire always had them.

Pydantic only: the API process, the eval runner and the node all import this.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, TypeAdapter, model_validator

from mint.schemas.inference import MAX_COMPLETION_TOKENS, MAX_TOP_LOGPROBS, AdapterOnNode, Usage

# ---- the request ---------------------------------------------------------------------------------


class NodeMixture(BaseModel):
    """A mixture deployment's revision as the API names it to a node: its id (the node keeps one
    router per revision), its routing spec, and each adapter reference's version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    revision_id: str = Field(min_length=1, max_length=200)
    spec: dict[str, Any] = Field(description="The revision's routing spec (serving's MixtureSpec), as JSON.")
    versions: dict[str, AdapterOnNode] = Field(description="Every model reference the spec names -> its version.")


class NodeCompletion(BaseModel):
    """What a node generates: the prompt, what serves it (an adapter, a mixture, or the base), how to sample.

    `messages` are OpenAI chat messages (a developer message already given the system role)
    rendered with the base's chat template and `tools`; `prompt` is text continued as is.
    `n` choices are sampled, choice i with seed `seed + i`. `stream` asks the node for its
    JSON lines as they come rather than one list at the end. `logprobs` asks for each token's
    text, bytes and logprob in those lines (OpenAI's chat entries, which the node can name
    since it has the tokenizer), with the `top_logprobs` most likely tokens of each step.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    adapter: AdapterOnNode | None = None
    # Serialized as what it is: serving's MixtureTarget dumps its validated spec.
    mixture: SerializeAsAny[NodeMixture] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict, description="Routing metadata for a mixture.")
    max_tokens: int = Field(ge=1, le=MAX_COMPLETION_TOKENS)
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)
    prompt_token_ids: bool = Field(
        default=False, description="Send the prompt's ids as the engine rendered them on each choice's last line."
    )

    @model_validator(mode="after")
    def _one_prompt_one_target(self) -> NodeCompletion:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of messages and prompt")
        if self.adapter is not None and self.mixture is not None:
            raise ValueError("give an adapter or a mixture, not both")
        return self

    def choice(self, index: int) -> NodeCompletion:
        """The request of choice `index` of `n`: seeded `seed + index`, so choices differ but repeat."""
        return self.model_copy(update={"seed": None if self.seed is None else self.seed + index})


# ---- the reply's lines ---------------------------------------------------------------------------


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServedBy(_Line):
    """What served a request: the adapter version (None for the base) and, for a mixture, the
    router's decision (serving's RouteDecision, as JSON)."""

    adapter: str | None
    sha256: str | None
    route: dict[str, Any] | None


class NodeServedLine(_Line):
    """The first line of every reply: `{"served": {...}}`."""

    served: ServedBy


class TokenLogprob(_Line):
    """One token as OpenAI's chat logprobs name it: its text, logprob and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobEntry(TokenLogprob):
    """A sampled token's entry, with its step's most likely tokens (empty unless asked for)."""

    top_logprobs: list[TokenLogprob]


class NodeChoiceLine(_Line):
    """New tokens of one choice. `logprobs_content` is present when the request asked for
    logprobs; `finish_reason` and `usage` on the choice's last line only, with `message` (the
    OpenAI assistant message) when the request was chat messages, and `prompt_token_ids` (the
    prompt as the engine rendered it) when the request asked for them."""

    choice: int = Field(ge=0)
    text: str
    token_ids: list[int]
    logprobs: list[float]
    logprobs_content: list[TokenLogprobEntry] | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    message: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


NodeLine = NodeServedLine | NodeChoiceLine
NODE_LINE: TypeAdapter[NodeLine] = TypeAdapter(NodeLine)


def node_line_json(line: NodeLine) -> str:
    """One line of the reply as the node writes it: the keys it set, in order, and a newline."""
    return json.dumps(line.model_dump(exclude_unset=True), default=str) + "\n"
