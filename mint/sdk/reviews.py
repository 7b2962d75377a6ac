"""Expert review: queues of trajectories or captured answers, reviews, agreement, and
corrections mined into data.

```python
queue = client.reviews.create_queue("round 1", eval_id=run.id, filters={"failed": True}, reviews_per_item=2)
for item in client.reviews.items(queue.id, status="todo"):
    client.reviews.submit(item.id, passed=False, comment="wrong sum",
                          correction={"from_message": item.snapshot.prompt_length,
                                      "messages": [{"role": "assistant", "content": "5"}]})
report = client.reviews.agreement(queue.id)          # reviewers' alpha, each grader's, flagged judges
dataset = client.reviews.dataset(queue.id, "chat")   # SFT rows ending in the corrections
```
"""

from __future__ import annotations

from typing import Any

from mint.schemas.common import Page
from mint.schemas.evals import BenchmarkVersionPublic, MinedDatasetPublic
from mint.schemas.reviews import (
    AgreementReport,
    BenchmarkFromReviews,
    DatasetFromReviews,
    ReviewCreate,
    ReviewItemPublic,
    ReviewPublic,
    ReviewQueueCreate,
    ReviewQueuePublic,
    RunWithExperts,
)
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager

PATH = "/v1/reviews"


def create_queue(fields: dict[str, Any]) -> Call[ReviewQueuePublic]:
    body = request_body(ReviewQueueCreate, **fields)
    return Call("POST", f"{PATH}/queues", parse_model(ReviewQueuePublic), json=body)


def get_queue(queue_id: str) -> Call[ReviewQueuePublic]:
    return Call("GET", f"{PATH}/queues/{queue_id}", parse_model(ReviewQueuePublic))


def list_queues(limit: int) -> PageCall:
    return lambda after: Call(
        "GET", f"{PATH}/queues", parse_model(Page[ReviewQueuePublic]), {"after": after, "limit": limit}
    )


def list_items(queue_id: str, status: str, assignee: str | None, limit: int) -> PageCall:
    params = {"status": status, "assignee": assignee, "limit": limit}
    path = f"{PATH}/queues/{queue_id}/items"
    return lambda after: Call("GET", path, parse_model(Page[ReviewItemPublic]), {**params, "after": after})


def get_item(item_id: str) -> Call[ReviewItemPublic]:
    return Call("GET", f"{PATH}/items/{item_id}", parse_model(ReviewItemPublic))


def assign_item(item_id: str, assignee: str | None) -> Call[ReviewItemPublic]:
    # Sent as it is: `null` opens the item, and request_body would drop it.
    return Call("PATCH", f"{PATH}/items/{item_id}", parse_model(ReviewItemPublic), json={"assignee": assignee})


def submit_review(item_id: str, fields: dict[str, Any]) -> Call[ReviewPublic]:
    body = request_body(ReviewCreate, **fields)
    return Call("POST", f"{PATH}/items/{item_id}/reviews", parse_model(ReviewPublic), json=body)


def queue_agreement(queue_id: str, threshold: float | None) -> Call[AgreementReport]:
    path = f"{PATH}/queues/{queue_id}/agreement"
    return Call("GET", path, parse_model(AgreementReport), {"threshold": threshold})


def version_agreement(benchmark_id: str, version: int, threshold: float | None) -> Call[AgreementReport]:
    path = f"{PATH}/benchmarks/{benchmark_id}/versions/{version}/agreement"
    return Call("GET", path, parse_model(AgreementReport), {"threshold": threshold})


def run_with_experts(eval_id: str) -> Call[RunWithExperts]:
    return Call("GET", f"{PATH}/runs/{eval_id}", parse_model(RunWithExperts))


def mine_dataset(queue_id: str, fields: dict[str, Any]) -> Call[MinedDatasetPublic]:
    body = request_body(DatasetFromReviews, **fields)
    return Call("POST", f"{PATH}/queues/{queue_id}/dataset", parse_model(MinedDatasetPublic), json=body)


def grow_benchmark(queue_id: str, fields: dict[str, Any]) -> Call[BenchmarkVersionPublic]:
    body = request_body(BenchmarkFromReviews, **fields)
    path = f"{PATH}/queues/{queue_id}/benchmark_version"
    return Call("POST", path, parse_model(BenchmarkVersionPublic), json=body)


def _queue_fields(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, **fields}


def _review_fields(**fields: Any) -> dict[str, Any]:
    return fields


