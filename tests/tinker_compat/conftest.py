"""Fixtures for the Tinker-compatible routes: the API on a real socket, one training worker of
the tiny base for the whole package, and the official `tinker` SDK pointed at them.

Nothing of the client is patched: it talks HTTP to `live_server` with a Mint key, exactly as
it would talk to any Tinker server.
"""

from __future__ import annotations

import io
import signal
import subprocess
import tarfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
import torch
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from mint.config import Settings
from mint.services.workers import list_workers
from mint.storage.db import session_scope
from tests.conftest import LiveServer, Tenant, Workers, make_tenant, wait_for

BASE = "tiny-glm-moe"
# Only so that a hung process cannot hang the suite; everything here takes seconds.
HANG_S = 600.0
# How long the SDK's close may take before the session is finished over plain HTTP (`finish`).
CLOSE_S = 120.0

# The client computes custom losses with torch in this process: one thread, as the suite asks.
torch.set_num_threads(1)


class TinkerWorker:
    """The package's training worker process (`mint worker --base tiny-glm-moe`); `crash_and_restart`
    kills it (SIGKILL) and starts another under the same name, as a supervisor would."""

    NAME = "tinker"

    def __init__(
        self, settings: Settings, *, name: str = NAME, base: str = BASE, env: dict[str, str] | None = None
    ) -> None:
        self.settings = settings
        self.name, self.base, self.env = name, base, {"OMP_NUM_THREADS": "1", **(env or {})}
        self.running = Workers()
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        process = self.running.start(self.name, env=self.env, base=self.base)

        def registered() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the worker exited with {process.returncode}")
            with session_scope(self.settings.database) as session:
                return any(w.pid == process.pid for w in list_workers(session))

        wait_for(registered, "the Tinker worker to register", timeout=HANG_S)
        return process

    def crash_and_restart(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.process = self._start()

    def stop(self) -> None:
        self.running.stop_all()


@pytest.fixture(scope="package")
def tinker_worker(prepared: Settings) -> Iterator[TinkerWorker]:
    """One training worker of the tiny base for the whole package, registered."""
    worker = TinkerWorker(prepared)
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="package")
def live_server(live_server: LiveServer, app: Any) -> LiveServer:
    """The session's live server, whose address the app's settings carry as MINT_PUBLIC_URL:
    download URLs are built from settings alone (never from a request's Host header), and this
    server listens on a port of its own rather than MINT_API_PORT."""
    app.state.settings = app.state.settings.model_copy(update={"public_url": live_server.url})
    return live_server


@pytest.fixture(scope="package")
def alice(prepared: Settings) -> Tenant:
    return make_tenant(prepared, "tinker-alice")


@pytest.fixture(scope="package")
def bob(prepared: Settings) -> Tenant:
    return make_tenant(prepared, "tinker-bob")


@pytest.fixture
def connect(live_server: LiveServer) -> Iterator[Callable[[Tenant], tinker.ServiceClient]]:
    """`connect(tenant)`: a `tinker.ServiceClient` on the live server with the tenant's developer
    key; each is finished (`close("success")`) after the test."""
    clients: list[tuple[tinker.ServiceClient, Tenant]] = []

    def make(tenant: Tenant) -> tinker.ServiceClient:
        client = tinker.ServiceClient(base_url=live_server.url, api_key=tenant.keys["developer"])
        clients.append((client, tenant))
        return client

    yield make
    for client, tenant in clients:
        finish(live_server, client, tenant)


def finish(live_server: LiveServer, client: tinker.ServiceClient, tenant: Tenant) -> None:
    """Finish the client's session by the SDK's own `close("success")`.

    Once in a long run, that close has waited for ever with its event loop idle and the server
    idle, the finish request never sent. After CLOSE_S the session is finished over plain HTTP
    instead, and the server must answer that: a hang in the client then costs a warning, while a
    server that does not finish sessions still fails the test.
    """
    holder = client._session_holder  # the SDK's session, if the test opened one (no public accessor)
    session_id = None if holder is None else holder.get_session_id()
    try:
        client.close("success").result(timeout=CLOSE_S)
        return
    except TimeoutError:
        if session_id is None:
            raise
    with api(live_server, tenant) as http:
        answer = http.post(f"/api/v1/sessions/{session_id}/finish", json={"reason": {"type": "success"}})
    assert answer.status_code == 200, answer.text
    warnings.warn(
        f"tinker's close of session {session_id} hung for {CLOSE_S:.0f} s; finished it over HTTP", stacklevel=1
    )


@pytest.fixture
def rest(live_server: LiveServer) -> Callable[[Tenant], tinker.RestClient]:
    return lambda tenant: tinker.RestClient(base_url=live_server.url, api_key=tenant.keys["developer"])


def api(live_server: LiveServer, tenant: Tenant) -> httpx.Client:
    """Plain HTTP to the server with the tenant's key in the header the SDK uses."""
    return httpx.Client(base_url=live_server.url, headers={"X-API-Key": tenant.keys["developer"]}, timeout=60)


def download_tokenizer(live_server: LiveServer, tenant: Tenant, folder: Path) -> Path:
    """What a client on another machine does: fetch the base's tokenizer into a local folder."""
    with api(live_server, tenant) as client:
        response = client.get(f"/api/v1/tokenizers/{BASE}")
    assert response.status_code == 200, response.text
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(response.content)) as archive:
        archive.extractall(folder, filter="data")
    return folder


def post_forward_backward(
    http: httpx.Client,
    model_id: str,
    seq_id: int,
    tokens: list[int],
    *,
    weights: list[float] | None = None,
    copies: int = 1,
    forward_only: bool = False,
) -> httpx.Response:
    """A forward_backward request as the SDK encodes it (protobuf): `copies` times the sequence
    `tokens`, every position weighted 1 unless `weights` says otherwise."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights or [1.0] * (len(tokens) - 1)},
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum] * copies, loss_fn="cross_entropy"),
        model_id=model_id,
        seq_id=seq_id,
    )
    message = forward_backward_request_to_proto(request)
    message.forward_only = forward_only
    return http.post(
        "/api/v1/forward_backward",
        content=message.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
