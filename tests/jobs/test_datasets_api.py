"""Datasets and files over HTTP: validation row by row, nothing stored on failure, content
stored once per hash, the size limit, and OpenAI's `files.create` through its own client."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import httpx
from fastapi.testclient import TestClient

from mint.config import Settings
from mint.storage.objects import object_store_for
from tests.conftest import LiveServer, Tenant
from tests.jobs.conftest import chat_rows, jsonl, preference_rows, prompt_rows, upload

MiB = 1024 * 1024


def _object_count(settings: Settings) -> int:
    return sum(1 for _ in object_store_for(settings).list("datasets/"))


def test_upload_infers_the_kind_and_counts_rows(client: TestClient, tenant: Tenant) -> None:
    chat = upload(client, tenant, chat_rows(5))
    assert (chat["kind"], chat["row_count"], chat["status"]) == ("chat", 5, "ready")
    assert upload(client, tenant, preference_rows(3))["kind"] == "preference"
    assert upload(client, tenant, prompt_rows(2))["kind"] == "prompts"
    listed = client.get("/v1/datasets", headers=tenant.headers("viewer")).json()
    assert {row["id"] for row in listed["data"]} >= {chat["id"]}
    content = client.get(f"/v1/datasets/{chat['id']}/content", headers=tenant.headers("viewer"))
    assert content.content == jsonl(chat_rows(5))


def test_identical_content_is_stored_once(
    client: TestClient, tenant: Tenant, other_tenant: Tenant, prepared: Settings
) -> None:
    rows = chat_rows(7)
    first = upload(client, tenant, rows)
    objects = _object_count(prepared)
    again = upload(client, tenant, rows, name="renamed.jsonl")
    theirs = upload(client, other_tenant, rows)
    assert again["id"] == first["id"] and theirs["id"] != first["id"]
    assert theirs["sha256"] == first["sha256"]
    assert _object_count(prepared) == objects


def test_invalid_rows_are_named_by_line_and_field_and_nothing_is_stored(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    rows = chat_rows(3)
    rows[1]["messages"][0]["role"] = "robot"
    body = jsonl(rows) + b"{not json\n"
    before_objects = _object_count(prepared)
    before = client.get("/v1/datasets", headers=tenant.headers()).json()["data"]
    response = client.post(
        "/v1/datasets", headers=tenant.headers(), files={"file": ("bad.jsonl", body, "application/jsonl")}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "line 2: messages[0].role" in error["message"] and "line 4: not valid JSON" in error["message"]
    assert error["param"] == "file"
    assert client.get("/v1/datasets", headers=tenant.headers()).json()["data"] == before
    assert _object_count(prepared) == before_objects


def test_wrong_kind_and_empty_files_are_refused(client: TestClient, tenant: Tenant) -> None:
    wrong = client.post(
        "/v1/datasets",
        headers=tenant.headers(),
        files={"file": ("p.jsonl", jsonl(prompt_rows(2)), "application/jsonl")},
        data={"kind": "chat"},
    )
    assert wrong.status_code == 400 and "line 1: messages" in wrong.json()["error"]["message"]
    empty = client.post("/v1/datasets", headers=tenant.headers(), files={"file": ("e.jsonl", b"\n\n", "text/plain")})
    assert empty.status_code == 400 and "no rows" in empty.json()["error"]["message"]
    unknown = client.post(
        "/v1/datasets", headers=tenant.headers(), files={"file": ("x", b"{}", "text/plain")}, data={"kind": "images"}
    )
    assert unknown.status_code == 422 and "kind" in unknown.text


def test_uploads_over_the_limit_get_413(prepared: Settings, tenant: Tenant) -> None:
    from mint.api.app import create_app

    small = create_app(prepared.model_copy(update={"max_upload_bytes": 200}))
    with TestClient(small) as client:
        response = client.post(
            "/v1/datasets", headers=tenant.headers(), files={"file": ("big.jsonl", jsonl(chat_rows(20)), "text/plain")}
        )
    assert response.status_code == 413 and "200-byte" in response.json()["error"]["message"]


def test_viewers_cannot_upload(client: TestClient, tenant: Tenant) -> None:
    response = client.post(
        "/v1/files", headers=tenant.headers("viewer"), files={"file": ("a.jsonl", jsonl(chat_rows(1)), "text/plain")}
    )
    assert response.status_code == 403


def test_openai_client_files(live_server: LiveServer, tenant: Tenant) -> None:
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=f"{live_server.url}/v1", api_key=tenant.keys["developer"], max_retries=0)
    created = client.files.create(file=("train.jsonl", jsonl(chat_rows(4))), purpose="fine-tune")
    assert created.id.startswith("file_") and created.bytes == len(jsonl(chat_rows(4)))
    assert created.filename == "train.jsonl" and created.purpose == "fine-tune"
    assert client.files.retrieve(created.id).id == created.id
    assert created.id in {f.id for f in client.files.list()}
    try:
        client.files.create(file=("bad.jsonl", b'{"messages": []}\n'), purpose="fine-tune")
    except BadRequestError as exc:
        assert "line 1" in str(exc)
    else:
        raise AssertionError("an invalid file was accepted")


def test_a_line_over_the_row_limit_is_refused_naming_it(prepared: Settings, tenant: Tenant) -> None:
    from mint.api.app import create_app

    rows = jsonl(chat_rows(3))
    lines = rows.split(b"\n")
    limit = max(len(line) for line in lines)
    ok = create_app(prepared.model_copy(update={"max_dataset_row_bytes": limit}))
    tight = create_app(prepared.model_copy(update={"max_dataset_row_bytes": limit - 1}))
    files = {"file": ("rows.jsonl", rows.replace(b"\n", b"\r\n"), "text/plain")}
    with TestClient(ok) as client:
        assert client.post("/v1/datasets", headers=tenant.headers(), files=files).status_code == 201
    with TestClient(tight) as client:
        response = client.post("/v1/datasets", headers=tenant.headers(), files=files)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert f"longer than {limit - 1} bytes" in message and "MINT_MAX_DATASET_ROW_BYTES" in message


def test_a_file_without_newlines_is_never_held_whole(live_server: LiveServer, tenant: Tenant) -> None:
    """48 MiB on one line, sent over a socket as a client would: the upload streams to a spool
    and validation reads up to the 16 MiB row limit of the line, then refuses it."""
    boundary = "mint-test-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="one.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    line_bytes = 48 * MiB

    def body() -> Iterator[bytes]:
        yield head + b'{"messages": "'
        filler = b"x" * (64 * 1024)
        for _ in range(line_bytes // len(filler)):
            yield filler
        yield b'"}' + tail

    headers = {**tenant.headers(), "Content-Type": f"multipart/form-data; boundary={boundary}"}
    with httpx.Client(base_url=live_server.url, timeout=120) as http:
        http.get("/healthz")  # connect before measuring
        tracemalloc.start()
        try:
            response = http.post("/v1/datasets", headers=headers, content=body())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert response.status_code == 400, response.text
    assert "line 1: longer than 16777216 bytes" in response.json()["error"]["message"]
    assert peak < 40 * MiB, f"{peak / MiB:.1f} MiB allocated to refuse a 48 MiB line"
