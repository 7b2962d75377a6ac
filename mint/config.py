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

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_MAX_ATTEMPTS = 5

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
    # A job or eval run is claimed at most this many times; work whose worker keeps dying
    # (a poison job) then fails with its last error instead of being queued again forever.
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1)
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

    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=1, le=65535)
    public_url: str | None = Field(default=None, description="URL that clients use to reach the API.")
    max_upload_bytes: int = Field(default=512 * 1024 * 1024, ge=1)
    log_level: str = "INFO"

    # Request bodies: the size any route accepts, unless mint.api.gate.ROUTE_BODY_LIMITS gives the
    # route its own (uploads); refused with 413 while the body streams in.
    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1)

    @field_validator("home", "model_configs_dir", mode="after")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'mint.db'}"

    @property
    def broker(self) -> str:
        return self.broker_url or f"sqla+sqlite:///{self.home / 'broker.db'}"

    @property
    def result_backend(self) -> str:
        if self.result_backend_url:
            return self.result_backend_url
        if self.broker.startswith(("redis://", "rediss://")):
            return self.broker
        return f"db+sqlite:///{self.home / 'results.db'}"

    @property
    def object_store(self) -> str:
        return self.object_store_url or f"file://{self.home / 'objects'}"

    @property
    def models_cache_dir(self) -> Path:
        """Where converted base weights (e.g. dequantized GGUF as safetensors) are cached."""
        return self.home / "models"

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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once. Tests call `get_settings.cache_clear()`."""
    return Settings()
