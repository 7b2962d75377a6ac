"""The SDK against the API on a real socket: uploads, lists that page themselves, typed errors,
retries (against a small HTTP server of this test that answers 503 and 429 first), jobs and
eval runs awaited with `wait()`, adapters downloaded, deployments changed, and chat through a
real serving node, blocking and asyncio alike."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from mint import errors
from mint.sdk import (
    APIConnectionError,
    AsyncMint,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    EvalRun,
    Job,
    Mint,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ServiceUnavailableError,
    SpendLimitExceededError,
    UnprocessableEntityError,
)
from tests.conftest import LiveServer, Tenant, free_port
from tests.sdk.conftest import ACK_TASKS, BASE, chat_rows, jsonl

# The services behind these routes are tested on both backends by their own tests.
pytestmark = [pytest.mark.integration, pytest.mark.client_surface]

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def test_importing_the_sdk_and_the_schemas_pulls_in_neither_torch_nor_fastapi() -> None:
    code = (
        "import sys, pkgutil, importlib, mint.schemas, mint.sdk\n"
        "for module in pkgutil.iter_modules(mint.schemas.__path__):\n"
        "    importlib.import_module(f'mint.schemas.{module.name}')\n"
        "heavy = [name for name in ('torch', 'fastapi', 'starlette', 'sqlalchemy') if name in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_key_comes_from_the_environment_or_mint_home(
    live_server: LiveServer, owner: Tenant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MINT_API_KEY", raising=False)
    monkeypatch.setenv("MINT_HOME", str(tmp_path))
    monkeypatch.setenv("MINT_BASE_URL", f"{live_server.url}/v1")  # the `openai` spelling is accepted
    with pytest.raises(AuthenticationError, match="MINT_API_KEY"):
        Mint()
    (tmp_path / "admin.key").write_text(owner.keys["admin"] + "\n")
    with Mint() as client:
        assert client.base_url == live_server.url
        assert client.organization.get().id == owner.organization_id
    monkeypatch.setenv("MINT_API_KEY", owner.keys["viewer"])
    with Mint() as client, pytest.raises(PermissionDeniedError):
        client.api_keys.create("not allowed")


def test_upload_a_path_or_bytes_then_read_it_back(sdk: Mint, tmp_path: Path) -> None:
    path = tmp_path / "pings.jsonl"
    path.write_bytes(jsonl(chat_rows(3, "path")))
    dataset = sdk.datasets.upload(path)
    assert dataset.filename == "pings.jsonl" and dataset.kind == "chat" and dataset.row_count == 3
    assert dataset.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sdk.datasets.get(dataset.id).model_dump(exclude={"created_at"}) == dataset.model_dump(exclude={"created_at"})
    assert sdk.datasets.content(dataset.id) == path.read_bytes()

    as_file = sdk.files.create(jsonl(chat_rows(2, "bytes")), filename="bytes.jsonl", kind="chat")
    assert as_file.object == "file" and as_file.bytes == len(jsonl(chat_rows(2, "bytes"))) and as_file.row_count == 2
    assert sdk.files.get(as_file.id).filename == "bytes.jsonl"
    assert sdk.files.content(as_file.id) == jsonl(chat_rows(2, "bytes"))
    with path.open("rb") as handle:  # an open file: the same content is the same dataset
        assert sdk.datasets.upload(handle).id == dataset.id


def test_lists_follow_the_cursor_across_pages(live_server: LiveServer, tenant: Tenant) -> None:
    with Mint(live_server.url, tenant.keys["developer"]) as client:
        uploaded = [client.datasets.upload(jsonl(chat_rows(1, f"page{i}-"))).id for i in range(5)]
        listed = [dataset.id for dataset in client.datasets.list(limit=2)]
        assert listed == uploaded[::-1]  # newest first, every page
        pages = list(client.datasets.list(limit=2).pages())
        assert [len(page.data) for page in pages] == [2, 2, 1] and [p.has_more for p in pages] == [True, True, False]
        assert [file.id for file in client.files.list(limit=3)] == listed

    async def walk() -> list[str]:
        async with AsyncMint(live_server.url, tenant.keys["viewer"]) as client:
            return [dataset.id async for dataset in client.datasets.list(limit=2)]

    assert asyncio.run(walk()) == listed


def test_errors_are_typed_and_carry_the_server_message(live_server: LiveServer, owner: Tenant, sdk: Mint) -> None:
    with pytest.raises(NotFoundError, match="No dataset") as missing:
        sdk.datasets.get("file_missing")
    assert missing.value.status_code == 404 and missing.value.type == "not_found_error"
    assert isinstance(missing.value, errors.NotFound)  # the platform's one hierarchy

    bad = jsonl([*chat_rows(1), {"messages": [{"role": "robot", "content": "hi"}]}])
    with pytest.raises(BadRequestError, match="line 2") as refused:
        sdk.datasets.upload(bad, filename="bad.jsonl")
    assert refused.value.status_code == 400 and isinstance(refused.value, errors.InvalidRequest)

    with pytest.raises(UnprocessableEntityError) as invalid:
        sdk.datasets.list(limit=500).first_page()
    assert invalid.value.status_code == 422 and invalid.value.param == "limit"

    with pytest.raises(BadRequestError, match="steps") as local:
        sdk.jobs.create(BASE, "file_x", steps=0)
    assert local.value.status_code is None  # refused by the request schema before sending

    with Mint(live_server.url, owner.keys["viewer"]) as viewer, pytest.raises(PermissionDeniedError) as denied:
        viewer.benchmarks.create("nope", content=jsonl(ACK_TASKS).decode())
    assert denied.value.status_code == 403 and isinstance(denied.value, errors.PermissionDenied)

    with Mint(live_server.url, "tml-not-a-key") as stranger, pytest.raises(AuthenticationError) as unknown:
        stranger.organization.get()
    assert unknown.value.status_code == 401


def test_error_bodies_map_to_classes_that_survive_pickling() -> None:
    import pickle

    from mint.sdk.errors import InternalServerError, MintAPIError, error_from_body

    verdict = {"passed": False, "reason": "pass rate 0.50 < 0.80"}
    body = {"error": {"type": "conflict_error", "message": "the gate refused", "param": "model", "verdict": verdict}}
    refused = error_from_body(409, body)
    assert isinstance(refused, ConflictError) and refused.verdict == verdict and refused.param == "model"
    again = pickle.loads(pickle.dumps(refused))
    assert type(again) is ConflictError and again.verdict == verdict and again.status_code == 409
    assert type(error_from_body(502, None, "<html>bad gateway</html>")) is InternalServerError
    assert type(error_from_body(418, {"error": {"type": "teapot", "message": "no"}})) is MintAPIError
    streamed = error_from_body(None, {"error": {"type": "not_found_error", "message": "gone"}})
    assert isinstance(streamed, NotFoundError) and streamed.status_code is None


class Flaky(BaseHTTPRequestHandler):
    """Answers each request with the next scripted (status, Retry-After); the last answer repeats."""

    script: list[tuple[int, str | None]] = []
    seen: list[tuple[float, str, bytes]] = []

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Flaky.seen.append((time.monotonic(), self.path, body))
        status, retry_after = Flaky.script[min(len(Flaky.seen), len(Flaky.script)) - 1]
        if status == 200:
            payload: dict[str, Any] = {"id": "org_1", "name": "flaky", "created_at": "2025-01-01T00:00:00Z"}
            if self.path == "/v1/datasets":
                payload |= {
                    "id": "file_1", "filename": "again.jsonl", "purpose": "fine-tune", "kind": "chat",
                    "status": "ready", "sha256": "0" * 64, "size_bytes": len(body), "row_count": 1,
                    "validation_report": {},
                }  # fmt: skip
        else:
            payload = {"error": {"type": "service_unavailable_error", "message": f"busy ({status})", "param": None}}
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads `seen` instead."""


