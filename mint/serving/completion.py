"""The completion request, one type from the API to a serving node's engine.

The public API builds a `NodeCompletion` once, from OpenAI's body (chat messages or a text
prompt, sampling, stop strings, seed) and the model it resolved (an adapter version, a
mixture revision, or the base alone); it is posted to the node as is (`POST
/internal/v1/complete`, its JSON dump), the eval runner sends its batches as the same type,
and the node's app hands it to `ServingNode`, which routes a mixture to one adapter and
turns the request into the engine's per-row `GenerateRequest` (prompt tokens rendered with
the base's chat template). Nothing here imports torch: the API process uses it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mint.schemas.inference import MAX_COMPLETION_TOKENS, MAX_TOP_LOGPROBS, AdapterOnNode
from mint.serving.mixture import MixtureTarget


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
    mixture: MixtureTarget | None = None
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
