"""What Mint's logs say. An error the API answers: a condition Mint named (a MintError) is one
line without a traceback, a 503 (no serving node yet, a backing service down) only a warning; a
traceback only for an error nobody raised on purpose. Every request: one line, under an id that
its answer carries and the work it starts (queue messages, serving-node calls) carries on."""

from __future__ import annotations

import logging
import secrets

import pytest
from celery.signals import task_prerun
from fastapi import FastAPI
from fastapi.testclient import TestClient

from mint import errors, tracing
from mint.api.errors import install_error_handlers, mint_error_response
from mint.config import Settings
from mint.services.serving.node_client import request_headers


@pytest.mark.backend_free
def test_expected_conditions_are_one_line_and_crashes_keep_their_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mint.api.errors")
    mint_error_response(errors.ServiceUnavailable("no serving node of base 'tiny' is running; start one"))
    mint_error_response(errors.NotFound("no adapter named 'x'"))
    (unavailable,) = caplog.records
    assert unavailable.levelno == logging.WARNING and unavailable.exc_info is None
    assert unavailable.getMessage() == "ServiceUnavailable (503): no serving node of base 'tiny' is running; start one"

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    caplog.clear()
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/boom").status_code == 500
    (crash,) = caplog.records
    assert crash.levelno == logging.ERROR and crash.exc_info is not None


@pytest.mark.backend_free
def test_a_mistyped_name_gets_the_nearest_ones() -> None:
    names = ["smollm2-135m-instruct", "tiny-glm-moe", "tiny-qwen3-moe", "support-bot"]
    assert errors.did_you_mean("smollm2-135m", names) == " (did you mean 'smollm2-135m-instruct'?)"
    assert errors.did_you_mean("tiny-glm", names) == " (did you mean 'tiny-glm-moe'?)"
    assert errors.did_you_mean("tiny-moe", names).startswith(" (did you mean 'tiny-glm-moe' or 'tiny-qwen3-moe'")
    assert errors.did_you_mean("billing-classifier", names) == ""


def test_every_request_is_one_line_under_an_id_its_answer_carries(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mint.api.requests")
    answered = client.get("/healthz?signature=secret", headers={tracing.HEADER: "ci-run-42"})
    assert answered.headers[tracing.HEADER] == "ci-run-42"
    (line,) = [record for record in caplog.records if record.name == "mint.api.requests"]
    assert line.getMessage().startswith("GET /healthz 200 ") and "secret" not in line.getMessage()
    # An id that is not one (too long, spaces, control characters) is replaced by a new one.
    fresh = client.get("/healthz", headers={tracing.HEADER: "a b\tc"}).headers[tracing.HEADER]
    assert fresh.startswith("req_") and fresh != client.get("/healthz").headers[tracing.HEADER]


def test_the_work_a_request_starts_carries_its_id(prepared: Settings) -> None:
    """A queue message sent under a request names it in its headers, the worker's task runs
    under that id, and a call to a serving node names it in X-Request-Id."""
    from mint.services.dispatch import WorkerRef
    from mint.services.serving.nodes import NodeAddress
    from mint.worker import signals
    from mint.worker.app import celery_for
    from mint.worker.dispatch import CeleryDispatch
    from mint.worker.queues import process_queue

    nobody = WorkerRef(f"no-such-host-{secrets.token_hex(4)}", 1)  # a queue of this test's alone
    token = tracing.begin("req_feedbeef")
    try:
        CeleryDispatch(prepared)("mint.tests.never_run", args=["nothing"], worker=nobody)
        assert request_headers(NodeAddress("node_1", "http://127.0.0.1:9", "t"))[tracing.HEADER] == "req_feedbeef"
    finally:
        tracing.end(token)
    with celery_for(prepared).connection_for_read() as connection:
        queue = connection.SimpleQueue(process_queue(nobody.hostname, nobody.pid))
        message = queue.get(timeout=30)
        message.ack()
        queue.close()
    assert message.headers["task"] == "mint.tests.never_run"
    assert message.headers[tracing.MESSAGE_HEADER] == "req_feedbeef"

    app = celery_for(prepared)
    assert signals.on_task_start in [receiver() for _, receiver in task_prerun.receivers]

    @app.task(name="mint.tests.request_id_seen", shared=False)
    def request_id_seen() -> str | None:
        return tracing.current()

    assert request_id_seen.apply(headers={tracing.MESSAGE_HEADER: "req_feedbeef"}).get() == "req_feedbeef"
    assert request_id_seen.apply().get() is None and tracing.current() is None
