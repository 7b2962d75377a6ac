"""Wire types of the Tinker-compatible routes (`/api/v1/...`), as the official `tinker` SDK sends them.

JSON bodies, as pydantic models. Requests ignore fields Mint does not read (the SDK adds fields
over time), so a newer client keeps working; responses carry exactly the fields the SDK's models
declare. The protobuf messages (forward/backward requests, forward and sample results) are
`mint.schemas.tinker_proto`.

No torch, no SQLAlchemy: the API process imports this module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mint.errors import InvalidRequest
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


# A Tinker project, as Mint keeps it: a label on sessions inside one organization.
ProjectId = Annotated[str, Field(min_length=1, max_length=200, pattern=ID_PATTERN)]


class CreateSessionRequest(_Request):
    tags: list[Annotated[str, Field(max_length=200, pattern=LABEL_PATTERN)]] = Field(
        default_factory=list, max_length=100
    )
    user_metadata: FiniteJson | None = None
    sdk_version: str | None = Field(default=None, max_length=50, pattern=LABEL_PATTERN)
    project_id: ProjectId | None = None
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


class SaveWeightsExternalRequest(_Request):
    """Export the model's LoRA weights as PEFT files to download (`tinker checkpoint download`)."""

    model_id: Id
    seq_id: SeqId
    path: str = Field(min_length=1, max_length=200)
    ttl_seconds: TtlSeconds | None = None
    age_encryption_recipients: list[str] | None = Field(default=None, max_length=32)
    user_metadata: dict[str, str] | None = None


class CheckpointTtlRequest(_Request):
    """A checkpoint's new lifetime from now; None keeps it until it is deleted."""

    ttl_seconds: TtlSeconds | None = None


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
    checkpoint_type: Literal["training", "sampler", "external"]
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


class ExternalWeightsUrlsResponse(_Response):
    """One signed download URL per file, keyed by its path in the checkpoint; all expire together."""

    urls: dict[str, str]
    expires: datetime


class AssignProjectRequest(_Request):
    project_id: ProjectId


class AssignProjectResponse(_Response):
    session_id: str
    project_id: str


class SessionStatusQuery(_Request):
    """One status a search matches: `active`, `client_finished` (with `reasons`: success,
    errored, interrupted), `cancelled` or `failed` (which no Mint session is)."""

    type: Literal["active", "cancelled", "failed", "client_finished"]
    reasons: list[Literal["success", "errored", "interrupted"]] | None = Field(default=None, min_length=1)


class SearchOwner(_Request):
    type: Literal["own", "accessible", "user"] = "own"
    owner_urns: list[Annotated[str, Field(max_length=200)]] | None = Field(default=None, max_length=10)


class SessionSearchCursor(_Request):
    last_created_at: datetime
    last_session_id: Id


class SessionSearchRequest(_Request):
    session_id: Id | None = None
    project_ids: list[ProjectId] | None = Field(default=None, max_length=100)
    user_metadata: dict[Annotated[str, Field(max_length=200)], Annotated[str, Field(max_length=2000)]] = Field(
        default_factory=dict, max_length=50
    )
    display_name: str | None = Field(default=None, min_length=1, max_length=200, pattern=LABEL_PATTERN)
    owner: SearchOwner = Field(default_factory=SearchOwner)
    statuses: list[SessionStatusQuery] | None = Field(default=None, min_length=1, max_length=8)
    limit: int = Field(default=50, ge=1, le=200)
    cursor: SessionSearchCursor | None = None


class SessionSummary(_Response):
    session_id: str
    created_at: datetime
    owner: str
    project_id: str
    status: dict[str, object] | None = None
    checkpoints_count: int
    display_name: str | None = None
    user_metadata: dict[str, str] | None = None
    checkpoint_storage_bytes: int | None = None


class SessionSearchResponse(_Response):
    sessions: list[SessionSummary]
    next_cursor: SessionSearchCursor | None = None


class CopyWeightsRequest(_Request):
    source_path: str = Field(max_length=1024)
    session_id: Id | None = None
    model_seq_id: int | None = Field(default=None, ge=0, lt=2**31)
    destination_project_id: ProjectId | None = None
    ttl_seconds: int | None = Field(default=None, ge=3600, le=10 * 365 * 24 * 3600)
    weights_access_token: str | None = Field(default=None, max_length=1000)


class CopyWeightsResponse(_Response):
    tinker_path: str


class TraceExportResponse(_Response):
    """A session's trace: `ready` with a download URL that needs no key (Mint builds it at once)."""

    status: Literal["pending", "ready", "failed"]
    url: str | None = None
    error: str | None = None


