"""The protobuf forward_backward body: malformed input is a 400 naming the field, never a 500."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from mint.errors import InvalidRequest
from mint.schemas.tinker import decode_forward_backward_request
from tests.conftest import Tenant

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
