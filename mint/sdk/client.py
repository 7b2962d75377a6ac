"""`Mint` and `AsyncMint`: clients of a Mint platform over HTTP, one attribute per resource.

```python
from mint.sdk import Mint

client = Mint()                     # MINT_BASE_URL (or MINT_API_PORT) / MINT_API_KEY, or what `mint up` wrote
file = client.datasets.upload("train.jsonl")
job = client.jobs.create("tiny-glm-moe", file.id, suffix="support-bot", steps=30).wait()
reply = client.chat.create(job.fine_tuned_model, [{"role": "user", "content": "Hi"}])
```

Every answer is typed with the server's own schemas (`mint.schemas`); lists page themselves;
a 429 is waited out as its `Retry-After` says (up to `max_rate_limit_wait_s` per request), 5xx
answers and dropped connections are retried (`max_retries`); `wait()` polls no faster than
every half second; errors are the typed classes of `mint.sdk.errors`.
"""

from __future__ import annotations

from types import TracebackType

import httpx

from mint.sdk._http import (
    DEFAULT_MAX_RATE_LIMIT_WAIT_S,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT_S,
    AsyncHTTP,
    SyncHTTP,
    found_base_url,
    resolve_api_key,
)
from mint.sdk.adapters import Adapters, AsyncAdapters
from mint.sdk.autotune import AsyncAutotune, Autotune
from mint.sdk.benchmarks import AsyncBenchmarks, Benchmarks
from mint.sdk.captures import AsyncCaptures, Captures
from mint.sdk.chat import AsyncChat, AsyncCompletions, Chat, Completions
from mint.sdk.deployments import AsyncDeployments, Deployments
from mint.sdk.episodes import AsyncEpisodes, Episodes
from mint.sdk.evals import AsyncEvals, Evals
from mint.sdk.files import AsyncDatasets, AsyncFiles, Datasets, Files
from mint.sdk.jobs import AsyncFineTuning, FineTuning
from mint.sdk.models import AsyncBaseModels, AsyncModels, BaseModels, Models
from mint.sdk.organization import ApiKeys, AsyncApiKeys, AsyncOrganization, Organization
from mint.sdk.reviews import AsyncReviews, Reviews
from mint.sdk.reward_endpoints import AsyncRewardEndpoints, RewardEndpoints
from mint.sdk.webhooks import AsyncWebhooks, Webhooks


class Mint:
    """A blocking client of the Mint API.

    `base_url` defaults to `MINT_BASE_URL`, else the local API on `MINT_API_PORT`, else the URL
    `mint up` wrote to `$MINT_HOME/api.url`, else http://127.0.0.1:8000; `api_key` to
    `MINT_API_KEY` (else the admin key that `mint up` writes to `$MINT_HOME/admin.key`).
    `timeout_s` bounds each request; `max_retries` bounds the retries of one request that failed
    (a 5xx answer, or none; 0 also turns off waiting out 429s); `max_rate_limit_wait_s` bounds
    how long one request waits out 429s as their `Retry-After` asks. `http_client` sends the
    requests instead of a client of the SDK's own (e.g. FastAPI's `TestClient` of an app in
    this process); the key is added to its headers, and `close()` closes it.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_rate_limit_wait_s: float = DEFAULT_MAX_RATE_LIMIT_WAIT_S,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.base_url, source = found_base_url(base_url)
        self._http = SyncHTTP(
            self.base_url,
            resolve_api_key(api_key),
            timeout_s=timeout_s,
            max_retries=max_retries,
            max_rate_limit_wait_s=max_rate_limit_wait_s,
            http_client=http_client,
            base_url_source=source,
        )
        self.files = Files(self._http)
        self.datasets = Datasets(self._http)
        self.benchmarks = Benchmarks(self._http)
        self.evals = Evals(self._http)
        self.autotune = Autotune(self._http)
        self.fine_tuning = FineTuning(self._http)
        self.jobs = self.fine_tuning.jobs
        self.adapters = Adapters(self._http)
        self.deployments = Deployments(self._http)
        self.captures = Captures(self._http)
        self.episodes = Episodes(self._http)
        self.chat = Chat(self._http)
        self.completions = Completions(self._http)
        self.models = Models(self._http)
        self.base_models = BaseModels(self._http)
        self.organization = Organization(self._http)
        self.api_keys = ApiKeys(self._http)
        self.webhooks = Webhooks(self._http)
        self.reward_endpoints = RewardEndpoints(self._http)
        self.reviews = Reviews(self._http)

    def close(self) -> None:
        """Close the connections; the client cannot be used after."""
        self._http.close()

    def __enter__(self) -> Mint:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Mint(base_url={self.base_url!r})"


class AsyncMint:
    """The asyncio twin of `Mint`: the same resources, whose methods are coroutines and whose
    lists are async iterators (`async for job in client.jobs.list(): ...`)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_rate_limit_wait_s: float = DEFAULT_MAX_RATE_LIMIT_WAIT_S,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url, source = found_base_url(base_url)
        self._http = AsyncHTTP(
            self.base_url,
            resolve_api_key(api_key),
            timeout_s=timeout_s,
            max_retries=max_retries,
            max_rate_limit_wait_s=max_rate_limit_wait_s,
            http_client=http_client,
            base_url_source=source,
        )
        self.files = AsyncFiles(self._http)
        self.datasets = AsyncDatasets(self._http)
        self.benchmarks = AsyncBenchmarks(self._http)
        self.evals = AsyncEvals(self._http)
        self.autotune = AsyncAutotune(self._http)
        self.fine_tuning = AsyncFineTuning(self._http)
        self.jobs = self.fine_tuning.jobs
        self.adapters = AsyncAdapters(self._http)
        self.deployments = AsyncDeployments(self._http)
        self.captures = AsyncCaptures(self._http)
        self.episodes = AsyncEpisodes(self._http)
        self.chat = AsyncChat(self._http)
        self.completions = AsyncCompletions(self._http)
        self.models = AsyncModels(self._http)
        self.base_models = AsyncBaseModels(self._http)
        self.organization = AsyncOrganization(self._http)
        self.api_keys = AsyncApiKeys(self._http)
        self.webhooks = AsyncWebhooks(self._http)
        self.reward_endpoints = AsyncRewardEndpoints(self._http)
        self.reviews = AsyncReviews(self._http)

    async def close(self) -> None:
        await self._http.close()

    async def __aenter__(self) -> AsyncMint:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncMint(base_url={self.base_url!r})"