class ApiKeyOrgDetails(_Response):
    name: str


class ApiKeyUserDetails(_Response):
    email: str


class ApiKeyDetails(_Response):
    org_details: ApiKeyOrgDetails
    user_details: ApiKeyUserDetails


class SelfApiKeyResponse(_Response):
    """The presented key, as `tinker auth login` checks it. Tinker numbers its keys, so `key_id`
    is a number derived from Mint's key id (stable, not secret); `note` holds Mint's id."""

    key_id: int
    name: str
    note: str
    details: ApiKeyDetails


# ---- tinker:// paths --------------------------------------------------------------------------

TINKER_SCHEME = "tinker://"
# A checkpoint's name: what save_state and save_weights_for_sampler were given.
CHECKPOINT_NAME = re.compile(r"^[^/\x00-\x1f\x7f]{1,200}$")
CheckpointKind = Literal["training", "sampler", "external"]
PATH_SEGMENTS: dict[str, CheckpointKind] = {
    "weights": "training",
    "sampler_weights": "sampler",
    "external_weights": "external",
}
SEGMENT_OF_KIND = {kind: segment for segment, kind in PATH_SEGMENTS.items()}


def checkpoint_kind(value: str) -> CheckpointKind:
    """A checkpoint row's kind (a plain text column) as the literal it was written from."""
    for kind in PATH_SEGMENTS.values():
        if kind == value:
            return kind
    raise ValueError(f"{value!r} is not a checkpoint kind")


def csr_problem(rows: int, cols: int, count: int, crow: Sequence[int], col: Sequence[int]) -> str | None:
    """What is wrong with a (rows, cols) CSR layout of `count` values, or None: the row pointers
    must run from 0 to `count` without decreasing, and each column index must be in [0, cols)."""
    if len(crow) != rows + 1 or len(col) != count:
        return f"it needs {rows + 1} row pointers and one column index per value ({count})"
    if crow[0] != 0 or crow[-1] != count or any(a > b for a, b in zip(crow, crow[1:], strict=False)):
        return "its row pointers do not run from 0 to the number of values without decreasing"
    if any(not 0 <= c < cols for c in col):
        return f"a column index is outside [0, {cols})"
    return None


def csr_rows(
    rows: int, cols: int, values: Sequence[Any], crow: Sequence[int], col: Sequence[int], fill: Any
) -> list[list[Any]]:
    """A checked (`csr_problem`) CSR layout as dense rows, `fill` where it lists nothing."""
    dense = [[fill] * cols for _ in range(rows)]
    for row in range(rows):
        for at in range(crow[row], crow[row + 1]):
            dense[row][col[at]] = values[at]
    return dense


@dataclass(frozen=True)
class TinkerPath:
    """`tinker://<model_id>/weights/<name>` (a training state), `.../sampler_weights/<name>` or
    `.../external_weights/<name>` (PEFT files to download)."""

    model_id: str
    kind: CheckpointKind
    name: str

    @classmethod
    def parse(cls, path: str) -> TinkerPath:
        parts = path.removeprefix(TINKER_SCHEME).split("/") if path.startswith(TINKER_SCHEME) else []
        if len(parts) != 3 or parts[1] not in PATH_SEGMENTS or not parts[0] or not parts[2]:
            raise InvalidRequest(
                f"{path[:300]!r} is not a checkpoint path: use tinker://<model_id>/weights/<name> (training state), "
                "tinker://<model_id>/sampler_weights/<name> (sampler weights) or "
                "tinker://<model_id>/external_weights/<name> (exported weights), as save_state, "
                "save_weights_for_sampler and save_weights_external return them",
                param="path",
            )
        if not re.match(ID_PATTERN, parts[0]) or len(parts[0]) > 100 or not CHECKPOINT_NAME.match(parts[2]):
            raise InvalidRequest(f"{path[:300]!r} names no checkpoint of this server", param="path")
        return cls(model_id=parts[0], kind=PATH_SEGMENTS[parts[1]], name=parts[2])

    @classmethod
    def of_checkpoint(cls, model_id: str, checkpoint_id: str) -> TinkerPath:
        """The path of `checkpoint_id` (`weights/<name>`, as the checkpoint routes take it) of a model."""
        return cls.parse(f"{TINKER_SCHEME}{model_id}/{checkpoint_id}")

    @property
    def checkpoint_id(self) -> str:
        return f"{SEGMENT_OF_KIND[self.kind]}/{self.name}"

    def __str__(self) -> str:
        return f"{TINKER_SCHEME}{self.model_id}/{self.checkpoint_id}"