@pytest.fixture
def flaky() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Flaky.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_retries_honour_retry_after_and_stop_after_max_retries(flaky: str) -> None:
    Flaky.script = [(503, "0"), (429, "1"), (200, None)]
    with Mint(flaky, "tml-key", max_retries=3) as client:
        assert client.organization.get().name == "flaky"
    assert len(Flaky.seen) == 3
    # Retry-After: 0 came back at once; Retry-After: 1 waited its second.
    assert Flaky.seen[2][0] - Flaky.seen[1][0] >= 0.95

    Flaky.seen, Flaky.script = [], [(503, "0"), (200, None)]
    with Mint(flaky, "tml-key") as client:
        client.datasets.upload(b'{"a": 1}\n', filename="again.jsonl")
    # The whole file went again with the retry (a multipart body has a new boundary each time).
    assert len(Flaky.seen) == 2 and all(
        b'filename="again.jsonl"' in b and b'\r\n\r\n{"a": 1}\n\r\n' in b for *_, b in Flaky.seen
    )

    Flaky.seen, Flaky.script = [], [(503, "0")]
    with Mint(flaky, "tml-key", max_retries=2) as client, pytest.raises(ServiceUnavailableError, match=r"busy \(503\)"):
        client.organization.get()
    assert len(Flaky.seen) == 3

    Flaky.seen, Flaky.script = [], [(429, "0")]
    with Mint(flaky, "tml-key", max_retries=0) as client, pytest.raises(RateLimitError):
        client.organization.get()
    assert len(Flaky.seen) == 1

    closed = f"http://127.0.0.1:{free_port()}"
    with Mint(closed, "tml-key", max_retries=1) as client, pytest.raises(APIConnectionError) as unreachable:
        client.organization.get()
    assert isinstance(unreachable.value, errors.ServiceUnavailable) and closed in unreachable.value.message


