"""Wire types of the Tinker-compatible routes (`/api/v1/...`), as the official `tinker` SDK sends them.

Two encodings:

- JSON bodies, as pydantic models below. Requests ignore fields Mint does not read (the SDK
  adds fields over time), so a newer client keeps working; responses carry exactly the
  fields the SDK's models declare.
- Protocol Buffers (package `tinker_public`) for the forward/backward request and for the
  results of forward, forward_backward and sample. The codec at the end of this module
  reads and writes those few messages directly in the protobuf wire format, so the API
  needs neither the SDK nor the `protobuf` package. Field numbers are the protocol's.

No torch, no SQLAlchemy: the API process imports this module.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mint.config import Settings
from mint.errors import InvalidRequest, PayloadTooLarge
from mint.schemas.common import ID_PATTERN, LABEL_PATTERN, FiniteJson, RequestModel

# Ids the SDK sends back (sessions, models, samplers, futures): no spaces, slashes or control characters.
Id = Annotated[str, Field(min_length=1, max_length=100, pattern=ID_PATTERN)]
# A seq_id is stored as a 32-bit integer.
SeqId = Annotated[int, Field(ge=1, lt=2**31)]
TtlSeconds = Annotated[int, Field(ge=1, le=10 * 366 * 24 * 3600)]
# The SDK's own defaults for splitting a forward_backward batch: data per request, and the
# request's estimated size (4 bytes a token, each loss input's array bytes).
SDK_MAX_CHUNK_DATA = 1024
SDK_MAX_CHUNK_BYTES = 5_000_000
# Token ids are int32 on Tinker's wire (EncodedTextChunk, StopTokens); the base checks its vocabulary.
TokenId = Annotated[int, Field(ge=0, lt=2**31)]
# Seeds are uint64 in tinker_public.SamplingParams and the SDK passes the caller's int as is;
# torch seeds take the same range.
TinkerSeed = Annotated[int, Field(ge=0, lt=2**64)]
# Most samples of one asample request (all sampled on one worker).
MAX_SAMPLES = 256
# Top-k lists per position: Mint serves none yet (a nonzero k is refused by name); no server
# returns vocabulary-wide lists.
MAX_TOP_K_LOGPROBS = 1000

# ---- JSON request bodies ----------------------------------------------------------------------


class _Request(RequestModel):
    """A request body: unknown fields (newer SDKs, `type` tags) are ignored."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class ClientConfigRequest(_Request):
    sdk_version: str | None = None


class CreateSessionRequest(_Request):
    tags: list[Annotated[str, Field(max_length=200, pattern=LABEL_PATTERN)]] = Field(
        default_factory=list, max_length=100
    )
    user_metadata: FiniteJson | None = None
    sdk_version: str | None = Field(default=None, max_length=50, pattern=LABEL_PATTERN)
    project_id: str | None = None
    display_name: str | None = Field(default=None, max_length=200, pattern=LABEL_PATTERN)


class SessionHeartbeatRequest(_Request):
    session_id: Id


class FinishReason(_Request):
    type: Literal["success", "errored", "interrupted"] = "success"


class FinishSessionRequest(_Request):
    reason: FinishReason = Field(default_factory=FinishReason)
    detail: str | None = Field(default=None, max_length=10_000, pattern=LABEL_PATTERN)


class TelemetryRequest(_Request):
    session_id: str | None = None


class LoraConfig(_Request):
    """Tinker's LoRA switches; `train_mlp` covers dense MLPs and routed experts alike."""

    rank: int = Field(default=32, ge=1, le=1024)
    seed: TinkerSeed | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class OptimizerConfig(_Request):
    type: str = "adamw"


class CreateModelRequest(_Request):
    session_id: Id
    model_seq_id: int = Field(ge=0, lt=1_000_000)
    base_model: str = Field(max_length=200, pattern=ID_PATTERN)
    user_metadata: FiniteJson | None = None
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig = Field(default_factory=OptimizerConfig)


class GetInfoRequest(_Request):
    model_id: Id


