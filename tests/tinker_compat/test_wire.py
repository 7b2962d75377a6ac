"""The protobuf forward_backward body: malformed input is a 400 naming the field, never a 500,
and numbers out of range (NaN and infinite loss settings or loss inputs, a seq_id past
int32, a shape that does not match its values) are refused."""

from __future__ import annotations

import struct
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
import tinker
from fastapi.testclient import TestClient
from httpx import Response
from tinker import types
from tinker.proto import tinker_public_pb2
from tinker.proto.request_conv import forward_backward_request_to_proto

from mint.api.app import create_app
from mint.config import Settings
from mint.errors import InvalidRequest, PayloadTooLarge
from mint.schemas.tinker_proto import BatchLimits, decode_forward_backward_request
from tests.conftest import Tenant

IDLE_BASE = "tiny-qwen3-moe"  # no worker of this module consumes its queue

NOT_UTF8 = b"\xff\xfe"


def length_delimited(number: int, payload: bytes) -> bytes:
    """One protobuf field of wire type 2 (bytes, strings, messages); payloads under 128 bytes."""
    return bytes([number << 3 | 2, len(payload)]) + payload


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (length_delimited(1, NOT_UTF8), "model_id"),
        (length_delimited(1, b"m") + length_delimited(4, NOT_UTF8), "loss_fn"),
        (length_delimited(1, b"m") + length_delimited(5, length_delimited(1, NOT_UTF8)), "loss_fn_config"),
        (
            length_delimited(1, b"m") + length_delimited(3, length_delimited(2, length_delimited(1, NOT_UTF8))),
            "data.loss_fn_inputs",
        ),
    ],
)
def test_strings_that_are_not_utf8_name_their_field(body: bytes, field: str) -> None:
    with pytest.raises(InvalidRequest, match=f"{field} is not valid UTF-8") as refused:
        decode_forward_backward_request(body, BatchLimits.from_settings(Settings()))
    assert refused.value.param == field


def test_a_model_id_that_is_not_utf8_gets_400(client: TestClient, tenant: Tenant) -> None:
    response = client.post(
        "/api/v1/forward_backward",
        content=length_delimited(1, NOT_UTF8),
        headers={**tenant.headers("developer"), "Content-Type": "application/x-protobuf"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "model_id"


# ---- limits on what a body may make the API decode --------------------------------------------

MiB = 1024 * 1024


def encoded_batch(data: int, tokens: int) -> bytes:
    """A forward_backward body as the SDK encodes it: `data` copies of a cross-entropy datum of
    `tokens` tokens (int32), with int64 targets and float32 weights, all unique values > 256."""
    sequence = [1000 + position % 30_000 for position in range(tokens + 1)]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(sequence[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=sequence[1:], dtype="int64"),
            "weights": types.TensorData(data=[0.5] * tokens, dtype="float32"),
        },
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum] * data, loss_fn="cross_entropy"),
        model_id="tks_x:train:0",
        seq_id=1,
    )
    return forward_backward_request_to_proto(request).SerializeToString()


def post_protobuf(client: TestClient, tenant: Tenant, body: bytes) -> Response:
    headers = {**tenant.headers("developer"), "Content-Type": "application/x-protobuf"}
    return client.post("/api/v1/forward_backward", content=body, headers=headers)