def test_429s_are_waited_out_as_asked_apart_from_failures_and_a_longer_ask_is_raised_at_once(flaky: str) -> None:
    """A 429 means "not now": it is retried after its Retry-After however many it takes (within
    `max_rate_limit_wait_s`), not counted against `max_retries`, which bounds failures; asked to
    wait longer than that budget, the SDK raises at once, saying how long the server asked."""
    Flaky.script = [(429, "0"), (429, "0"), (429, "1"), (429, "0"), (200, None)]
    with Mint(flaky, "tml-key", max_retries=1) as client:
        assert client.organization.get().name == "flaky"
    assert len(Flaky.seen) == 5
    # Retry-After: 0 still pauses a little (a request sent straight back is refused again); 1 waits 1 s.
    assert Flaky.seen[1][0] - Flaky.seen[0][0] >= 0.45 and Flaky.seen[3][0] - Flaky.seen[2][0] >= 0.95

    Flaky.seen, Flaky.script = [], [(429, "3600")]
    with Mint(flaky, "tml-key", max_rate_limit_wait_s=60) as client, pytest.raises(RateLimitError) as refused:
        client.organization.get()
    assert len(Flaky.seen) == 1 and refused.value.retry_after_s == 3600


@pytest.fixture
def rate_limited_url(prepared: Any) -> Iterator[str]:
    """The API with a very low per-key rate limit (2 requests per 10 s), on a socket of its own."""
    import uvicorn

    from mint.api.app import create_app
    from mint.worker.dispatch import CeleryDispatch

    app = create_app(prepared.model_copy(update={"rate_limit": "2/10 seconds"}), dispatch=CeleryDispatch(prepared))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, name="rate-limited-api", daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the rate-limited API did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{server.config.port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.mark.torch
def test_a_wait_loop_under_a_very_low_rate_limit_waits_out_its_429s_and_completes(
    sdk: Mint, worker: subprocess.Popen[bytes], owner: Tenant, rate_limited_url: str, caplog: Any
) -> None:
    """`job.wait()` against an API that allows 2 requests per 10 s: polls are refused with 429,
    each is waited out as its Retry-After says, and the wait returns the finished job; whether
    each request waits out its own 429s (the default) or, when it may not wait at all
    (`max_rate_limit_wait_s=0`), the wait loop does."""
    import logging
    import re

    def waits_logged() -> list[float]:
        found = [re.search(r"HTTP 429.*waiting ([0-9.]+)s", record.getMessage()) for record in caplog.records]
        return [float(match.group(1)) for match in found if match]

    def use_up_the_window(client: Mint) -> None:
        """Two requests: the key's whole window, so the next request is refused."""
        for _ in range(2):
            client.organization.get()

    dataset = sdk.datasets.upload(jsonl(chat_rows(8, "limited")), filename="limited.jsonl")
    job = sdk.jobs.create(BASE, dataset.id, suffix="limited-bot", steps=3, seed=5)
    with caplog.at_level(logging.INFO, "mint.sdk"):
        with Mint(rate_limited_url, owner.keys["developer"], max_rate_limit_wait_s=0) as impatient:
            use_up_the_window(impatient)
            done = impatient.jobs.wait(job.id, progress=True, poll_interval_s=0.5)
        assert done.status == "succeeded" and done.completed_steps == 3
        by_the_loop = waits_logged()
        assert by_the_loop, "no poll met the rate limit"
        caplog.clear()
        with Mint(rate_limited_url, owner.keys["developer"]) as patient:
            use_up_the_window(patient)
            assert patient.jobs.wait(job.id, progress=False).status == "succeeded"
        by_the_request = waits_logged()
    assert by_the_request, "the wait's poll did not meet the rate limit"
    # Every pause is what the server asked: Retry-After is whole seconds, 1 to 10 for this limit.
    assert all(1.0 <= pause <= 10.0 for pause in by_the_loop + by_the_request), (by_the_loop, by_the_request)


@pytest.mark.torch
def test_a_job_waited_for_succeeds_with_events_checkpoints_and_an_adapter(
    sdk: Mint, trained: list[Job], tmp_path: Path
) -> None:
    job = trained[0]
    assert isinstance(job, Job) and job.status == "succeeded", job.error
    assert job.completed_steps == job.total_steps == 3 and job.fine_tuned_model is not None
    assert job.fine_tuned_model.startswith("sdk-bot@")
    assert {j.id for j in sdk.jobs.list(limit=1)} >= {j.id for j in trained}
    assert job.refresh() == job

    events = list(sdk.jobs.events(job.id, limit=2))  # several pages, newest first
    steps = [e.data["step"] for e in reversed(events) if e.type == "metrics"]
    assert steps == [1, 2, 3] and all("loss" in e.data for e in events if e.type == "metrics")
    assert [e.id for e in sdk.jobs.follow(job.id)] == [e.id for e in reversed(events)]
    assert isinstance(sdk.jobs.checkpoints(job.id), list)

    version = sdk.adapters.resolve(job.fine_tuned_model)
    assert version.training_job_id == job.id and version.model == job.fine_tuned_model
    adapter = sdk.adapters.get(version.adapter_id)
    assert sdk.adapters.find("sdk-bot") == adapter == sdk.adapters.find(adapter.id)
    assert adapter.name == "sdk-bot" and [v.model for v in sdk.adapters.versions(adapter.id)] == sorted(
        (j.fine_tuned_model for j in trained), reverse=True
    )
    folder = sdk.adapters.download(job.fine_tuned_model, tmp_path / "peft")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert json.loads((folder / "adapter_config.json").read_text())["r"] >= 1

    with pytest.raises(ConflictError, match="already"):
        job.cancel()
    with pytest.raises(NotFoundError):
        sdk.adapters.resolve("sdk-bot@99")
    with pytest.raises(NotFoundError, match="no adapter named 'nobody'"):
        sdk.adapters.find("nobody")


def test_a_queued_job_and_run_can_be_cancelled(sdk: Mint) -> None:
    """On a base with no worker here, a job and a run stay queued until cancelled."""
    dataset = sdk.datasets.upload(jsonl(chat_rows(2, "idle")))
    job = sdk.jobs.create("tiny-qwen3-moe", dataset.id, steps=1)
    assert job.cancel().status == "cancelled"
    benchmark = sdk.benchmarks.create("idle-bench", content=jsonl(ACK_TASKS).decode(), grader="normalized")
    run = sdk.evals.create(benchmark.id, "tiny-qwen3-moe")
    assert isinstance(run, EvalRun) and run.cancel().status == "cancelled"


@pytest.mark.torch
def test_benchmarks_evals_compare_and_mine(sdk: Mint, trained: list[Job], tmp_path: Path) -> None:
    yaml_path = tmp_path / "ack.yaml"
    yaml_path.write_text(
        "grader: {type: normalized}\ntasks:\n" + "".join(f"  - {json.dumps(task)}\n" for task in ACK_TASKS)
    )
    benchmark = sdk.benchmarks.create("ack-sdk", path=yaml_path, description="answer OK")
    assert benchmark.latest_version is not None and benchmark.latest_version.task_count == len(ACK_TASKS)
    from_text = sdk.benchmarks.create("ack-sdk-text", content=jsonl(ACK_TASKS).decode(), grader="normalized")
    assert from_text.latest_version is not None
    assert from_text.latest_version.sha256 == benchmark.latest_version.sha256  # same tasks, either way
    builtin = sdk.benchmarks.create("arith-sdk", builtin="arithmetic", n=2)
    assert builtin.latest_version is not None and builtin.latest_version.task_count == 4
    added = sdk.benchmarks.create_version(benchmark.id, content=jsonl(ACK_TASKS[:2]).decode(), grader="normalized")
    assert [v.version for v in sdk.benchmarks.versions(benchmark.id, limit=1)] == [added.version, 1]

    before = sdk.evals.run(benchmark.id, BASE, version=1, max_tokens=4, poll_interval_s=0.2)
    after = sdk.evals.create(benchmark.id, trained[0].fine_tuned_model or "", version=1, max_tokens=4)
    after = after.wait(poll_interval_s=0.2)
    assert before.status == after.status == "succeeded"
    assert before.metrics["tasks"] == after.metrics["tasks"] == len(ACK_TASKS)
    assert {run.id for run in sdk.evals.list(benchmark_id=benchmark.id)} == {before.id, after.id}

    failed = list(before.trajectories(passed=False, limit=1))
    passed = list(sdk.evals.trajectories(before.id, passed=True))
    assert len(failed) + len(passed) == len(ACK_TASKS) and all(not t.passed for t in failed)
    assert len(failed) == len(ACK_TASKS) - before.metrics["passed"]

    comparison = sdk.evals.compare(before.id, after.id, resamples=200)
    assert comparison.tasks == len(ACK_TASKS) and comparison.a.run_id == before.id
    assert len(comparison.fixed) + len(comparison.broken) + len(comparison.still_passing) + len(
        comparison.still_failing
    ) == len(ACK_TASKS)
    assert comparison.accuracy_delta == pytest.approx(comparison.b.accuracy - comparison.a.accuracy)

    if failed:
        mined = sdk.evals.from_failures(before.id, kind="chat")
        assert mined.kind == "chat" and mined.failed_tasks == len(failed) and mined.row_count == len(failed)


@pytest.mark.torch
def test_deployments_promote_roll_back_and_withdraw(sdk: Mint, trained: list[Job]) -> None:
    first, second = sorted((job.fine_tuned_model or "" for job in trained), key=lambda ref: int(ref.split("@")[1]))
    created = sdk.deployments.create("sdk-prod", model=first, reason="first")
    assert created.current_revision == 1 and created.serving is not None
    assert created.serving.routing["model"] == first
    promoted = sdk.deployments.promote("sdk-prod", model=second, reason="better")
    assert promoted.serving is not None and promoted.serving.routing["model"] == second
    rolled = sdk.deployments.rollback(created.id)
    assert (
        rolled.serving is not None and rolled.serving.routing["model"] == first and rolled.serving.action == "rollback"
    )
    again = sdk.deployments.rollback("sdk-prod", to_revision=2, reason="fixed")
    assert again.serving is not None and again.serving.routing["model"] == second
    assert [r.action for r in sdk.deployments.revisions("sdk-prod")] == ["rollback", "rollback", "promote", "create"]
    assert sdk.deployments.get("sdk-prod").id == created.id
    assert created.id in {d.id for d in sdk.deployments.list()}
    assert sdk.deployments.withdraw("sdk-prod", reason="incident").status == "withdrawn"
    with pytest.raises(ConflictError):
        sdk.deployments.withdraw("sdk-prod")
    with pytest.raises(ConflictError, match="already"):
        sdk.deployments.create("sdk-prod", model=first)


@pytest.mark.torch
def test_chat_whole_and_streamed_on_a_base_and_a_deployment(
    sdk: Mint, trained: list[Job], node: Any, live_server: LiveServer, owner: Tenant
) -> None:
    whole = sdk.chat.create(BASE, QUESTION, max_tokens=6, temperature=0)
    assert whole.mint.adapter is None and whole.usage.completion_tokens >= 1
    text = whole.choices[0]["message"]["content"]

    with sdk.chat.create(BASE, QUESTION, stream=True, max_tokens=6, temperature=0) as stream:
        deltas = list(stream.text_deltas())
    assert "".join(deltas) == stream.text == text
    assert stream.served is not None and stream.served.base_model == BASE
    assert stream.usage is not None and stream.usage.completion_tokens == whole.usage.completion_tokens

    ref = trained[1].fine_tuned_model or ""
    sdk.deployments.create("sdk-chat", model=ref)
    served = sdk.chat.completions.create("sdk-chat", QUESTION, max_tokens=4, temperature=0)
    assert served.mint.adapter == ref and served.mint.deployment == "sdk-chat"
    chunks = list(sdk.chat.create("sdk-chat", QUESTION, stream=True, max_tokens=4, temperature=0))
    assert chunks[0].mint is not None and chunks[0].mint.adapter == ref
    assert (
        "".join(choice.content for chunk in chunks for choice in chunk.choices)
        == served.choices[0]["message"]["content"]
    )

    completion = sdk.completions.create(BASE, "Once upon a time", max_tokens=4, temperature=0)
    assert completion.usage.completion_tokens >= 1
    with sdk.completions.create(BASE, "Once upon a time", stream=True, max_tokens=4, temperature=0) as pieces:
        assert "".join(pieces.text_deltas()) == completion.choices[0]["text"]
    assert {BASE, ref, "sdk-chat"} <= {card.id for card in sdk.models.list()}
    assert sdk.models.get(ref).id == ref
    assert BASE in {base.name for base in sdk.base_models.list()}
    with pytest.raises(NotFoundError):
        sdk.chat.create("nobody@1", QUESTION, max_tokens=2)

    async def streamed() -> tuple[str, str]:
        async with AsyncMint(live_server.url, owner.keys["developer"]) as client:
            reply = await client.chat.create(BASE, QUESTION, max_tokens=6, temperature=0)
            stream = await client.chat.create(BASE, QUESTION, stream=True, max_tokens=6, temperature=0)
            async with stream:
                pieces = [delta async for delta in stream.text_deltas()]
            return reply.choices[0]["message"]["content"], "".join(pieces)

    assert asyncio.run(streamed()) == (text, text)


@pytest.mark.torch
def test_the_async_twin_reads_jobs_adapters_and_lists(
    live_server: LiveServer, owner: Tenant, trained: list[Job], sdk: Mint, tmp_path: Path
) -> None:
    job = trained[0]

    async def read() -> None:
        async with AsyncMint(live_server.url, owner.keys["viewer"]) as client:
            fetched = await client.jobs.get(job.id)
            assert (await fetched.wait(progress=False)).status == "succeeded"
            assert job.id in {j.id async for j in client.jobs.list(limit=1)}
            assert [e.id async for e in client.jobs.follow(job.id)] == [e.id for e in sdk.jobs.follow(job.id)]
            assert len(await client.jobs.checkpoints(job.id)) == len(sdk.jobs.checkpoints(job.id))
            version = await client.adapters.resolve(job.fine_tuned_model or "")
            assert (await client.adapters.find("sdk-bot")).id == version.adapter_id
            assert version.training_job_id == job.id
            folder = await client.adapters.download(version, tmp_path / "async-peft")
            assert (folder / "adapter_model.safetensors").is_file()
            assert {card.id for card in await client.models.list()} >= {BASE, version.model or ""}
            with pytest.raises(NotFoundError):
                await client.evals.get("eval_missing")
            assert (await client.organization.get()).id == owner.organization_id

    asyncio.run(read())


@pytest.mark.torch
def test_keys_usage_and_audit_log(live_server: LiveServer, owner: Tenant, trained: list[Job]) -> None:
    with Mint(live_server.url, owner.keys["admin"]) as admin:
        created = admin.api_keys.create("sdk-ci", role="viewer")
        assert created.key.startswith("tml-") and admin.api_keys.get(created.id).role == "viewer"
        with Mint(live_server.url, created.key) as ci:
            assert ci.organization.get().id == owner.organization_id
        assert admin.api_keys.revoke(created.id).revoked_at is not None
        assert created.id in {key.id for key in admin.api_keys.list(limit=2)}
        trained_tokens = [line for line in admin.organization.usage().data if line.kind == "trained"]
        assert trained_tokens and trained_tokens[0].tokens > 0
        assert any(entry.resource_id == created.id for entry in admin.organization.audit_log(limit=5))


def test_a_job_is_estimated_and_one_over_a_spend_limit_raises_a_typed_error(
    live_server: LiveServer, tenant: Tenant
) -> None:
    with Mint(live_server.url, tenant.keys["admin"]) as admin:
        file = admin.files.create(jsonl(chat_rows(8, "spend")), filename="spend.jsonl", kind="chat")
        estimate = admin.jobs.estimate("tiny-qwen3-moe", file.id, steps=6, budget_usd=1.0)
        assert estimate.steps == 6 and estimate.trained_tokens > 0 and estimate.cost_usd > 0
        assert (estimate.allowed_usd, estimate.limited_by) == (1.0, "the job's budget_usd")
        limits = admin.organization.set_spend_limits(job_usd=estimate.cost_usd / 2)
        assert limits.job_usd == pytest.approx(estimate.cost_usd / 2) and limits.month_usd is None
        with pytest.raises(SpendLimitExceededError, match="per-job spend limit") as refused:
            admin.jobs.create("tiny-qwen3-moe", file.id, steps=6)
        assert refused.value.status_code == 402 and isinstance(refused.value, errors.SpendLimitExceeded)
        assert admin.organization.set_spend_limits(job_usd=None).job_usd is None
        prices = {line.base_model: line for line in admin.organization.prices().data}
        assert prices["tiny-qwen3-moe"].usd_per_million_trained > 0
        with pytest.raises(BadRequestError, match="per_day"):
            admin.organization.set_spend_limits(per_day=3.0)
