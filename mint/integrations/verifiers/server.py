"""The environment server: a team's `verifiers` environment, unmodified, behind Mint's remote
environment protocol (`mint.schemas.remote_environments`), in the team's own processes
(`mint env-server path/to/environment.py`).

Two processes. This one speaks HTTP to Mint: it checks each request's signature (as
`mint reward-server` does), maps the request to an operation and answers with what the
environment process answered. The environment process (`episode_process.py`, run with the
Python of the virtualenv where `verifiers` is installed, since verifiers' dependencies and
Mint's do not fit in one environment) loads the environment and plays its episodes one model
turn at a time; the two talk in JSON lines over the child's standard input and output.

Mint retries a call that timed out or failed with a 5xx under the same `webhook-id`; a step
must not be played twice, so the answers of the last calls are kept by that id, and a repeat
gets the first call's answer (waiting for it if it is still being played).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import subprocess
import threading
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from standardwebhooks.webhooks import Webhook
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mint import errors
from mint.integrations.signed_server import MAX_REQUEST_BYTES, check_secret, error_answer, signed_body
from mint.schemas.remote_environments import (
    ENVIRONMENT_CLOSE_TYPE,
    ENVIRONMENT_START_TYPE,
    ENVIRONMENT_STEP_TYPE,
    ENVIRONMENT_TASKS_TYPE,
    MAX_OBSERVATION_BYTES,
)

log = logging.getLogger(__name__)

# Where `mint env-server` reads its secret, and the environment's Python, when not given.
SECRET_VARIABLE = "MINT_ENVIRONMENT_SECRET"
PYTHON_VARIABLE = "MINT_VERIFIERS_PYTHON"
EPISODE_PROGRAM = Path(__file__).with_name("episode_process.py")
# The operation of each request type, and the fields of the request it takes.
OPERATIONS = {
    ENVIRONMENT_TASKS_TYPE: ("tasks", ()),
    ENVIRONMENT_START_TYPE: ("start", ("task",)),
    ENVIRONMENT_STEP_TYPE: ("step", ("episode", "message")),
    ENVIRONMENT_CLOSE_TYPE: ("close", ("episode",)),
}
# Answers kept for repeated calls (by webhook-id).
REMEMBERED_ANSWERS = 1024


class EnvironmentProcessFailed(Exception):
    """The environment process could not start, or exited."""


class EpisodeProcess:
    """The child that runs the environment; `call` sends one operation and returns its answer."""

    def __init__(
        self, environment: Path, *, python: str, harness: str = "null", taskset_args: dict[str, Any] | None = None
    ) -> None:
        command = [python, str(EPISODE_PROGRAM), str(environment), "--harness", harness]
        command += ["--taskset-args", json.dumps(taskset_args or {})]
        # The venv's own commands first: verifiers' harness runs its chat program with its `uv`.
        path = os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")])
        try:
            self.child = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"},
            )
        except OSError as exc:
            raise EnvironmentProcessFailed(f"could not run {python}: {exc}") from None
        assert self.child.stdin is not None and self.child.stdout is not None
        self._in, self._out = self.child.stdin, self.child.stdout
        ready = self._out.readline()
        if not ready:
            code = self.child.wait()
            raise EnvironmentProcessFailed(
                f"the environment process exited (status {code}) before it was ready; its log above says why "
                f"(is verifiers installed for {python}? does {environment} export its Taskset in __all__?)"
            )
        self.tasks = int(json.loads(ready)["tasks"])
        self._numbers = itertools.count(1)
        self._waiting: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._read, name="environment-answers", daemon=True).start()

    def _read(self) -> None:
        for line in self._out:
            answer = json.loads(line)
            with self._lock:
                waiting = self._waiting.pop(answer.get("id"), None)
            if waiting is not None:
                waiting.set_result(answer)
        code = self.child.wait()
        with self._lock:
            orphans, self._waiting = list(self._waiting.values()), {}
        for waiting in orphans:
            waiting.set_exception(EnvironmentProcessFailed(f"the environment process exited (status {code})"))

    def call(self, op: str, **fields: Any) -> Future[dict[str, Any]]:
        """Send one operation; the future holds `{"result": ...}` or `{"error": {"message", "status"}}`."""
        number = next(self._numbers)
        answer: Future[dict[str, Any]] = Future()
        with self._lock:
            if self.child.poll() is not None:
                raise EnvironmentProcessFailed(f"the environment process exited (status {self.child.returncode})")
            self._waiting[number] = answer
            self._in.write(json.dumps({"id": number, "op": op, **fields}) + "\n")
            self._in.flush()
        return answer

    def stop(self) -> None:
        """End the child: its input closes, it drops its episodes and exits."""
        if self.child.poll() is None:
            self._in.close()
            try:
                self.child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.child.kill()


def _operation(body: bytes) -> tuple[str, dict[str, Any]]:
    """The operation a request asks for and its fields; InvalidRequest naming what is wrong."""
    try:
        request = json.loads(body)
    except ValueError as exc:
        raise errors.InvalidRequest(f"the body is not JSON: {exc}", param="body") from None
    kind = request.get("type") if isinstance(request, dict) else None
    if kind not in OPERATIONS:
        raise errors.InvalidRequest(
            f"type: {kind!r} is not an environment request; one of {', '.join(OPERATIONS)}", param="type"
        )
    op, names = OPERATIONS[kind]
    missing = [name for name in names if name not in request]
    if missing:
        raise errors.InvalidRequest(f"{missing[0]}: required for {kind}", param=missing[0])
    return op, {name: request[name] for name in names}


def create_app(process: EpisodeProcess, secret: str, *, max_request_bytes: int = MAX_REQUEST_BYTES) -> Starlette:
    """The server: `POST` (any path) plays a signed environment request; `GET /health` says it is up."""
    signer = Webhook(check_secret(secret, SECRET_VARIABLE))
    answers: OrderedDict[str, asyncio.Future[Response]] = OrderedDict()

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "tasks": process.tasks})

    async def play(op: str, fields: dict[str, Any]) -> Response:
        try:
            answer = await asyncio.wrap_future(process.call(op, **fields))
        except EnvironmentProcessFailed as exc:
            return error_answer(503, "environment_unavailable", f"{exc}; restart mint env-server")
        if "error" in answer:
            status = int(answer["error"].get("status", 500))
            kind = "invalid_request_error" if status < 500 else "environment_error"
            return error_answer(status, kind, str(answer["error"].get("message")))
        encoded = json.dumps(answer["result"], allow_nan=False, separators=(",", ":")).encode()
        if len(encoded) > MAX_OBSERVATION_BYTES:
            return error_answer(
                500, "environment_error", f"the observation is longer than {MAX_OBSERVATION_BYTES} bytes"
            )
        return Response(encoded, media_type="application/json")

    async def environment(request: Request) -> Response:
        body = await signed_body(request, signer, max_request_bytes)
        if isinstance(body, Response):
            return body
        try:
            op, fields = _operation(body)
        except errors.InvalidRequest as exc:
            return error_answer(400, exc.type, exc.message, param=exc.param or "body")
        call_id = request.headers.get("webhook-id", "")
        if call_id in answers:  # a retry: the first call's answer, never a second turn
            return await asyncio.shield(answers[call_id])
        answer = asyncio.ensure_future(play(op, fields))
        if call_id:
            answers[call_id] = answer
            while len(answers) > REMEMBERED_ANSWERS:
                answers.popitem(last=False)
        return await asyncio.shield(answer)

    return Starlette(
        routes=[Route("/health", health, methods=["GET"]), Route("/{path:path}", environment, methods=["POST"])]
    )
