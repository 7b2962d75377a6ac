"""Settings: one typed object, read from `MINT_*` environment variables (and `.env`).

With no settings at all Mint runs on embedded defaults under `MINT_HOME` (default
`~/.mint`): a SQLite database, a local object-store folder, and a Celery broker and result
store on SQLite that need no server. PostgreSQL, Redis and S3 are chosen by settings alone:

    MINT_DATABASE_URL=postgresql+psycopg://mint@db/mint
    MINT_BROKER_URL=redis://redis:6379/0
    MINT_OBJECT_STORE_URL=s3://mint-artifacts/prod
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_MAX_ATTEMPTS = 5
MAX_QUOTA = 100_000  # the largest per-organization quota a setting or an operator may give
MAX_STORAGE_QUOTA_MIB = 100 * 1024 * 1024  # the largest storage quota: 100 TiB, in MiB

# A shared node credential shorter than this is refused at start-up: it could be guessed.
MIN_NODE_TOKEN_CHARS = 32

EngineKind = Literal["auto", "torch", "vllm"]  # the engine of a serving node (mint.serving.engines)


class Settings(BaseSettings):
    """Every knob of a Mint process. Derived defaults live in the `*_url` properties."""

    model_config = SettingsConfigDict(env_prefix="MINT_", env_file=".env", extra="ignore")

    home: Path = Field(default=Path("~/.mint"), description="Folder for the embedded defaults.")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; SQLite under home if unset.")
    broker_url: str | None = Field(default=None, description="Celery broker; SQLite (kombu sqla) under home if unset.")
    result_backend_url: str | None = Field(
        default=None, description="Celery result store; follows the broker (Redis or SQLite) if unset."
    )
    object_store_url: str | None = Field(default=None, description="file:///path or s3://bucket/prefix.")
    s3_endpoint_url: str | None = Field(default=None, description="S3-compatible endpoint (MinIO, moto); AWS if unset.")
    s3_region: str = "us-east-1"

    # Celery: a message not acknowledged within this time is redelivered (Redis transport),
    # so it must exceed the longest single task step; tasks are idempotent.
    visibility_timeout_s: int = Field(default=6 * 3600, ge=60)
    model_configs_dir: Path = Field(default=PROJECT_ROOT / "configs" / "models")
    # Fine-tuning jobs: a running job's worker renews its lease every lease/4 seconds; a job
    # whose lease ran out (its worker died) is queued again by the reconciler, which runs
    # every `reconcile_every_s` and also re-sends queued jobs whose message the broker lost.
    job_lease_s: float = Field(default=120.0, gt=0)
    reconcile_every_s: float = Field(default=30.0, gt=0)
    requeue_grace_s: float = Field(default=30.0, ge=0)
    # Auto mode: a run's driver ticks every `autotune_poll_s`; the reconciler restarts the driver
    # of a run that has not ticked for `autotune_quiet_s` (its chain of messages broke).
    autotune_poll_s: float = Field(default=2.0, gt=0, le=3600)
    autotune_quiet_s: float = Field(default=120.0, gt=0)
    # A job or eval run is claimed at most this many times; work whose worker keeps dying
    # (a poison job) then fails with its last error instead of being queued again forever.
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1)
    # Retention (mint.services.upkeep.retention), enforced by beat: expired Tinker checkpoints, and the
    # intermediate checkpoints of finished jobs, are deleted, rows first, then their objects.
    retention_every_s: float = Field(
        default=600.0, gt=0, description="How often beat deletes expired Tinker checkpoints and old job checkpoints."
    )
    job_checkpoints_keep: int = Field(
        default=1, ge=0, description="Checkpoints a finished job keeps (its newest); the others are deleted."
    )
    job_checkpoint_retention_s: float = Field(
        default=7 * 24 * 3600.0,
        ge=0,
        description="How long after a job finished its checkpoints beyond job_checkpoints_keep are kept.",
    )
    # Capacity: a training worker's base holds this many LoRA sessions at once (Tinker models and
    # samplers, fine-tuning jobs, eval adapters, of every organization). A job or eval run that
    # finds none free waits in `queued` and tries again after `capacity_retry_s`, doubling per
    # wait up to `capacity_retry_max_s`; waiting counts no attempt.
    # The dtype a worker's resident base and a serving node's torch engine compute in: the base's
    # own `dtype` when unset; `auto` is bfloat16 where the hardware multiplies it fast (AMX or
    # AVX-512 BF16 CPUs, bf16 GPUs), else float32 (`mint.trainer.precision`). LoRA weights and
    # Adam moments stay float32 either way.
    compute_dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        default=None, description="dtype the resident base computes in (auto | float32 | bfloat16 | float16)."
    )
    worker_max_sessions: int = Field(
        default=64, ge=1, le=4096, description="LoRA sessions one worker's resident base holds at once."
    )
    worker_mix_backward: bool | None = Field(
        default=None,
        description="Whether overlapping forward_backward calls of several sessions run as one mixed pass "
        "(unset: where the device is not a CPU).",
    )
    worker_batch_invariant: bool = Field(
        default=False,
        description="Whether a session's numbers in a mixed pass are bit for bit those of its batch alone "
        "(tiled matmuls: slower).",
    )
    capacity_retry_s: float = Field(
        default=5.0, gt=0, le=3600, description="First wait of work that found no free session slot."
    )
    capacity_retry_max_s: float = Field(
        default=300.0, gt=0, le=24 * 3600, description="Longest wait between tries of work waiting for capacity."
    )
    # A Tinker session whose SDK sent no heartbeat (it sends one every 10 s) for this long expires:
    # a periodic sweep finishes it, fails its waiting requests and frees its models' slots.
    tinker_session_idle_s: float = Field(
        default=600.0,
        ge=30,
        le=7 * 24 * 3600,
        description="Seconds without a heartbeat before a Tinker session expires.",
    )
    # Webhooks (mint.services.webhooks.delivery): each delivery is tried up to
    # `webhook_max_attempts` times; after a network error or a non-2xx answer the next attempt
    # waits `webhook_retry_s`, doubling per attempt up to `webhook_retry_max_s`.
    webhook_max_attempts: int = Field(default=8, ge=1, le=50, description="Attempts of one webhook delivery.")
    webhook_retry_s: float = Field(
        default=30.0, ge=0, le=24 * 3600, description="Wait before a webhook delivery's second attempt (0: at once)."
    )
    webhook_retry_max_s: float = Field(
        default=6 * 3600.0, ge=0, le=7 * 24 * 3600, description="Longest wait between attempts of a delivery."
    )
    # The total deadline of one attempt (connecting, TLS, sending, the answer), enforced on every
    # socket operation: a receiver trickling its answer a byte at a time cannot stretch it.
    webhook_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=120,
        description="How long one webhook POST may take in all, however slowly the receiver answers, "
        "before it counts as failed.",
    )
    # Endpoints whose host resolves to a loopback, private or link-local address are refused
    # (mint.services.webhooks.egress) unless this allows them: for endpoints inside the operator's network.
    webhook_allow_private_networks: bool = Field(
        default=False, description="Allow webhook endpoints on private, loopback and link-local addresses."
    )
    # RL jobs stop with `no_reward_signal` after this many steps in a row in which no group of
    # samples had reward signal (a job's `max_steps_without_signal` overrides it).
    rl_max_steps_without_signal: int = Field(default=5, ge=1, le=1_000_000)

    # Serving nodes: "auto" runs vLLM where a CUDA GPU and vLLM are (in this venv, or in the one
    # whose interpreter `vllm_python` names), Mint's torch engine elsewhere.
    serving_engine: EngineKind = "auto"
    vllm_python: Path | None = Field(
        default=None, description="python of a venv with vLLM and Mint; a node's vLLM engine runs there."
    )
    serving_engine_slots: int = Field(default=8, ge=1, description="Adapters a node's engine holds at once.")
    serving_batch_size: int = Field(default=16, ge=1, description="Requests a node's engine decodes together.")
    serving_host: str = Field(
        default="127.0.0.1", description="Bind address of `mint serve` (a node's internal API) unless --host is given."
    )
    # The credential of nodes' internal routes (`Authorization: Bearer`). Set, it is shared by the
    # API and every node; unset, each node issues a random one at start and records it in its
    # serving_nodes row, where the API (and `mint admin cache`) read it.
    node_token: SecretStr | None = Field(
        default=None,
        description="Shared credential of serving nodes' internal API; each node issues its own if unset.",
    )

    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    public_url: str | None = Field(
        default=None,
        description=(
            "URL that clients use to reach the API; download URLs are built on it. Unset: "
            "http://<api_host>:<api_port> where api_host is a loopback address, else no download URLs (503)."
        ),
    )
    url_signing_key: SecretStr | None = Field(
        default=None,
        description="Key that signs download URLs Mint serves itself; unset: one kept in the object store.",
    )
    presigned_url_s: int = Field(
        default=0,
        ge=0,
        le=7 * 24 * 3600,
        description=(
            "Seconds an S3 store's own presigned download URL lives; 0 (default): every download URL goes "
            "through the API, which ends it when its key is revoked or its checkpoint unpublished. A presigned "
            "URL cannot be ended before it expires."
        ),
    )
    max_upload_bytes: int = Field(default=512 * 1024 * 1024, ge=1)
    max_dataset_row_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1,
        description="Longest line of an uploaded dataset: validation holds one line at a time, never the file.",
    )
    log_level: str = "INFO"

    # Request bodies: the size any route accepts, unless mint.api.gate.ROUTE_BODY_LIMITS gives the
    # route its own (uploads); refused with 413 while the body streams in.
    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1)

    # Tinker forward_backward bodies are protobuf, whose packed 4-byte numbers each become a
    # ~36-byte Python object when decoded: these bound a request before it is decoded (413).
    # The SDK's own batches stay within them: it splits a batch into requests of at most
    # 1,024 data and about 5 MB, and /api/v1/client/config announces smaller sizes when these
    # limits are set lower.
    tinker_max_body_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1, description="Body size limit of a Tinker forward_backward request."
    )
    tinker_max_batch_data: int = Field(
        default=4096, ge=1, description="Data (sequences) in one Tinker forward_backward request."
    )
    tinker_max_batch_numbers: int = Field(
        default=4_000_000,
        ge=1,
        description="Tokens plus loss-input values in one Tinker forward_backward request.",
    )
    tinker_max_datum_tokens: int = Field(
        default=262_144, ge=1, description="Tokens of one datum (sequence) of a Tinker forward_backward request."
    )

    @field_validator("home", "model_configs_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("node_token", mode="after")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():  # MINT_NODE_TOKEN= (empty) is unset
            return None
        if len(value.get_secret_value()) < MIN_NODE_TOKEN_CHARS:
            raise ValueError(
                f"MINT_NODE_TOKEN must have at least {MIN_NODE_TOKEN_CHARS} characters; make one with "
                '`python -c "import secrets; print(secrets.token_urlsafe(32))"`, or unset it to let each node '
                "issue its own"
            )
        return value

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'mint.db'}"

    @property
    def broker(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{self.home / 'broker.db'}"

    @property
    def redis_broker(self) -> str | None:
        """The broker's URL when the deployment runs on Redis (results and rate limits follow it)."""
        return self.broker if self.broker.startswith(("redis://", "rediss://")) else None

    @property
    def result_backend(self) -> str:
        return self.result_backend_url or self.redis_broker or f"db+sqlite:///{self.home / 'results.db'}"

    @property
    def object_store(self) -> str:
        return self.object_store_url or f"file://{self.home / 'objects'}"

    @property
    def models_cache_dir(self) -> Path:
        """Where converted base weights (e.g. dequantized GGUF as safetensors) are cached."""
        return self.home / "models"

    @property
    def shared_node_token(self) -> str | None:
        """`node_token` as text, or None where each node issues its own."""
        return self.node_token.get_secret_value() if self.node_token is not None else None

    @property
    def api_url(self) -> str:
        return self.public_url or f"http://{self.api_host}:{self.api_port}"

    def ensure_home(self) -> None:
        """Create the home folder, readable by its owner only: the embedded defaults keep the
        database (API key hashes), the broker and the objects there. A folder that already
        exists keeps its mode (it may be one the operator chose to share)."""
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)

    # Each process's pool of database connections. A request holds one only while it reads or
    # writes (never while it waits on a serving node), so a small pool serves many requests.
    database_pool_size: int = Field(default=10, ge=1)
    database_max_overflow: int = Field(default=20, ge=0)
    database_pool_timeout_s: float = Field(default=30.0, gt=0)
    # Requests a serving node keeps waiting for a batch; beyond them it answers 429 (Retry-After).
    serving_max_waiting: int = Field(default=256, ge=1)
    # Bases the API's /readyz waits for: it answers 503, naming those still loading, until each has
    # a live serving node that has loaded it. `mint up` sets it to the bases it serves. Leave it
    # empty where a load balancer reads /readyz: one base's outage would take the whole API out.
    ready_bases: str = Field(
        default="", description="Comma-separated bases /readyz requires a live serving node of; empty: none."
    )

    @property
    def ready_base_names(self) -> list[str]:
        """`ready_bases` as a list of names, in order, each once."""
        return list(dict.fromkeys(name.strip() for name in self.ready_bases.split(",") if name.strip()))

    # Per-organization quotas: the platform default of each, used where the organization's row
    # sets none (`mint admin orgs quota ORG ...` sets them). A create over quota is answered 429.
    quota_tinker_sessions: int = Field(
        default=16, ge=0, le=MAX_QUOTA, description="Live Tinker sessions (ServiceClients) per organization."
    )
    quota_tinker_models: int = Field(
        default=16,
        ge=0,
        le=MAX_QUOTA,
        description="Live Tinker training models (LoRA slots on a worker) per organization, over all its sessions.",
    )
    tinker_reserved_slots: int = Field(
        default=8,
        ge=0,
        le=4096,
        description="LoRA slots of each base that one organization's Tinker models never take: kept for other "
        "organizations and for fine-tuning jobs.",
    )
    quota_jobs: int = Field(
        default=32, ge=0, le=MAX_QUOTA, description="Queued and running fine-tuning jobs per organization."
    )
    quota_eval_runs: int = Field(
        default=32, ge=0, le=MAX_QUOTA, description="Queued and running eval runs per organization."
    )
    quota_capture_storage_mib: int = Field(
        default=10 * 1024,
        ge=0,
        le=MAX_STORAGE_QUOTA_MIB,
        description="MiB of captured completions and their feedback an organization keeps (JSON as stored); "
        "over it, new captures are dropped and feedback is refused (429) until captures expire.",
    )
    # An answer of a completion its deployment captures is sent once its capture is written (so
    # feedback posted the moment the answer arrives finds it), waiting at most this long.
    capture_wait_s: float = Field(
        default=5.0,
        ge=0,
        le=60,
        description="Seconds a captured completion's answer waits for its capture's row; 0: never waits.",
    )

    # Per-key rate limit, in the `limits` library's notation ("600/minute", "20/second;1200/minute");
    # empty disables it. Counted in a moving window on `rate_limit_storage` (Redis when the broker
    # is Redis, so every API replica shares the count; this process's memory otherwise).
    rate_limit: str = Field(default="1200/minute", description="Requests per API key; empty: no limit.")
    # Per-organization rate limit, the same notation, counted across all the organization's keys
    # beside each key's own: an admin who makes more keys does not get more requests.
    org_rate_limit: str = Field(
        default="6000/minute", description="Requests per organization, across all its API keys; empty: no limit."
    )
    rate_limit_storage_url: str | None = Field(
        default=None, description="A `limits` storage URI (redis://..., memory://); follows the broker if unset."
    )

    @field_validator("rate_limit", "org_rate_limit", mode="after")
    @classmethod
    def _parse_rate(cls, value: str, info: ValidationInfo) -> str:
        from limits import parse_many

        value = value.strip()
        if value:
            try:
                rates = parse_many(value)
            except ValueError:
                rates = []
            if not rates or any(rate.amount < 1 for rate in rates):
                variable = f"MINT_{(info.field_name or 'rate_limit').upper()}"
                raise ValueError(
                    f"{variable}={value!r} is not a rate: write e.g. '600/minute' or '20/second;1200/minute' "
                    "(at least 1 request), or leave it empty for no limit"
                )
        return value

    @property
    def rate_limit_storage(self) -> str:
        return self.rate_limit_storage_url or self.redis_broker or "memory://"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once. Tests call `get_settings.cache_clear()`."""
    return Settings()