class AdamParams(_Request):
    """AdamW's settings for one step. The ceilings are far past any rate that trains (LoRA rates
    are about 1e-5 to 1e-3): they keep every value a number the optimizer can use."""

    learning_rate: float = Field(default=1e-4, ge=0.0, le=1.0)
    beta1: float = Field(default=0.9, ge=0.0, lt=1.0)
    beta2: float = Field(default=0.95, ge=0.0, lt=1.0)
    eps: float = Field(default=1e-12, gt=0.0, le=1.0)
    # Decoupled: a step scales the weights by 1 - learning_rate * weight_decay, kept in [0, 1].
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    # 0: no clipping; a norm above 1e6 would never clip a LoRA gradient.
    grad_clip_norm: float = Field(default=0.0, ge=0.0, le=1e6)


class OptimStepRequest(_Request):
    """`adam_params` is what the SDK sends for Adam; `optimizer_params` carries other families."""

    model_id: Id
    seq_id: SeqId
    adam_params: AdamParams | None = None
    optimizer_params: FiniteJson | None = None


class SaveWeightsRequest(_Request):
    model_id: Id
    seq_id: SeqId
    path: str | None = Field(default=None, max_length=200)
    ttl_seconds: TtlSeconds | None = None
    overwrite: bool = False
    user_metadata: dict[str, str] | None = None


class SaveWeightsForSamplerRequest(_Request):
    model_id: Id
    seq_id: SeqId
    path: str | None = Field(default=None, max_length=200)
    sampling_session_seq_id: int | None = Field(default=None, ge=0, lt=1_000_000)
    kind: Literal["snapshot", "inflight"] = "snapshot"
    ttl_seconds: TtlSeconds | None = None
    user_metadata: dict[str, str] | None = None


class LoadWeightsRequest(_Request):
    """Into a model (`model_id` + `seq_id`), or a new model made by the load (`session_id` +
    `model_seq_id`, the model's first request)."""

    path: str = Field(max_length=1024)
    optimizer: bool = False
    model_id: Id | None = None
    seq_id: SeqId | None = None
    session_id: Id | None = None
    model_seq_id: int | None = Field(default=None, ge=0, lt=1_000_000)
    base_model: str | None = Field(default=None, max_length=200, pattern=ID_PATTERN)
    user_metadata: FiniteJson | None = None
    optimizer_config: OptimizerConfig | None = None
    weights_access_token: str | None = None


class CreateSamplingSessionRequest(_Request):
    session_id: Id
    sampling_session_seq_id: int = Field(ge=0, lt=1_000_000)
    base_model: str | None = Field(default=None, max_length=200, pattern=ID_PATTERN)
    model_path: str | None = Field(default=None, max_length=1024)


class EncodedTextChunk(_Request):
    type: Literal["encoded_text"] = "encoded_text"
    tokens: list[TokenId]


class OtherChunk(_Request):
    """Image and audio chunks: Mint's bases read text only, so these are refused by name."""

    type: Literal["image", "image_asset_pointer", "dmel"]


class ModelInput(_Request):
    chunks: list[EncodedTextChunk | OtherChunk] = Field(max_length=10_000)

    def tokens(self) -> list[int]:
        for chunk in self.chunks:
            if isinstance(chunk, OtherChunk):
                raise InvalidRequest(
                    f"prompt chunks of type {chunk.type!r} are not supported: Mint's bases take text tokens only",
                    param="prompt",
                )
        return [token for chunk in self.chunks if isinstance(chunk, EncodedTextChunk) for token in chunk.tokens]


StopText = Annotated[str, Field(min_length=1, max_length=1000, pattern=r"^[^\x00]+$")]


class SamplingParams(_Request):
    max_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    seed: TinkerSeed | None = None
    stop: StopText | list[StopText] | list[TokenId] | None = None
    # 0 samples greedily; past 100 the distribution is uniform to float precision.
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_k: int = Field(default=-1, ge=-1, lt=2**31)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)


