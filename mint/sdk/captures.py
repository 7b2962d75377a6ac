"""Captured completions and feedback: read what a capturing deployment served (by the
completion's id, which every answer carries) and say how good it was.

    reply = client.chat.create(model="support-prod", messages=[...])
    client.captures.feedback(reply.id, score=0.0, label="wrong_order",
                             correction={"message": {"role": "assistant", "content": "..."}})

A deployment captures nothing until `client.deployments.set_capture(name, rate=...)`.
"""

from __future__ import annotations

from typing import Any

from mint.schemas.captures import (
    BenchmarkFromCaptures,
    CapturePublic,
    DatasetFromCaptures,
    FeedbackCreate,
    FeedbackPublic,
)
from mint.schemas.evals import BenchmarkVersionPublic, MinedDatasetPublic
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body


def get_capture(completion_id: str) -> Call[CapturePublic]:
    return Call("GET", f"/v1/captures/{completion_id}", parse_model(CapturePublic))


def post_feedback(completion_id: str, fields: dict[str, Any]) -> Call[FeedbackPublic]:
    body = request_body(FeedbackCreate, **fields)
    return Call("POST", f"/v1/captures/{completion_id}/feedback", parse_model(FeedbackPublic), json=body)


def mine_dataset(fields: dict[str, Any]) -> Call[MinedDatasetPublic]:
    body = request_body(DatasetFromCaptures, **fields)
    return Call("POST", "/v1/datasets/from-captures", parse_model(MinedDatasetPublic), json=body)


def grow_benchmark(benchmark_id: str, fields: dict[str, Any]) -> Call[BenchmarkVersionPublic]:
    body = request_body(BenchmarkFromCaptures, **fields)
    path = f"/v1/benchmarks/{benchmark_id}/versions/from-captures"
    return Call("POST", path, parse_model(BenchmarkVersionPublic), json=body)


class Captures:
    """`/v1/captures`: completions a deployment captured, and feedback on them."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def get(self, completion_id: str) -> CapturePublic:
        """The request, the answer, the version that gave it, tokens, latency and feedback."""
        return self._http.send(get_capture(completion_id))

    def feedback(
        self,
        completion_id: str,
        *,
        score: float | None = None,
        label: str | None = None,
        comment: str | None = None,
        correction: dict[str, Any] | None = None,
    ) -> FeedbackPublic:
        """Score (0 to 1), label, comment and/or correct a captured answer (viewer keys may)."""
        fields = {"score": score, "label": label, "comment": comment, "correction": correction}
        return self._http.send(post_feedback(completion_id, fields))

    def to_dataset(self, kind: str, *, deployment: str | None = None, **filters: Any) -> MinedDatasetPublic:
        """Mine corrected captures into `kind` rows (chat | preference | prompts); filters:
        `since`, `until`, `max_score`, `label`, `filename`."""
        return self._http.send(mine_dataset({"kind": kind, "deployment": deployment, **filters}))

    def to_benchmark(
        self, benchmark_id: str, *, deployment: str | None = None, **filters: Any
    ) -> BenchmarkVersionPublic:
        """The benchmark's next version, with each corrected capture as a task (`split`: production)."""
        return self._http.send(grow_benchmark(benchmark_id, {"deployment": deployment, **filters}))


class AsyncCaptures:
    """The twin of `Captures`, for asyncio."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    async def get(self, completion_id: str) -> CapturePublic:
        return await self._http.send(get_capture(completion_id))

    async def feedback(
        self,
        completion_id: str,
        *,
        score: float | None = None,
        label: str | None = None,
        comment: str | None = None,
        correction: dict[str, Any] | None = None,
    ) -> FeedbackPublic:
        fields = {"score": score, "label": label, "comment": comment, "correction": correction}
        return await self._http.send(post_feedback(completion_id, fields))

    async def to_dataset(self, kind: str, *, deployment: str | None = None, **filters: Any) -> MinedDatasetPublic:
        return await self._http.send(mine_dataset({"kind": kind, "deployment": deployment, **filters}))

    async def to_benchmark(
        self, benchmark_id: str, *, deployment: str | None = None, **filters: Any
    ) -> BenchmarkVersionPublic:
        return await self._http.send(grow_benchmark(benchmark_id, {"deployment": deployment, **filters}))
