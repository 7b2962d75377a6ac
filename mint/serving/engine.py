"""The serving engine contract: adapters in and out of a resident base, batches of requests through it.

An `Engine` holds one base model and up to `max_adapters` LoRA adapters loaded beside it. A
batch of `GenerateRequest`s may mix adapters freely: each request names the adapter that
serves it (`adapter_id`) or None for the base itself. `generate` returns one `GenerateResult`
per request, in order; `stream` yields `StreamEvent`s as tokens are produced, and ends each
request with one event that carries its `finish_reason` and `usage`.

Adapters are PEFT folders (`adapter_config.json` + `adapter_model.safetensors`; safetensors
only, never pickle) or the same content already in memory (`AdapterTensors`). An adapter id is
chosen by the caller, who derives it from the adapter version's content hash: an id always
names the same weights, so adding an id that is already loaded is a no-op.

Two implementations keep this contract and share its tests (`tests/serving/`): the torch
engine (`mint.serving.torch_engine`, any device, MoE LoRA included) and the vLLM engine. This
module imports neither torch nor vLLM, so the API process and the adapter cache policy can
use these types.

Errors are Mint's: an unknown adapter is `NotFound`; a malformed request or adapter is
`InvalidRequest`; adding an adapter when every slot is taken, or removing one that a running
stream still uses, is `Conflict`.
"""

from __future__ import annotations

import abc
import re
import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator, model_validator

from mint.errors import InvalidRequest, NotFound
from mint.schemas.inference import MAX_TOP_LOGPROBS, PromptTokensDetails

if TYPE_CHECKING:
    from mint.trainer.compute_lane import ComputeLane

FinishReason = Literal["stop", "length"]
# The k most likely tokens at one step, most likely first: (token id, logprob) pairs.
TopLogprobs = list[tuple[int, float]]