class SampleRequest(_Request):
    sampling_session_id: Id | None = None
    # A sampler's request counter: a clone of a SamplingClient counts from clone_id * 10**9,
    # with clone ids up to 10**9, so up to 10**18 (int64; Mint does not store it).
    seq_id: int | None = Field(default=None, ge=0, lt=2**63)
    num_samples: int = Field(default=1, ge=1, le=MAX_SAMPLES)
    prompt: ModelInput
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    base_model: str | None = None
    model_path: str | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_K_LOGPROBS)
    topk_sample_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_K_LOGPROBS)
    target_prompt_logprobs: FiniteJson | None = None
    prompt_alt_tokens_k: int = Field(default=0, ge=0, le=MAX_TOP_K_LOGPROBS)
    # Checked against the prompt's length by the service.
    prompt_logprobs_last_n: int | None = Field(default=None, ge=1, lt=2**31)
    record_stability_info: bool | None = None


class FutureRetrieveRequest(_Request):
    request_id: Id
    allow_metadata_only: bool = False


class CancelFutureRequest(_Request):
    request_id: Id


class WeightsInfoRequest(_Request):
    tinker_path: str = Field(max_length=1024)


# ---- JSON responses ---------------------------------------------------------------------------


class _Response(BaseModel):
    model_config = ConfigDict(protected_namespaces=())


class ClientConfigResponse(_Response):
    """Feature flags for the SDK: JWT exchange off (API keys only), custom losses client-side."""

    pjwt_auth_enabled: bool = False
    custom_loss_server_side: bool = False
    sample_use_retrieve_futures: bool = False
    sample_join_sampling_session: bool = False
    proto_compress_fwdbwd: bool = False
    # How the SDK splits a forward_backward batch into requests (see `BatchLimits.chunking`).
    fwdbwd_max_chunk_len: int = SDK_MAX_CHUNK_DATA
    fwdbwd_max_chunk_bytes_count: int = SDK_MAX_CHUNK_BYTES


class ClientDynamicConfigResponse(_Response):
    sample_cancel_enabled: bool = True


class HealthResponse(_Response):
    status: Literal["ok"] = "ok"


class SupportedModel(_Response):
    model_name: str
    max_context_length: int | None = None
    trainable: bool = True
    sampleable: bool = True


class GetServerCapabilitiesResponse(_Response):
    supported_models: list[SupportedModel]


class CreateSessionResponse(_Response):
    type: Literal["create_session"] = "create_session"
    session_id: str
    info_message: str | None = None


class SessionHeartbeatResponse(_Response):
    type: Literal["session_heartbeat"] = "session_heartbeat"


class TelemetryResponse(_Response):
    status: Literal["accepted"] = "accepted"


class FinishSessionResponse(_Response):
    session_id: str
    status: Literal["finished"] = "finished"


class CancelFutureResponse(_Response):
    request_id: str
    status: str


class DeleteCheckpointResponse(_Response):
    tinker_path: str
    deleted: bool = True


class UntypedAPIFuture(_Response):
    """What every long operation answers at once; the client then polls `retrieve_future`."""

    request_id: str
    model_id: str | None = None
    sample_sequence_ids: list[str] | None = None


class ModelData(_Response):
    arch: str | None = None
    model_name: str | None = None
    tokenizer_id: str | None = Field(
        default=None, description="A local folder the client's transformers loads the tokenizer from."
    )


class GetInfoResponse(_Response):
    type: Literal["get_info"] = "get_info"
    model_id: str
    model_data: ModelData
    is_lora: bool = True
    lora_rank: int | None = None
    model_name: str | None = None


class CreateSamplingSessionResponse(_Response):
    type: Literal["create_sampling_session"] = "create_sampling_session"
    sampling_session_id: str


class GetSamplerResponse(_Response):
    sampler_id: str
    base_model: str
    model_path: str | None = None


class Checkpoint(_Response):
    checkpoint_id: str
    checkpoint_type: Literal["training", "sampler"]
    time: datetime
    tinker_path: str
    size_bytes: int | None = None
    public: bool = False
    user_metadata: dict[str, str] | None = None
    expires_at: datetime | None = None


