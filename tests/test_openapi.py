"""The OpenAPI document: typed models on every route, and a schemathesis run over it
that must find no 5xx (random bodies, parameters and ids, with a valid admin key, a viewer
key, and no key)."""

from __future__ import annotations

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings

from tests.conftest import Tenant, make_tenant

# Examples per operation: the admin key reaches every route's logic; without a key or with a
# viewer key most requests stop at the gate, so fewer are enough.
MAX_EXAMPLES = {"admin": 25, "viewer": 5, None: 5}


def test_every_json_route_has_typed_request_and_response_models(app: FastAPI) -> None:
    document = app.openapi()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            ok = operation["responses"].get("200") or operation["responses"].get("201")
            content = ok["content"]
            if "application/json" in content:
                assert content["application/json"]["schema"] != {}, f"{method} {path} has an untyped response"
            if "requestBody" in operation:
                body = operation["requestBody"]["content"]
                # JSON bodies, or multipart file uploads (`files.create`), each with a named schema.
                schema = (body.get("application/json") or body["multipart/form-data"])["schema"]
                assert "$ref" in schema, f"{method} {path} has an untyped body"
    errors = document["components"]["schemas"]["ErrorBody"]
    assert errors["properties"]["error"]


@pytest.fixture(scope="module")
def fuzz_tenant(prepared) -> Tenant:  # type: ignore[no-untyped-def]
    return make_tenant(prepared)


@pytest.mark.parametrize("role", ["admin", "viewer", None], ids=["admin", "viewer", "no-key"])
def test_no_server_errors_on_random_requests(app: FastAPI, fuzz_tenant: Tenant, role: str | None) -> None:
    """Every operation of the document, with bodies, parameters and ids drawn from its
    schemas: with an admin key (past authentication, into every route), a viewer key (reads
    only), and no key at all."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES[role], deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )
        def no_5xx(case) -> None:  # type: ignore[no-untyped-def]
            response = case.call(headers=fuzz_tenant.headers(role) if role else {})
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
            )

        no_5xx()