def test_a_batch_over_the_number_limit_is_refused_before_it_is_decoded(client: TestClient, tenant: Tenant) -> None:
    """14 data of 100,000 tokens (4.2 million values, 22 MB of protobuf) would decode into about
    150 MiB of Python ints and floats; the limit is checked from the declared lengths first."""
    body = encoded_batch(data=14, tokens=100_000)
    limit = Settings().tinker_max_batch_numbers
    assert limit < 14 * 3 * 100_000 and len(body) < Settings().tinker_max_body_bytes
    tracemalloc.start()
    try:
        response = post_protobuf(client, tenant, body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["type"] == "payload_too_large_error"
    assert f"more than {limit} tokens and loss-input values" in error["message"]
    assert "MINT_TINKER_MAX_BATCH_NUMBERS" in error["message"]
    # The body, and the copies the test client and Starlette make of it; no decoded values.
    assert peak < 2 * len(body), f"{peak / MiB:.1f} MiB allocated to refuse a {len(body) / MiB:.1f} MiB body"


def test_too_many_data_are_refused_however_small(client: TestClient, tenant: Tenant) -> None:
    """Each datum costs objects even with no tokens: their count has its own limit."""
    limit = Settings().tinker_max_batch_data
    response = post_protobuf(client, tenant, encoded_batch(data=limit + 1, tokens=1))
    assert response.status_code == 413, response.text
    assert f"more than {limit} data" in response.json()["error"]["message"]
    assert "MINT_TINKER_MAX_BATCH_DATA" in response.json()["error"]["message"]


def test_a_datum_over_the_token_limit_is_refused(client: TestClient, tenant: Tenant) -> None:
    limit = Settings().tinker_max_datum_tokens
    response = post_protobuf(client, tenant, encoded_batch(data=1, tokens=limit + 1))
    assert response.status_code == 413, response.text
    message = response.json()["error"]["message"]
    assert f"data[0] with {limit + 1} tokens, over {limit} per datum" in message
    assert "MINT_TINKER_MAX_DATUM_TOKENS" in message


def test_limits_hold_at_their_edge() -> None:
    limits = BatchLimits(max_data=2, max_numbers=3 * 2 * 10, max_datum_tokens=10)
    decoded = decode_forward_backward_request(encoded_batch(data=2, tokens=10), limits)
    assert [len(datum.tokens) for datum in decoded.data] == [10, 10]
    assert decoded.data[1].loss_fn_inputs["target_tokens"].values[:2] == [1001, 1002]
    for smaller in (
        BatchLimits(max_data=1, max_numbers=60, max_datum_tokens=10),
        BatchLimits(max_data=2, max_numbers=59, max_datum_tokens=10),
        BatchLimits(max_data=2, max_numbers=60, max_datum_tokens=9),
    ):
        with pytest.raises(PayloadTooLarge):
            decode_forward_backward_request(encoded_batch(data=2, tokens=10), smaller)


def test_client_config_tells_the_sdk_how_to_split_batches(prepared: Settings, tenant: Tenant) -> None:
    """By default the SDK's own split (1,024 data, 5 MB); tighter limits announce a tighter one,
    so a real client's requests stay within them."""
    with TestClient(create_app(prepared)) as default:
        answer = default.post("/api/v1/client/config", json={}, headers=tenant.headers("developer")).json()
    assert (answer["fwdbwd_max_chunk_len"], answer["fwdbwd_max_chunk_bytes_count"]) == (1024, 5_000_000)
    tight = prepared.model_copy(update={"tinker_max_batch_data": 16, "tinker_max_batch_numbers": 100_000})
    with TestClient(create_app(tight)) as client:
        answer = client.post("/api/v1/client/config", json={}, headers=tenant.headers("developer")).json()
    assert (answer["fwdbwd_max_chunk_len"], answer["fwdbwd_max_chunk_bytes_count"]) == (16, 400_000)
    config = tinker.types.ClientConfigResponse.model_validate(answer)  # as the SDK reads it
    assert config.fwdbwd_max_chunk_len == 16


def _new_model(client: TestClient, tenant: Tenant) -> str:
    """A training model as create_model leaves it (active) before a worker takes it."""
    headers = tenant.headers("developer")
    session_id = client.post("/api/v1/create_session", json={}, headers=headers).json()["session_id"]
    body = {"session_id": session_id, "model_seq_id": 0, "base_model": IDLE_BASE, "lora_config": {"rank": 4}}
    created = client.post("/api/v1/create_model", json=body, headers=headers)
    assert created.status_code == 200, created.text
    return str(created.json()["model_id"])


def _message(model_id: str, weights: list[float]) -> tinker_public_pb2.ForwardBackwardRequest:
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": weights},
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="importance_sampling"),
        model_id=model_id,
        seq_id=1,
    )
    return forward_backward_request_to_proto(request)


def _nan_lr(message: Any) -> None:
    message.loss_fn_config["learning_rate"] = float("nan")


def _infinite_v2(message: Any) -> None:
    message.loss_fn_config_v2["clip_high_threshold"].number = float("inf")


def _nan_weight(message: Any) -> None:
    weights = message.data[0].loss_fn_inputs["weights"]
    weights.dense = struct.pack("<3f", 1.0, float("nan"), 1.0)


def _bad_shape(message: Any) -> None:
    del message.data[0].loss_fn_inputs["weights"].shape[:]
    message.data[0].loss_fn_inputs["weights"].shape.append(5)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        (_nan_lr, "loss_fn_config"),
        (_infinite_v2, "loss_fn_config"),
        (_nan_weight, "data"),
        (_bad_shape, "loss_fn_inputs"),
    ],
    ids=["nan-lr", "infinite-v2", "nan-weight", "bad-shape"],
)
def test_numbers_out_of_range_in_a_protobuf_body_are_a_400(
    client: TestClient, tenant: Tenant, change: Callable[[Any], None], param: str
) -> None:
    model_id = _new_model(client, tenant)
    message = _message(model_id, [1.0, 1.0, 1.0])
    change(message)
    response = client.post(
        "/api/v1/forward_backward",
        content=message.SerializeToString(),
        headers={**tenant.headers("developer"), "Content-Type": "application/x-protobuf"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.text


def test_a_seq_id_past_int32_is_a_400_before_any_lookup(client: TestClient, tenant: Tenant) -> None:
    """seq_id is an int32 on the wire and in the database; a longer varint is refused by name."""
    model_id = _new_model(client, tenant)
    body = length_delimited(1, model_id.encode()) + bytes([2 << 3]) + _varint(2**40)
    response = client.post(
        "/api/v1/forward_backward",
        content=body,
        headers={**tenant.headers("developer"), "Content-Type": "application/x-protobuf"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "seq_id"


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)