class Cursor(_Response):
    offset: int
    limit: int
    total_count: int


class CheckpointsListResponse(_Response):
    checkpoints: list[Checkpoint]
    cursor: Cursor | None = None


class TrainingRun(_Response):
    training_run_id: str
    base_model: str
    model_owner: str
    is_lora: bool = True
    corrupted: bool = False
    lora_rank: int | None = None
    last_request_time: datetime
    last_checkpoint: Checkpoint | None = None
    last_sampler_checkpoint: Checkpoint | None = None
    user_metadata: dict[str, str] | None = None


class TrainingRunsResponse(_Response):
    training_runs: list[TrainingRun]
    cursor: Cursor


class GetSessionResponse(_Response):
    training_run_ids: list[str]
    sampler_ids: list[str]
    user_metadata: dict[str, str] | None = None
    display_name: str | None = None


class ListSessionsResponse(_Response):
    sessions: list[str]


class WeightsInfoResponse(_Response):
    base_model: str
    is_lora: bool = True
    lora_rank: int | None = None
    train_unembed: bool | None = None
    train_mlp: bool | None = None
    train_attn: bool | None = None


# ---- tinker:// paths --------------------------------------------------------------------------

TINKER_SCHEME = "tinker://"
# A checkpoint's name: what save_state and save_weights_for_sampler were given.
CHECKPOINT_NAME = re.compile(r"^[^/\x00-\x1f\x7f]{1,200}$")
PATH_SEGMENTS = {"weights": "training", "sampler_weights": "sampler"}
SEGMENT_OF_KIND = {kind: segment for segment, kind in PATH_SEGMENTS.items()}


@dataclass(frozen=True)
class TinkerPath:
    """`tinker://<model_id>/weights/<name>` (a training state) or `.../sampler_weights/<name>`."""

    model_id: str
    kind: Literal["training", "sampler"]
    name: str

    @classmethod
    def parse(cls, path: str) -> TinkerPath:
        parts = path.removeprefix(TINKER_SCHEME).split("/") if path.startswith(TINKER_SCHEME) else []
        if len(parts) != 3 or parts[1] not in PATH_SEGMENTS or not parts[0] or not parts[2]:
            raise InvalidRequest(
                f"{path[:300]!r} is not a checkpoint path: use tinker://<model_id>/weights/<name> (training state) "
                "or tinker://<model_id>/sampler_weights/<name> (sampler weights), as save_state and "
                "save_weights_for_sampler return them",
                param="path",
            )
        if not re.match(ID_PATTERN, parts[0]) or len(parts[0]) > 100 or not CHECKPOINT_NAME.match(parts[2]):
            raise InvalidRequest(f"{path[:300]!r} names no checkpoint of this server", param="path")
        kind: Literal["training", "sampler"] = "training" if parts[1] == "weights" else "sampler"
        return cls(model_id=parts[0], kind=kind, name=parts[2])

    @property
    def checkpoint_id(self) -> str:
        return f"{SEGMENT_OF_KIND[self.kind]}/{self.name}"

    def __str__(self) -> str:
        return f"{TINKER_SCHEME}{self.model_id}/{self.checkpoint_id}"


# ---- protobuf wire format ---------------------------------------------------------------------
# Wire types: 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit.
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 1, 2, 3, 4
STOP_REASONS = {"stop": 0, "length": 1}
PROTOBUF_MEDIA_TYPE = "application/x-protobuf"


# What one datum or request may hold beyond the limits that are settings: Mint's losses read
# two or three 1-D inputs, and loss_fn_config holds a few numbers.
MAX_LOSS_INPUTS = 32
MAX_LOSS_CONFIG_ENTRIES = 64
MAX_TENSOR_DIMS = 8


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(f"malformed protobuf body: {message}", param="body")