class Reviews:
    """`/v1/reviews`: review queues, their items and reviews, agreement, and mining corrections."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def create_queue(
        self,
        name: str,
        *,
        eval_id: str | None = None,
        deployment: str | None = None,
        filters: dict[str, Any] | None = None,
        reviews_per_item: int | None = None,
        assignees: list[str] | None = None,
        instructions: str | None = None,
        max_items: int | None = None,
    ) -> ReviewQueuePublic:
        """A queue over an eval run's trajectories (`eval_id`) or a deployment's captures, chosen
        by `filters` (failed, score band, disagreement, judge margin, label, sample rate)."""
        fields = _queue_fields(
            name,
            eval_id=eval_id,
            deployment=deployment,
            filters=filters,
            reviews_per_item=reviews_per_item,
            assignees=assignees,
            instructions=instructions,
            max_items=max_items,
        )
        return self._http.send(create_queue(fields))

    def get_queue(self, queue_id: str) -> ReviewQueuePublic:
        """A queue with its progress (items reviewed, done, and left for this key)."""
        return self._http.send(get_queue(queue_id))

    def queues(self, *, limit: int = 20) -> SyncPager[ReviewQueuePublic]:
        return SyncPager(self._http, list_queues(limit))

    def items(
        self, queue_id: str, *, status: str = "all", assignee: str | None = None, limit: int = 20
    ) -> SyncPager[ReviewItemPublic]:
        """The queue's items in order; `status="todo"`: those left for this key."""
        return SyncPager(self._http, list_items(queue_id, status, assignee, limit))

    def get_item(self, item_id: str) -> ReviewItemPublic:
        return self._http.send(get_item(item_id))

    def assign(self, item_id: str, assignee: str | None) -> ReviewItemPublic:
        """Deal an item to an API key id, or open it to anyone (None)."""
        return self._http.send(assign_item(item_id, assignee))

    def submit(
        self,
        item_id: str,
        *,
        passed: bool | None = None,
        score: float | None = None,
        rubric: dict[str, Any] | None = None,
        comment: str | None = None,
        correction: dict[str, Any] | None = None,
    ) -> ReviewPublic:
        """This key's review of an item (it replaces this key's earlier one)."""
        fields = _review_fields(passed=passed, score=score, rubric=rubric, comment=comment, correction=correction)
        return self._http.send(submit_review(item_id, fields))

    def agreement(self, queue_id: str, *, threshold: float | None = None) -> AgreementReport:
        return self._http.send(queue_agreement(queue_id, threshold))

    def version_agreement(self, benchmark_id: str, version: int, *, threshold: float | None = None) -> AgreementReport:
        return self._http.send(version_agreement(benchmark_id, version, threshold))

    def run(self, eval_id: str) -> RunWithExperts:
        """An eval run read with expert verdicts overriding the grader's where settled."""
        return self._http.send(run_with_experts(eval_id))

    def dataset(self, queue_id: str, kind: str, *, filename: str | None = None) -> MinedDatasetPublic:
        """The queue's corrections as `chat` (SFT), `preference` (DPO) or `prompts` (RL) rows."""
        return self._http.send(mine_dataset(queue_id, {"kind": kind, "filename": filename}))

    def benchmark_version(
        self, queue_id: str, *, benchmark_id: str | None = None, split: str | None = None
    ) -> BenchmarkVersionPublic:
        """A new benchmark version with the corrections as tasks (split `expert`)."""
        return self._http.send(grow_benchmark(queue_id, {"benchmark_id": benchmark_id, "split": split}))


class AsyncReviews:
    """`/v1/reviews`, for asyncio: the twin of `Reviews`."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def create_queue(self, name: str, **fields: Any) -> ReviewQueuePublic:
        return await self._http.send(create_queue(_queue_fields(name, **fields)))

    async def get_queue(self, queue_id: str) -> ReviewQueuePublic:
        return await self._http.send(get_queue(queue_id))

    def queues(self, *, limit: int = 20) -> AsyncPager[ReviewQueuePublic]:
        return AsyncPager(self._http, list_queues(limit))

    def items(
        self, queue_id: str, *, status: str = "all", assignee: str | None = None, limit: int = 20
    ) -> AsyncPager[ReviewItemPublic]:
        return AsyncPager(self._http, list_items(queue_id, status, assignee, limit))

    async def get_item(self, item_id: str) -> ReviewItemPublic:
        return await self._http.send(get_item(item_id))

    async def assign(self, item_id: str, assignee: str | None) -> ReviewItemPublic:
        return await self._http.send(assign_item(item_id, assignee))

    async def submit(self, item_id: str, **fields: Any) -> ReviewPublic:
        return await self._http.send(submit_review(item_id, _review_fields(**fields)))

    async def agreement(self, queue_id: str, *, threshold: float | None = None) -> AgreementReport:
        return await self._http.send(queue_agreement(queue_id, threshold))

    async def run(self, eval_id: str) -> RunWithExperts:
        return await self._http.send(run_with_experts(eval_id))

    async def dataset(self, queue_id: str, kind: str, *, filename: str | None = None) -> MinedDatasetPublic:
        return await self._http.send(mine_dataset(queue_id, {"kind": kind, "filename": filename}))
