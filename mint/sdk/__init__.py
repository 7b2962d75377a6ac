"""The Mint SDK: a typed Python client of the Mint API (httpx, and the server's own schemas).

`Mint` blocks; `AsyncMint` is its asyncio twin. Importing this package imports neither torch
nor FastAPI, so it fits in any script, notebook or service.
"""

from mint.sdk.chat import AsyncStream, CompletionChunk, Stream
from mint.sdk.client import AsyncMint, Mint
from mint.sdk.errors import (
    APIConnectionError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    DownloadError,
    InternalServerError,
    MintAPIError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitError,
    ServiceUnavailableError,
    SpendLimitExceededError,
    UnprocessableEntityError,
    WaitTimeoutError,
)
from mint.sdk.evals import AsyncEvalRun, EvalRun
from mint.sdk.files import RowFormat
from mint.sdk.jobs import AsyncJob, Job
from mint.sdk.pagination import AsyncPager, SyncPager

__all__ = [
    "APIConnectionError",
    "APITimeoutError",
    "AsyncEvalRun",
    "AsyncJob",
    "AsyncMint",
    "AsyncPager",
    "AsyncStream",
    "AuthenticationError",
    "BadRequestError",
    "CompletionChunk",
    "ConflictError",
    "DownloadError",
    "EvalRun",
    "InternalServerError",
    "Job",
    "Mint",
    "MintAPIError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "SpendLimitExceededError",
    "RateLimitError",
    "RowFormat",
    "ServiceUnavailableError",
    "Stream",
    "SyncPager",
    "UnprocessableEntityError",
    "WaitTimeoutError",
]