def _text(value: memoryview, field_name: str) -> str:
    """A protobuf `string` field: UTF-8, as the protobuf spec requires."""
    try:
        return str(value, "utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"malformed protobuf body: {field_name} is not valid UTF-8; protobuf strings must be UTF-8 text",
            param=field_name,
        ) from None


def _read_varint(buffer: memoryview, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(buffer):
            raise _bad("truncated varint")
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise _bad("varint longer than 10 bytes")


def _fields(buffer: memoryview) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) for each field of one message: ints for varint fields,
    views of the buffer (never copies) for fixed and length-delimited ones."""
    position = 0
    while position < len(buffer):
        key, position = _read_varint(buffer, position)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, position = _read_varint(buffer, position)
        elif wire == _FIXED64:
            value, position = buffer[position : position + 8], position + 8
        elif wire == _FIXED32:
            value, position = buffer[position : position + 4], position + 4
        elif wire == _LEN:
            size, position = _read_varint(buffer, position)
            value, position = buffer[position : position + size], position + size
        else:
            raise _bad(f"unsupported wire type {wire}")
        if position > len(buffer):
            raise _bad("truncated field")
        yield number, wire, value


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s are ten-byte two's complement, as protobuf writes them
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _len_field(number: int, payload: bytes) -> bytes:
    return _tag(number, _LEN) + _varint(len(payload)) + payload


def _varint_field(number: int, value: int) -> bytes:
    return _tag(number, _VARINT) + _varint(value) if value else b""


def _string_field(number: int, value: str) -> bytes:
    return _len_field(number, value.encode()) if value else b""


def _packed(fmt: str, values: Sequence[float] | Sequence[int]) -> bytes:
    return struct.pack(f"<{len(values)}{fmt}", *values)


def _count(fmt: str, data: memoryview) -> int:
    """How many values of `fmt` a packed array holds, read from its length alone."""
    size = struct.calcsize(fmt)
    if len(data) % size:
        raise _bad(f"a tensor of {len(data)} bytes is not a whole number of {size}-byte values")
    return len(data) // size


@dataclass(frozen=True)
class BatchLimits:
    """What one forward_backward request may hold (settings `tinker_max_*`).

    Decoding turns each packed 4-byte value into a Python int or float of about 36 bytes, and
    each datum into a few objects, so these are checked against the lengths the body declares
    before anything is unpacked: a refused request costs its body and nothing more.
    """

    max_data: int
    max_numbers: int
    max_datum_tokens: int

    @classmethod
    def from_settings(cls, settings: Settings) -> BatchLimits:
        return cls(settings.tinker_max_batch_data, settings.tinker_max_batch_numbers, settings.tinker_max_datum_tokens)

    def chunking(self) -> dict[str, int]:
        """The split the SDK should use so that its requests stay within these limits: its
        estimate counts at least 4 bytes per value, so chunks of `4 * max_numbers` estimated
        bytes hold at most `max_numbers` values (a datum over the estimate travels alone)."""
        return {
            "fwdbwd_max_chunk_len": min(SDK_MAX_CHUNK_DATA, self.max_data),
            "fwdbwd_max_chunk_bytes_count": min(SDK_MAX_CHUNK_BYTES, 4 * self.max_numbers),
        }


class _Budget:
    """Counts what a request's decoding produces, refusing it (413) past its limits. A dry
    budget unpacks nothing: the first pass over a body measures it from its declared lengths."""

    def __init__(self, limits: BatchLimits, *, dry: bool) -> None:
        self.limits = limits
        self.dry = dry
        self.data = 0
        self.numbers = 0

    def unpack(self, fmt: str, data: memoryview) -> list[Any]:
        """The values of a packed array, counted first; none on a dry run."""
        count = _count(fmt, data)
        self.add_numbers(count)
        return [] if self.dry else list(struct.unpack(f"<{count}{fmt}", data))

    def add_datum(self) -> int:
        """The new datum's index."""
        if self.data >= self.limits.max_data:
            raise _too_large(
                f"more than {self.limits.max_data} data",
                "MINT_TINKER_MAX_BATCH_DATA",
                "send fewer sequences per request",
            )
        self.data += 1
        return self.data - 1

    def add_numbers(self, count: int) -> None:
        self.numbers += count
        if self.numbers > self.limits.max_numbers:
            raise _too_large(
                f"more than {self.limits.max_numbers} tokens and loss-input values in all",
                "MINT_TINKER_MAX_BATCH_NUMBERS",
                "send the batch in smaller requests",
            )

    def check_datum_tokens(self, index: int, tokens: int) -> None:
        if tokens > self.limits.max_datum_tokens:
            raise _too_large(
                f"data[{index}] with {tokens} tokens, over {self.limits.max_datum_tokens} per datum",
                "MINT_TINKER_MAX_DATUM_TOKENS",
                "shorten the sequence",
            )