# Content hashes, `name@version` references and uuids all fit; nothing that could be a path.
_ADAPTER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def check_adapter_id(adapter_id: str) -> str:
    """`adapter_id` if it is a usable id, else InvalidRequest saying what an id may contain."""
    if not isinstance(adapter_id, str) or not _ADAPTER_ID.match(adapter_id):
        raise InvalidRequest(
            f"adapter id {adapter_id!r} must be 1-128 letters, digits or '._:@+-', starting with a letter or digit "
            "(e.g. the adapter version's sha256)",
            param="adapter_id",
        )
    return adapter_id


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GenerateRequest(_Frozen):
    """One completion to generate: a prompt (token ids, or text the engine tokenizes) and how to sample.

    Stopping: the base's end-of-sequence tokens end a request unless `ignore_eos`; any of
    `stop_token_ids` ends it too (the token is kept in the result's tokens); a `stop` string
    ends it when the completion's text contains it (the text is cut before it). Otherwise it
    runs to `max_tokens` (or the base's context length, whichever comes first).
    """

    adapter_id: str | None = Field(
        default=None, description="The loaded adapter that serves this request; None: the base."
    )
    prompt_tokens: list[int] | None = Field(default=None, min_length=1)
    prompt: str | None = Field(default=None, min_length=1, description="Text, tokenized by the engine as is.")
    max_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, description="0 samples greedily.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, description="-1: no limit.")
    seed: int | None = Field(default=None, ge=0, description="The same seed and prompt give the same sample.")
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    top_logprobs: int = Field(
        default=0,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Also return, for every sampled token, the k most likely tokens of its step and their logprobs.",
    )

    @field_validator("stop", mode="before")
    @classmethod
    def _one_string(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("stop")
    @classmethod
    def _no_empty_stop(cls, value: list[str]) -> list[str]:
        if any(not item for item in value):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("prompt_tokens", "stop_token_ids")
    @classmethod
    def _token_ids(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(token < 0 for token in value):
            raise ValueError("token ids must not be negative")
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("top_k must be -1 (no limit) or at least 1")
        return value

    @field_validator("adapter_id")
    @classmethod
    def _adapter_id(cls, value: str | None) -> str | None:
        if value is not None and not _ADAPTER_ID.match(value):
            raise ValueError("adapter_id must be 1-128 letters, digits or '._:@+-', starting with a letter or digit")
        return value

    @model_validator(mode="after")
    def _one_prompt(self) -> GenerateRequest:
        if (self.prompt_tokens is None) == (self.prompt is None):
            raise ValueError("give exactly one of prompt_tokens and prompt")
        return self


class Usage(_Frozen):
    """Tokens read and written for one request."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    # Of the prompt tokens, those read from the engine's prompt cache (OpenAI's shape).
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class GenerateResult(_Frozen):
    """The completion of one request.

    `tokens` holds every sampled token, including the one that ended the request (a stop or
    end-of-sequence token, or the token that completed a stop string); `logprobs[i]` is the
    logprob of `tokens[i]` under the serving model's own distribution (temperature 1), and
    `top_logprobs[i]` (when the request asked for k > 0; empty otherwise) the k most likely
    tokens of that step under the same distribution, most likely first. `text`
    is the completion's text without special tokens, cut before a matched stop string and
    without the text of a matched stop token. `stop_match` is what ended it: a stop string, a
    token id, or None when it ran out of tokens (`finish_reason` "length").
    """

    index: int = Field(ge=0, description="The request's position in the batch.")
    adapter_id: str | None
    tokens: list[int]
    text: str
    logprobs: list[float]
    top_logprobs: list[TopLogprobs] = Field(default_factory=list)
    finish_reason: FinishReason
    stop_match: str | int | None = None
    usage: Usage

    @model_validator(mode="after")
    def _aligned(self) -> GenerateResult:
        if len(self.tokens) != len(self.logprobs) or len(self.tokens) != self.usage.completion_tokens:
            raise ValueError("tokens, logprobs and usage.completion_tokens must agree")
        if self.top_logprobs and len(self.top_logprobs) != len(self.tokens):
            raise ValueError("top_logprobs has one list per token, or none")
        return self


class DecodingRow(Protocol):
    """What an engine keeps of one request while it decodes (the torch engine's rows, vLLM's runs)."""

    index: int
    adapter_id: str | None
    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    top_logprobs: list[TopLogprobs]
    final_text: str
    finish_reason: FinishReason | None
    stop_match: str | int | None
    cached_tokens: int  # prompt tokens read from the prompt cache


def usage_of(row: DecodingRow) -> Usage:
    return Usage(
        prompt_tokens=len(row.prompt),
        completion_tokens=len(row.tokens),
        prompt_tokens_details=PromptTokensDetails(cached_tokens=row.cached_tokens),
    )


def result_of(row: DecodingRow) -> GenerateResult:
    """The result of a row that has finished (its `finish_reason` set)."""
    assert row.finish_reason is not None
    return GenerateResult(
        index=row.index,
        adapter_id=row.adapter_id,
        tokens=list(row.tokens),
        text=row.final_text,
        logprobs=list(row.logprobs),
        top_logprobs=list(row.top_logprobs),
        finish_reason=row.finish_reason,
        stop_match=row.stop_match,
        usage=usage_of(row),
    )


class StreamEvent(_Frozen):
    """New output of one request: the tokens sampled since its last event and the text they add.

    Concatenated in order, a request's `token_ids`, `logprobs`, `top_logprobs` and `text`
    equal its `GenerateResult`'s. Its last event, and only that one, has `finish_reason` and `usage`.
    """

    index: int = Field(ge=0)
    token_ids: list[int] = Field(default_factory=list)
    text: str = ""
    logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[TopLogprobs] = Field(default_factory=list, description="Empty unless the request asked.")
    finish_reason: FinishReason | None = None
    stop_match: str | int | None = None
    usage: Usage | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class AdapterInfo(_Frozen):
    """A loaded adapter, as `Engine.adapters` lists it."""

    adapter_id: str
    rank: int = Field(ge=1)
    size_bytes: int = Field(ge=0, description="Its weights in the engine's dtype.")


@dataclass(frozen=True)
class AdapterTensors:
    """A PEFT adapter already in memory: `adapter_config.json`'s content and the tensors of
    `adapter_model.safetensors`, by their saved keys (`base_model.model.<module>.lora_A.weight`).

    This is what the CPU tier of the adapter cache holds, so that making an adapter servable
    reads no file. `tensors` maps to framework tensors (torch for the torch engine); this module
    does not import torch, hence `Any`.
    """

    config: Mapping[str, Any]
    tensors: Mapping[str, Any] = field(repr=False)


AdapterSource = Path | AdapterTensors


@runtime_checkable
class Engine(Protocol):
    """A resident base serving batches of requests, each on its own adapter or on the base."""

    @property
    def base_model(self) -> str:
        """The registry name of the base this engine serves."""
        ...

    @property
    def max_adapters(self) -> int:
        """How many adapters can be loaded at once."""
        ...

    @property
    def max_batch_size(self) -> int:
        """How many requests decode together; more wait for a place (continuous batching)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The base's tokenizer (a transformers tokenizer), which renders chats into prompts."""
        ...

    @property
    def compute_lane(self) -> ComputeLane | None:
        """The lane whose thread runs this engine's torch work in this process, where the
        process's other torch work (a router's encoder) should run too; None if it has none."""
        ...

    def add_adapter(self, adapter_id: str, source: AdapterSource) -> None:
        """Load a PEFT adapter (folder or tensors) under `adapter_id`; a no-op if that id is loaded.

        InvalidRequest: not a LoRA adapter of this base, or not in safetensors. Conflict: no free slot.
        """
        ...

    def remove_adapter(self, adapter_id: str) -> None:
        """Unload the adapter and free its slot and memory. NotFound if it is not loaded."""
        ...

    def adapters(self) -> list[AdapterInfo]:
        """The loaded adapters, in the order they were added."""
        ...

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        """Run every request to completion; results in request order.

        The whole batch is checked before any work starts: one unknown adapter (NotFound) or
        malformed request (InvalidRequest) fails the call.
        """
        ...

    def stream(self, requests: Sequence[GenerateRequest]) -> Iterator[StreamEvent]:
        """As `generate`, yielding each request's new tokens as soon as they are sampled."""
        ...

    def close(self) -> None:
        """Release what the engine holds beyond this object (adapters, a child process)."""
        ...


class BatchEngine(abc.ABC):
    """What Mint's in-process engines share: the base's name, the slot count, and `generate`
    and `stream` over a batch that is admitted, then run step by step.

    A subclass says how requests become its running entries (`_resolve` checks them under
    `_lock`; `_admit` checks them again and takes them in) and how one step advances them
    (`_run` yields each step's events). Each entry's `result()` is its `GenerateResult`.
    """

    _lock: threading.RLock
    _base_model: str
    _max_adapters: int
    _loaded: dict[str, Any]  # adapter id -> the subclass's record of it
    tokenizer: Any
    vocab_size: int
    context_length: int

    @property
    def base_model(self) -> str:
        return self._base_model

    @property
    def max_adapters(self) -> int:
        return self._max_adapters

    @property
    def compute_lane(self) -> ComputeLane | None:
        return None

    def _checked(self, index: int, request: GenerateRequest) -> tuple[Any, list[int]]:
        """(the record of request `index`'s adapter, None for the base; its prompt tokens, its text
        tokenized as is), checked: NotFound for an adapter not loaded, InvalidRequest for a
        prompt outside the base's vocabulary or context."""
        loaded = None
        if request.adapter_id is not None:
            loaded = self._loaded.get(request.adapter_id)
            if loaded is None:
                raise NotFound(
                    f"request {index}: adapter {request.adapter_id!r} is not loaded on base {self._base_model!r}; "
                    "add it first",
                    param="adapter_id",
                )
        if request.prompt_tokens is not None:
            prompt = list(request.prompt_tokens)
        else:
            prompt = list(self.tokenizer.encode(request.prompt))
            if not prompt:
                raise InvalidRequest(f"request {index}: the prompt text gives no tokens", param="prompt")
        if max(prompt) >= self.vocab_size:
            raise InvalidRequest(
                f"request {index}: token id {max(prompt)} is outside the vocabulary ({self.vocab_size} tokens)",
                param="prompt_tokens",
            )
        if len(prompt) >= self.context_length:
            raise InvalidRequest(
                f"request {index}: the prompt has {len(prompt)} tokens; base {self._base_model!r} reads at most "
                f"{self.context_length} including the completion",
                param="prompt_tokens",
            )
        return loaded, prompt

    @abc.abstractmethod
    def _resolve(self, requests: Sequence[GenerateRequest], *, streaming: bool) -> list[Any]: ...

    @abc.abstractmethod
    def _admit(self, requests: Sequence[GenerateRequest], *, streaming: bool) -> list[Any]: ...

    @abc.abstractmethod
    def _run(self, entries: list[Any]) -> Generator[list[StreamEvent], None, None]: ...

    def generate(self, requests: Sequence[GenerateRequest]) -> list[GenerateResult]:
        """Run the batch to completion; results in request order."""
        entries = self._admit(requests, streaming=False)
        for _ in self._run(entries):
            pass
        return [entry.result() for entry in entries]

    def stream(self, requests: Sequence[GenerateRequest]) -> Iterator[StreamEvent]:
        """Each request's new tokens as every step samples them; closing the iterator cancels the rest."""
        # Checked now, so that a bad batch fails at the call and not at the first next().
        with self._lock:
            self._resolve(requests, streaming=True)
        return self._stream(list(requests))

    def _stream(self, requests: list[GenerateRequest]) -> Iterator[StreamEvent]:
        # Resolved again when iteration starts: an adapter may have been removed in between.
        entries = self._admit(requests, streaming=True)
        steps = self._run(entries)
        try:
            for events in steps:
                yield from events
        finally:
            steps.close()  # a closed stream releases its adapters now, not when collected
