"""Wire types of inference: OpenAI's chat and text completions, and an adapter version as the API
names it to a serving node (the request it forwards is `mint.schemas.node.NodeCompletion`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mint.schemas.common import MAX_SEED, MODEL_REF_PATTERN, FiniteJson, RequestModel
from mint.schemas.episodes import EpisodeMark

MAX_COMPLETION_TOKENS = 4096
# OpenAI's ranges: `top_logprobs` 0-20 (chat), `logprobs` 0-5 (completions; Mint takes up to 20 for both).
MAX_TOP_LOGPROBS = 20
Penalty = Annotated[
    float,
    Field(
        ge=-2.0,
        le=2.0,
        description="OpenAI's range; accepted for compatibility, not applied by Mint's engines.",
    ),
]


class _Lenient(RequestModel):
    # OpenAI clients send fields Mint does not use (user, logit_bias, ...): accepted, ignored.
    model_config = ConfigDict(extra="ignore")


class ChatMessage(RequestModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class _Sampling(_Lenient):
    model: str = Field(
        max_length=300,
        pattern=MODEL_REF_PATTERN,
        description="A base, `adapter@version`, a deployment, or `tinker://<model_id>/sampler_weights/<name>`.",
    )
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_COMPLETION_TOKENS)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_COMPLETION_TOKENS)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    # Choice i of n is sampled with seed + i: still within the 64-bit seeds torch takes.
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    metadata: FiniteJson | None = Field(default=None, description="Routing metadata for mixture deployments.")
    episode: EpisodeMark | None = Field(
        default=None,
        description="The episode this request is a turn of (or the headers X-Mint-Episode and X-Mint-Task): a "
        "deployment whose capture records tokens records it token-exact, for online RL.",
    )

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> list[str] | None:
        stops = [value] if isinstance(value, str) else value
        if stops is not None and (len(stops) > 4 or any(not stop for stop in stops)):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    @property
    def stops(self) -> list[str]:
        """The stop strings as a list (one string is a list of one; none, an empty list)."""
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def token_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 256


class ChatCompletionCreate(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1, max_length=1000)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)
    tool_choice: Any = None
    logprobs: bool | None = Field(
        default=None,
        description="Return each output token's text, bytes and logprob (`choice.logprobs.content`), "
        "under the model's own distribution (temperature 1).",
    )
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="With `logprobs: true`: also the k most likely tokens at each position, most likely first.",
    )

    @property
    def alternatives(self) -> int | None:
        """How many most likely tokens to list at each position; None: no logprobs asked for."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionCreate(_Sampling):
    prompt: str = Field(min_length=1, max_length=200_000)
    logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Return each output token's logprob (the model's own distribution, at temperature 1) "
        "and the k most likely tokens at each position (`choice.logprobs.top_logprobs`; none for 0).",
    )

    @property
    def alternatives(self) -> int | None:
        """How many most likely tokens to list at each position; None: no logprobs asked for."""
        return self.logprobs


class AdapterOnNode(BaseModel):
    """An adapter version as a node needs it: its reference, content hash and object key; `kind`
    full is a whole model (a full-parameter job's), which only a worker of its base runs (evals)."""

    ref: str
    sha256: str
    object_key: str
    kind: Literal["lora", "full"] = "lora"


class Served(BaseModel):
    """Which adapter version served a response (Mint's extension of OpenAI's bodies)."""

    adapter: str | None = Field(description="`name@version`; None when the base itself served.")
    adapter_sha256: str | None
    base_model: str
    deployment: str | None
    revision: int | None
    route: dict[str, Any] | None = Field(description="For a mixture: the router's decision.")


class PromptTokensDetails(BaseModel):
    """OpenAI's breakdown of a request's prompt tokens."""

    cached_tokens: int = Field(default=0, ge=0, description="Prompt tokens read from the prompt cache, not run.")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: Usage
    system_fingerprint: str | None
    mint: Served


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[dict[str, Any]]
    usage: Usage
    system_fingerprint: str | None
    mint: Served


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
