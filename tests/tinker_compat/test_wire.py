"""The protobuf forward_backward body: malformed input is a 400 naming the field, never a 500,
and numbers out of range (NaN and infinite loss settings or loss inputs, a seq_id past
int32, a shape that does not match its values) are refused."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from tinker import types
from tinker.proto import tinker_public_pb2
from tinker.proto.request_conv import forward_backward_request_to_proto

from mint.errors import InvalidRequest
from mint.schemas.tinker import decode_forward_backward_request
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
        decode_forward_backward_request(body)
    assert refused.value.param == field


def test_a_model_id_that_is_not_utf8_gets_400(client: TestClient, tenant: Tenant) -> None:
    response = client.post(
        "/api/v1/forward_backward",
        content=length_delimited(1, NOT_UTF8),
        headers={**tenant.headers("developer"), "Content-Type": "application/x-protobuf"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "model_id"


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