def _too_large(what: str, setting: str, fix: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the forward_backward request holds {what} (the server's limit, {setting}); {fix}. The tinker "
        "SDK splits batches by the sizes that /api/v1/client/config announces",
        param="data",
    )


@dataclass(frozen=True)
class WireTensor:
    """A decoded `Tensor`: its dtype code, shape and flat values (dense only)."""

    dtype: int
    shape: tuple[int, ...]
    values: list[float] | list[int]


@dataclass(frozen=True)
class WireSpan:
    """A decoded provenance run: `length` positions that are positions [offset, offset+length)
    of the named sampled sequence's prompt (`kind` "prompt") or of its sampled tokens ("sampled")."""

    kind: Literal["prompt", "sampled"]
    sequence_id: str
    offset: int
    length: int


@dataclass(frozen=True)
class WireDatum:
    """A decoded `Datum`: its input tokens, loss inputs by name, and provenance (the runs tiling
    `model_input` and `target_tokens`; None when the datum has none)."""

    tokens: list[int]
    loss_fn_inputs: dict[str, WireTensor]
    input_spans: list[WireSpan] | None = None
    target_spans: list[WireSpan] | None = None


@dataclass(frozen=True)
class ForwardBackwardProto:
    """A decoded `ForwardBackwardRequest`."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum] = field(default_factory=list)


def _decode_tensor(buffer: memoryview, name: str, budget: _Budget) -> WireTensor:
    dtype, shape, dense, sparse = 0, [], memoryview(b""), False
    for number, wire, value in _fields(buffer):
        if number == 1 and wire == _LEN:
            dense = value
        elif number == 2:
            sparse = True
        elif number == 3 and wire == _VARINT:
            dtype = value
        elif number == 4:
            if wire == _LEN:  # packed repeated int64
                position = 0
                while position < len(value):
                    item, position = _read_varint(value, position)
                    shape.append(_signed64(item))
            else:
                shape.append(_signed64(value))
            if len(shape) > MAX_TENSOR_DIMS:
                raise InvalidRequest(
                    f"loss_fn_inputs[{name!r}] has more than {MAX_TENSOR_DIMS} dimensions; Mint's losses take "
                    "one value per position (1-D)",
                    param="loss_fn_inputs",
                )
    if sparse:
        raise InvalidRequest(
            f"loss_fn_inputs[{name!r}] is a sparse (2-D) tensor; Mint's losses take one value per position (1-D)",
            param="loss_fn_inputs",
        )
    formats = {DTYPE_FLOAT32: "f", DTYPE_INT64: "q", DTYPE_INT32: "i"}
    if dtype not in formats:
        raise InvalidRequest(
            f"loss_fn_inputs[{name!r}] has dtype code {dtype}; send float32 or int64", param="loss_fn_inputs"
        )
    count = _count(formats[dtype], dense)
    if shape and (min(shape) < 0 or math.prod(shape) != count):
        raise InvalidRequest(
            f"loss_fn_inputs[{name!r}] has shape {shape[:8]} but {count} values; the shape's dimensions "
            "must be non-negative and multiply to the number of values",
            param="loss_fn_inputs",
        )
    values = budget.unpack(formats[dtype], dense)
    return WireTensor(dtype=dtype, shape=tuple(shape) or (count,), values=values)


def _decode_span(buffer: memoryview) -> WireSpan:
    for number, wire, value in _fields(buffer):
        if number in (1, 2) and wire == _LEN:  # oneof: prompt_tokens | sampled_tokens
            sequence_id, offset, length = "", 0, 0
            for span_number, span_wire, span_value in _fields(value):
                if span_number == 1 and span_wire == _LEN:
                    sequence_id = _text(span_value, "provenance sequence_id")
                elif span_number == 2 and span_wire == _VARINT:
                    offset = _signed64(span_value)
                elif span_number == 3 and span_wire == _VARINT:
                    length = _signed64(span_value)
            if not sequence_id or offset < 0 or length < 0:
                raise _bad("a provenance span needs a sequence_id, offset >= 0 and length >= 0")
            return WireSpan("prompt" if number == 1 else "sampled", sequence_id, offset, length)
    raise _bad("a provenance span is neither a prompt nor a sampled run")


def _decode_datum(buffer: memoryview, budget: _Budget) -> WireDatum:
    index = budget.add_datum()
    tokens: list[int] = []
    token_count = 0
    inputs: dict[str, WireTensor] = {}
    spans: dict[int, list[WireSpan]] = {}
    for number, wire, value in _fields(buffer):
        if number == 1 and wire == _LEN:  # Chunk
            for chunk_number, chunk_wire, chunk in _fields(value):
                if chunk_number == 1 and chunk_wire == _LEN:  # EncodedTextChunk
                    for token_number, token_wire, packed in _fields(chunk):
                        if token_number == 1 and token_wire == _LEN:
                            token_count += _count("i", packed)
                            budget.check_datum_tokens(index, token_count)
                            tokens.extend(budget.unpack("i", packed))
                else:
                    raise InvalidRequest(
                        "model_input holds image or audio chunks: Mint's bases take text tokens only",
                        param="model_input",
                    )
        elif number == 2 and wire == _LEN:  # map<string, Tensor> entry
            key, tensor = "", memoryview(b"")
            for entry_number, _, entry_value in _fields(value):
                if entry_number == 1:
                    key = _text(entry_value, "data.loss_fn_inputs")
                elif entry_number == 2:
                    tensor = entry_value
            if key not in inputs and len(inputs) >= MAX_LOSS_INPUTS:
                raise InvalidRequest(
                    f"data[{index}] has more than {MAX_LOSS_INPUTS} loss_fn_inputs; Mint's losses read a few",
                    param="loss_fn_inputs",
                )
            inputs[key] = _decode_tensor(tensor, key, budget)
        elif number in (3, 4) and wire == _LEN:  # provenance: model_input_spans, loss_fn_input_spans
            spans.setdefault(number, []).append(_decode_span(value))
    return WireDatum(tokens=tokens, loss_fn_inputs=inputs, input_spans=spans.get(3), target_spans=spans.get(4))


def decode_forward_backward_request(body: bytes, limits: BatchLimits) -> ForwardBackwardProto:
    """Read a `tinker_public.ForwardBackwardRequest`; raises InvalidRequest on a malformed body
    and PayloadTooLarge on one that holds more than `limits` allow.

    The body is read twice: a dry pass checks the limits from the lengths the body declares,
    so a refused request costs no decoding, then the real pass unpacks the values.
    """
    _decode_forward_backward(memoryview(body), _Budget(limits, dry=True))
    return _decode_forward_backward(memoryview(body), _Budget(limits, dry=False))


def _decode_forward_backward(body: memoryview, budget: _Budget) -> ForwardBackwardProto:
    model_id, seq_id, loss_fn, forward_only = "", 0, "", False
    config: dict[str, float | str] = {}
    config_v2: dict[str, float | str] = {}
    data: list[WireDatum] = []
    for number, wire, value in _fields(body):
        if number == 1 and wire == _LEN:
            model_id = _text(value, "model_id")
        elif number == 2 and wire == _VARINT:
            seq_id = _signed64(value)
        elif number == 3 and wire == _LEN:
            data.append(_decode_datum(value, budget))
        elif number == 4 and wire == _LEN:
            loss_fn = _text(value, "loss_fn")
        elif number == 5 and wire == _LEN:  # map<string, double>
            key, number_value = "", 0.0
            for entry_number, entry_wire, entry_value in _fields(value):
                if entry_number == 1:
                    key = _text(entry_value, "loss_fn_config")
                elif entry_number == 2 and entry_wire == _FIXED64:
                    number_value = struct.unpack("<d", entry_value)[0]
            config[key] = number_value
            _check_config_size(config)
        elif number == 6 and wire == _VARINT:
            forward_only = bool(value)
        elif number == 7 and wire == _LEN:  # map<string, LossConfigValue>
            key, item = "", memoryview(b"")
            for entry_number, _, entry_value in _fields(value):
                if entry_number == 1:
                    key = _text(entry_value, "loss_fn_config_v2")
                elif entry_number == 2:
                    item = entry_value
            for item_number, item_wire, item_value in _fields(item):
                if item_number == 1 and item_wire == _FIXED64:
                    config_v2[key] = struct.unpack("<d", item_value)[0]
                elif item_number == 2 and item_wire == _LEN:
                    config_v2[key] = _text(item_value, "loss_fn_config_v2")
            _check_config_size(config_v2)
    if not model_id:
        raise _bad("model_id is missing")
    if not 1 <= seq_id < 2**31:  # int32 on the wire; the model's creation took 0
        raise InvalidRequest(f"seq_id must be 1 to {2**31 - 1}, got {seq_id}", param="seq_id")
    # Newer clients write both maps; v2 wins where it is set, as the protocol says.
    return ForwardBackwardProto(
        model_id=model_id,
        seq_id=seq_id,
        loss_fn=loss_fn,
        loss_fn_config={**config, **config_v2},
        forward_only=forward_only,
        data=data,
    )


def _check_config_size(config: dict[str, float | str]) -> None:
    if len(config) > MAX_LOSS_CONFIG_ENTRIES:
        raise InvalidRequest(
            f"loss_fn_config has more than {MAX_LOSS_CONFIG_ENTRIES} entries; Mint's losses read a few",
            param="loss_fn_config",
        )


def encode_forward_backward_output(logprobs: Sequence[Sequence[float]], metrics: dict[str, float]) -> bytes:
    """A `ForwardBackwardOutput` with one `ArrayRecord` holding each datum's `logprobs` (float32)."""
    offsets = [0]
    for row in logprobs:
        offsets.append(offsets[-1] + 4 * len(row))
    flat = [value for row in logprobs for value in row]
    batched = _len_field(1, _packed("f", flat)) + _len_field(2, _packed("q", offsets)) + _varint_field(3, DTYPE_FLOAT32)
    entry = _string_field(1, "logprobs") + _len_field(2, batched)
    record = _string_field(1, "ArrayRecord") + _len_field(2, entry) + _varint_field(3, len(logprobs))
    out = _string_field(1, "ArrayRecord") + _len_field(2, record)
    for name, value in metrics.items():
        metric = _string_field(1, name) + _tag(2, _FIXED64) + struct.pack("<d", float(value))
        out += _len_field(3, metric)
    return out


def encode_sample_response(sequences: Sequence[dict[str, Any]], prompt_logprobs: Sequence[float] | None) -> bytes:
    """A `SampleResponse`: each sequence's tokens (int32), logprobs (float32) and stop reason;
    prompt logprobs with NaN where there is none (position 0)."""
    out = b""
    for sequence in sequences:
        message = (
            _varint_field(1, STOP_REASONS[sequence["stop_reason"]])
            + _len_field(2, _packed("i", sequence["tokens"]))
            + _len_field(3, _packed("f", sequence["logprobs"]))
        )
        out += _len_field(1, message)
    if prompt_logprobs is not None:
        values = [math.nan if value is None else value for value in prompt_logprobs]
        out += _len_field(2, _packed("f", values))
    return out
