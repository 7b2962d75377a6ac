"""Test fixtures: the suite runs against real backing services, chosen by `--backend`.

- `embedded` (default): SQLite file, kombu's SQLAlchemy broker on SQLite, a local
  object-store folder, all under a temporary MINT_HOME: what `mint up` uses by default.
- `services`: a fresh PostgreSQL database (dropped at the end), Redis (a dedicated
  database number, flushed at the start), and S3 served by moto's server over HTTP on
  loopback: the production shape. S3 is the one service faked, since no S3 can run here.

`make test` runs the suite once per backend. Settings reach subprocesses (workers, `mint
up`) through MINT_* environment variables, exactly as in production.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from mint.config import Settings, get_settings

POSTGRES_ADMIN_URL = os.environ.get("MINT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("MINT_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
S3_BUCKET = "mint-test"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend",
        choices=("embedded", "services"),
        default="embedded",
        help="embedded: SQLite + SQLite broker + folder; services: PostgreSQL + Redis + S3 (moto).",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"mint backend: {config.getoption('--backend')}"


EMBEDDED_PASS_ONLY = ("backend_free", "client_surface", "long_run")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the services pass, leave out tests marked `backend_free` (models, trainer, the
    object-store contract that tests both stores itself: they touch no database or broker)
    and `client_surface` (the SDK, the CLI, the dashboard and the whole-loop test drive the
    API as clients; the services they call are tested on both backends by their own tests),
    and `long_run` (minutes of training, search or a worker group, which exercise the database,
    broker and store no differently from the shorter job, eval and crash-safety tests that run
    on both backends). All already ran in the embedded pass, so running them twice would only
    cost time."""
    if config.getoption("--backend") != "services":
        return

    def once(item: pytest.Item) -> bool:
        return any(item.get_closest_marker(name) is not None for name in EMBEDDED_PASS_ONLY)

    kept = [item for item in items if not once(item)]
    deselected = [item for item in items if once(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--backend"))


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """An S3 API on loopback (moto's server mode, in its own process), with dummy credentials in
    the env. Out of process, so that what the test process measures of its own memory
    (tracemalloc, in the download tests) is the API's alone: moto holds every object whole."""
    import httpx

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        if server.poll() is not None:
            raise RuntimeError(f"moto's server exited with {server.returncode}")
        try:
            httpx.get(f"{endpoint}/moto-api/", timeout=1)
        except httpx.TransportError:
            return False
        return True

    try:
        wait_for(answering, "moto's S3 server to start", timeout=60)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


@dataclass(frozen=True)
class PostgresDatabase:
    url: str
    name: str


def create_postgres_database() -> PostgresDatabase:
    import psycopg

    name = f"mint_test_{secrets.token_hex(4)}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return PostgresDatabase(url=f"{base}/{name}", name=name)


def drop_postgres_database(database: PostgresDatabase) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{database.name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def empty_database_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A factory-made empty database of the current backend, for migration tests."""
    if backend == "embedded":
        yield f"sqlite:///{tmp_path_factory.mktemp('empty-db') / 'empty.db'}"
        return
    database = create_postgres_database()
    yield database.url
    from mint.storage.db import dispose_engines

    dispose_engines()
    drop_postgres_database(database)


@pytest.fixture(scope="session")
def settings(
    backend: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Settings]:
    """Process settings for the whole session, exported as MINT_* for subprocesses."""
    home: Path = tmp_path_factory.mktemp("mint-home")
    # No per-key rate limit: the OpenAPI fuzz alone sends about 1,800 requests with one key in
    # 20 s, which would meet 429s instead of the routes under test. tests/test_rate_limits.py
    # gives its own apps a limit.
    # Webhook receivers in tests listen on 127.0.0.1, which Mint refuses by default;
    # tests/test_webhooks.py checks the refusal with its own settings.
    env = {
        "MINT_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "MINT_RATE_LIMIT": "",
        "MINT_ORG_RATE_LIMIT": "",
        # The Tinker suites share a few organizations over many tests whose sessions stay open:
        # far more live models than one organization's default quota. tests/test_quotas.py
        # checks the quota with its own.
        "MINT_QUOTA_TINKER_MODELS": "10000",
        "MINT_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "1",
    }
    database: PostgresDatabase | None = None
    if backend == "services":
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()
        database = create_postgres_database()
        endpoint = request.getfixturevalue("moto_endpoint")
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=S3_BUCKET)
        env |= {
            "MINT_DATABASE_URL": database.url,
            "MINT_BROKER_URL": REDIS_URL,
            "MINT_OBJECT_STORE_URL": f"s3://{S3_BUCKET}/objects",
            "MINT_S3_ENDPOINT_URL": endpoint,
        }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    get_settings.cache_clear()
    try:
        yield get_settings()
    finally:
        from mint.storage.db import dispose_engines

        dispose_engines()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        get_settings.cache_clear()
        if database is not None:
            drop_postgres_database(database)


@dataclass(frozen=True)
class OwnInstall:
    """A Mint install apart from the session's: its settings, and the MINT_* its processes need."""

    settings: Settings
    env: dict[str, str]


@pytest.fixture
def own_install(backend: str, settings: Settings, tmp_path: Path) -> Iterator[OwnInstall]:
    """A migrated Mint install of the test's own: a database, broker and object store that no
    other test's rows, messages or workers touch. For a test that runs workers of a base the
    rest of the suite keeps idle on purpose (`tiny-qwen3-moe`, whose queued jobs must stay
    queued). On the services backend: a new PostgreSQL database, which also carries the
    broker (kombu's SQL transport), and its own prefix of the session's S3 bucket (whose
    endpoint `settings` exported)."""
    from mint.services.setup import prepare_database

    env = {"MINT_HOME": str(tmp_path / "home")}
    database: PostgresDatabase | None = None
    if backend == "services":
        database = create_postgres_database()
        env |= {
            "MINT_DATABASE_URL": database.url,
            "MINT_BROKER_URL": f"sqla+{database.url}",
            "MINT_OBJECT_STORE_URL": f"s3://{S3_BUCKET}/{database.name}",
        }
    fields = {"home": Path(env["MINT_HOME"]), "database_url": None, "broker_url": None, "object_store_url": None}
    fields |= {
        name: env[f"MINT_{name.upper()}"]
        for name in ("database_url", "broker_url", "object_store_url")
        if f"MINT_{name.upper()}" in env
    }
    own = Settings(**fields)  # type: ignore[arg-type]
    prepare_database(own)
    try:
        yield OwnInstall(own, env)
    finally:
        from mint.storage.db import dispose_engines

        dispose_engines()
        if database is not None:
            drop_postgres_database(database)


@pytest.fixture
def own_client(own_install: OwnInstall):  # type: ignore[no-untyped-def]
    """The API over `own_install`, in process."""
    from fastapi.testclient import TestClient

    from mint.api.app import create_app
    from mint.worker.dispatch import CeleryDispatch

    app = create_app(own_install.settings, dispatch=CeleryDispatch(own_install.settings))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="session")
def prepared(settings: Settings) -> Settings:
    """The session's database migrated to head with the base registry synced."""
    from mint.services.setup import prepare_database

    prepare_database(settings)
    return settings


@dataclass(frozen=True)
class Tenant:
    """An organization with one key of each role, made through the services."""

    organization_id: str
    name: str
    keys: dict[str, str]
    key_ids: dict[str, str]

    def headers(self, role: str = "admin") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"}


def make_tenant(settings: Settings, name: str | None = None) -> Tenant:
    from mint.services import auth
    from mint.storage.db import session_scope

    name = name or f"org-{secrets.token_hex(4)}"
    with session_scope(settings.database) as session:
        org = auth.create_organization(session, name=name)
        keys, key_ids = {}, {}
        for role in ("admin", "developer", "viewer"):
            key, secret = auth.create_api_key(session, auth.operator(org.id), name=f"{role} key", role=role)
            keys[role], key_ids[role] = secret, key.id
    return Tenant(organization_id=org.id, name=name, keys=keys, key_ids=key_ids)


def record_capture(
    tenant: Tenant, deployment_id: str, *, asked: str, answered: str, completion_id: str | None = None
) -> str:
    """Record one captured chat request of a deployment as the API's capture writer would, for
    tests that run no serving node (tests/serving/test_inference_api.py captures real traffic)."""
    from mint.services.serving.captures import CaptureRecord, CaptureTarget
    from mint.storage.db import session_scope
    from mint.storage.tables import utcnow

    record = CaptureRecord(
        id=completion_id or f"chatcmpl-{secrets.token_hex(16)}",
        organization_id=tenant.organization_id,
        target=CaptureTarget(deployment_id, rate=1.0, retention_days=30),
        revision=1,
        model_ref="captured@1",
        kind="chat",
        request={"messages": [{"role": "user", "content": asked}]},
        response={"choices": [{"index": 0, "message": {"role": "assistant", "content": answered}}]},
        prompt_tokens=3,
        completion_tokens=1,
        latency_ms=42.0,
        created_at=utcnow(),
    )
    with session_scope(get_settings().database) as session:
        session.add(record.row())
    return record.id


@functools.cache
def _capture_writer(database: str) -> Any:
    """One capture writer (and its thread) per database, for the helpers below."""
    from mint.services.serving.captures import CaptureWriter

    return CaptureWriter(database)


def record_episode_turn(
    tenant: Tenant,
    deployment_id: str,
    *,
    episode: str,
    messages: list[dict[str, Any]],
    answer: str | dict[str, Any],
    task: str | None = None,
    model_ref: str = "captured@1",
    revision: int = 1,
    prompt_token_ids: list[int] | None = None,
    token_ids: list[int] | None = None,
    logprobs: list[float] | None = None,
) -> str:
    """Record one turn of episode `episode` of a deployment whose capture records tokens, as the
    API records it: an `EpisodeTurnRecord` written by a `CaptureWriter`, for tests that run no
    serving node (tests/serving/test_episodes.py records real traffic). `messages` is what the
    harness sent, `answer` the assistant's text or message (tool calls and all). Returns the
    turn's completion id."""
    from mint.schemas.episodes import EpisodeMark
    from mint.services.serving.captures import CaptureTarget
    from mint.services.serving.episodes import EpisodeTurnRecord
    from mint.storage.tables import utcnow

    message = {"role": "assistant", "content": answer} if isinstance(answer, str) else answer
    token_ids = token_ids if token_ids is not None else [11, 12, 13]
    record = EpisodeTurnRecord(
        id=f"chatcmpl-{secrets.token_hex(16)}",
        organization_id=tenant.organization_id,
        target=CaptureTarget(deployment_id, rate=1.0, retention_days=30, tokens=True),
        mark=EpisodeMark(id=episode, task=task),
        revision=revision,
        model_ref=model_ref,
        request={"messages": messages},
        response={"message": message, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"},
        prompt_token_ids=prompt_token_ids if prompt_token_ids is not None else [1, 2, 3, 4],
        token_ids=token_ids,
        logprobs=logprobs if logprobs is not None else [-0.5] * len(token_ids),
        latency_ms=42.0,
        created_at=utcnow(),
    )
    writer = _capture_writer(get_settings().database)
    receipt = writer.offer(record)
    writer.flush()
    assert receipt.result(), f"the capture writer dropped turn {record.id} of episode {episode!r}"
    return record.id


def register_versions(
    settings: Settings, tenant: Tenant, name: str, count: int, base: str = "tiny-glm-moe"
) -> list[str]:
    """Register `count` versions (random content, rank 2, alpha 4) of the tenant's adapter `name`
    through the adapters service, without training; returns their `name@N` references."""
    from mint.services.models.adapters import register_version
    from mint.storage.db import session_scope
    from mint.storage.objects import object_store_for

    refs = []
    with session_scope(settings.database) as session:
        for _ in range(count):
            version = register_version(
                session,
                object_store_for(settings),
                organization_id=tenant.organization_id,
                name=name,
                base_model=base,
                archive=secrets.token_bytes(128),
                lora={"rank": 2, "alpha": 4.0},
            )
            refs.append(f"{name}@{version.version}")
    return refs


@pytest.fixture
def tenant(prepared: Settings) -> Tenant:
    return make_tenant(prepared)


@pytest.fixture
def other_tenant(prepared: Settings) -> Tenant:
    return make_tenant(prepared)


@pytest.fixture(scope="session")
def app(prepared: Settings):  # type: ignore[no-untyped-def]
    from mint.api.app import create_app
    from mint.worker.dispatch import CeleryDispatch

    return create_app(prepared, dispatch=CeleryDispatch(prepared))


@pytest.fixture
def client(app):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 180.0) -> Any:
    """Poll `condition` until it returns something true, and return that; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"gave up waiting for {what}")


@dataclass(frozen=True)
class LiveServer:
    url: str


@pytest.fixture(scope="session")
def live_server(app) -> Iterator[LiveServer]:  # type: ignore[no-untyped-def]
    """The app on a real socket (uvicorn in a thread), for official clients that speak HTTP."""
    import threading

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="live-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API server did not start")
        time.sleep(0.05)
    yield LiveServer(url=f"http://127.0.0.1:{port}")
    server.should_exit = True
    thread.join(timeout=10)


# Short leases and a fast reconciler: a killed worker's job is requeued within seconds.
FAST_RECOVERY = {"MINT_JOB_LEASE_S": "3", "MINT_RECONCILE_EVERY_S": "1", "MINT_REQUEUE_GRACE_S": "2"}
TRAINING_BASE = "tiny-glm-moe"


class Workers:
    """Starts and stops worker subprocesses for one test."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        name: str,
        env: dict[str, str] | None = None,
        base: str = TRAINING_BASE,
        nproc: int | None = None,
        machines: tuple[int, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """A worker for `base`; with `nproc`, a worker group of that many ranks (the process is its
        agent), and with `machines` (count, rendezvous host:port) this agent's share of a group
        that spans that many agents, as on several machines."""
        group = [f"--nproc={nproc}"] if nproc is not None else []
        if machines is not None:
            group += [f"--nnodes={machines[0]}", f"--rdzv-endpoint={machines[1]}"]
        process = subprocess.Popen(
            [sys.executable, "-m", "mint", "worker", "--base", base, "--name", f"{name}@%h", *group],
            env={**os.environ, **FAST_RECOVERY, **(env or {})},
        )
        self.processes.append(process)
        return process

    def beat(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "mint", "beat"], env={**os.environ, **FAST_RECOVERY, **(env or {})}
        )
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def workers() -> Iterator[Workers]:
    running = Workers()
    try:
        yield running
    finally:
        running.stop_all()


# Patterns that make a backtracking engine take exponential or polynomial time, and inputs that
# trigger it (20,000 characters at most); graders and routing rules run them on RE2, in linear time.
REDOS_PATTERNS = [
    ("^(a|a)*$", "a" * 19_999 + "!"),
    ("(a|aa)*b", "a" * 20_000),
    (r"(\w|_)*x", "_" * 20_000),
    (r"\d*\d*\d*\d*\d*x", "1" * 20_000),
    (".*a.*a.*a.*=", "a" * 20_000),
    ("(a+)+$", "a" * 19_999 + "!"),
    (r"^(\w+\s?)*$", "ab " * 6_000 + "!"),
    ("(?:a|b*)*c", "ab" * 10_000),
]


def poisoned(dead: str, lost: str, at_cap: str, cap: int) -> dict[str, dict[str, Any]]:
    """Rows (jobs or eval runs) out of attempts: `dead` running under a lapsed lease, `lost` queued
    again 500 times and its message lost, `at_cap` queued with its message still in the broker."""
    from mint.storage.tables import utcnow

    long_ago = utcnow() - timedelta(hours=1)
    return {
        dead: {"status": "running", "worker_id": "w-dead", "heartbeat_at": long_ago, "attempts": cap},
        lost: {"attempts": 500, "enqueued_at": long_ago},
        at_cap: {"attempts": cap},
    }


def reconcile_after(
    settings: Settings, model: Any, rows: dict[str, dict[str, Any]], *, lease_s: float = 60, grace_s: float = 60
) -> tuple[Any, list[tuple[str, list[str]]]]:
    """Set columns of `model` rows (id -> values), then run one reconciler pass (an empty broker,
    `settings.max_attempts`); returns its report and the (task, args) it sent."""
    from mint.services.upkeep.reconciler import reconcile_jobs
    from mint.storage.db import session_scope

    with session_scope(settings.database) as db:
        for row_id, values in rows.items():
            row = db.get(model, row_id)
            for name, value in values.items():
                setattr(row, name, value)
    sent: list[tuple[str, list[str]]] = []
    with session_scope(settings.database) as db:
        report = reconcile_jobs(
            db,
            lease_s=lease_s,
            grace_s=grace_s,
            pending=lambda base: frozenset(),
            send=lambda task, **message: sent.append((task, message["args"])),
            max_attempts=settings.max_attempts,
        )
    return report, sent


def serving_node(
    settings: Settings, base: str, env: dict[str, str] | None = None, *, timeout: float = 180.0
) -> Iterator[subprocess.Popen[bytes]]:
    """A serving node of `base` (settings from `env` on top of the session's), once registered."""
    from mint.services.serving.nodes import live_nodes
    from mint.storage.db import session_scope

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mint", "serve", "--base", base, "--port", str(port)], env={**os.environ, **(env or {})}
    )

    def registered() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the serving node exited with {process.returncode}")
        with session_scope(settings.database) as session:
            return any(node.url.endswith(f":{port}") for node in live_nodes(session, base))

    try:
        wait_for(registered, "the serving node to register", timeout=timeout)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
