"""Every number that enters Mint has a range, and NaN and Infinity are refused at the edge.

Python's JSON reader, which FastAPI uses, accepts the literals `NaN`, `Infinity` and
`-Infinity`: without a check they reached a training plan or a JSON column (where
PostgreSQL answers 500). These tests send them as raw text, as a client could, and walk the
OpenAPI document so that a new field without a range fails here.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel

import mint.schemas
from mint.config import Settings
from tests.conftest import Tenant
from tests.jobs.conftest import upload

# Requests name a base no worker of this module consumes (tiny-qwen3-moe): all stop at validation.
FINE_TUNING = '{"model": "tiny-qwen3-moe", "training_file": "file_x", '

# Numbers of the OpenAPI document allowed to lack a minimum or a maximum, each with its reason.
# Empty: every integer and number of every request body and parameter has both.
UNBOUNDED_ALLOWED: dict[str, str] = {}


def _numbers(
    schema: dict[str, Any], where: str, components: dict[str, Any], seen: frozenset[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, schema) of every integer and number schema reachable from `schema`."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name not in seen:
            yield from _numbers(components[name], where, components, seen | {name})
        return
    if schema.get("type") in ("integer", "number"):
        yield where, schema
    for key in ("anyOf", "oneOf", "allOf"):
        for member in schema.get(key, []):
            yield from _numbers(member, where, components, seen)
    for name, member in schema.get("properties", {}).items():
        yield from _numbers(member, f"{where}.{name}", components, seen)
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(schema.get(key), dict):
            yield from _numbers(schema[key], where + suffix, components, seen)


def _request_schemas(document: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(operation and place, schema) of every parameter and request body of the document."""
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                yield f"{method.upper()} {path} {parameter['in']} {parameter['name']}", parameter["schema"]
            for media_type, content in operation.get("requestBody", {}).get("content", {}).items():
                yield f"{method.upper()} {path} body ({media_type})", content["schema"]


def test_every_number_of_every_request_has_a_minimum_and_a_maximum(app: FastAPI) -> None:
    document = app.openapi()
    components = document["components"]["schemas"]
    checked, unbounded = 0, []
    for place, schema in _request_schemas(document):
        for where, number in _numbers(schema, place, components, frozenset()):
            checked += 1
            low = "minimum" in number or "exclusiveMinimum" in number
            high = "maximum" in number or "exclusiveMaximum" in number
            if not (low and high) and where not in UNBOUNDED_ALLOWED:
                unbounded.append(where)
    assert checked > 50, "the walk found too few numbers: has the document's shape changed?"
    assert not unbounded, "numbers without a range (give them ge/le or gt/lt):\n" + "\n".join(unbounded)


def _referenced(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        if "$ref" in schema:
            yield schema["$ref"].rsplit("/", 1)[-1]
        for value in schema.values():
            yield from _referenced(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _referenced(value)


def test_every_request_model_refuses_nan_and_infinity(app: FastAPI) -> None:
    """Each model reachable from a request body is built on RequestModel (allow_inf_nan=False)."""
    document = app.openapi()
    components = document["components"]["schemas"]
    names: set[str] = set()
    pending = [name for _, schema in _request_schemas(document) for name in _referenced(schema)]
    while pending:
        name = pending.pop()
        if name not in names:
            names.add(name)
            pending += _referenced(components[name])
    models: dict[str, type[BaseModel]] = {}
    for module_info in pkgutil.iter_modules(mint.schemas.__path__):
        module = importlib.import_module(f"mint.schemas.{module_info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseModel):
                models[value.__name__] = value
    bodies = {name for name in names if not name.startswith("Body_")}  # FastAPI's multipart form models
    assert len(bodies) > 20
    missing = sorted(name for name in bodies if name not in models)
    assert not missing, f"request models outside mint.schemas: {missing}"
    lax = sorted(name for name in bodies if models[name].model_config.get("allow_inf_nan", True))
    assert not lax, f"request models that accept NaN/Infinity (derive them from RequestModel): {lax}"


def _post_raw(client: TestClient, tenant: Tenant, path: str, body: str) -> Any:
    """POST a body as raw text: NaN and Infinity are sent as the JSON literals Python writes."""
    headers = {**tenant.headers("developer"), "Content-Type": "application/json"}
    return client.post(path, content=body, headers=headers)


def test_n_epochs_past_the_step_cap_is_refused_naming_the_field(client: TestClient, tenant: Tenant) -> None:
    method = '{"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1e12}}}'
    response = _post_raw(client, tenant, "/v1/fine_tuning/jobs", FINE_TUNING + f'"method": {method}}}')
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "method.supervised.hyperparameters.n_epochs", error
    assert "less than or equal to 1000000" in error["message"], error


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (
            "/v1/fine_tuning/jobs",
            FINE_TUNING + '"hyperparameters": {"learning_rate_multiplier": NaN}}',
            "hyperparameters.learning_rate_multiplier",
        ),
        (
            "/v1/fine_tuning/jobs",
            FINE_TUNING + '"method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": Infinity}}}}',
            "method.dpo.hyperparameters.beta",
        ),
        (
            "/v1/fine_tuning/jobs",
            FINE_TUNING + '"learning_rate": -Infinity}',
            "learning_rate",
        ),
        (
            "/v1/chat/completions",
            '{"model": "tiny-qwen3-moe", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            "temperature",
        ),
        ("/v1/completions", '{"model": "tiny-qwen3-moe", "prompt": "hi", "top_p": Infinity}', "top_p"),
        (
            "/api/v1/optim_step",
            '{"model_id": "tks_x:train:0", "seq_id": 1, "adam_params": {"learning_rate": NaN}}',
            "adam_params.learning_rate",
        ),
        (
            "/api/v1/optim_step",
            '{"model_id": "tks_x:train:0", "seq_id": 1, "adam_params": {"learning_rate": Infinity}}',
            "adam_params.learning_rate",
        ),
        # Free-form JSON objects that are stored as they are: a gate, a grader's options.
        (
            "/v1/deployments",
            '{"name": "nan-gate", "model": "a@1", "gate": {"benchmark": "b", "min_pass_rate": NaN}}',
            "gate",
        ),
        ("/v1/evals", '{"benchmark_id": "b", "model": "m", "seed": 9223372036854775808}', "seed"),  # 2**63
        (
            "/v1/benchmarks",
            '{"name": "nan-grader", "builtin": "arithmetic", "grader": {"type": "numeric", "config": {"abs_tol": NaN}}'
            "}",
            "grader.config",
        ),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_a_422_naming_the_field(
    client: TestClient, tenant: Tenant, path: str, body: str, param: str
) -> None:
    json.loads(body)  # the body is what Python's JSON reader takes
    response = _post_raw(client, tenant, path, body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param, error


def test_a_dataset_row_holding_nan_is_refused_naming_its_line(client: TestClient, tenant: Tenant) -> None:
    good = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    content = json.dumps(good) + "\n" + json.dumps({**good, "score": float("nan")}) + "\n"
    response = client.post(
        "/v1/datasets",
        headers=tenant.headers("developer"),
        files={"file": ("rows.jsonl", content.encode(), "application/jsonl")},
    )
    assert response.status_code == 400, response.text
    assert "line 2" in response.json()["error"]["message"] and "NaN" in response.json()["error"]["message"]
    assert upload(client, tenant, [good])["row_count"] == 1


@pytest.mark.parametrize(
    "arguments",
    [
        ["jobs", "create", "--model", "m", "--file", "f", "--epochs", "1000000000000"],
        ["jobs", "create", "--model", "m", "--file", "f", "--learning-rate", "nan"],
        ["chat", "m", "hi", "--temperature", "nan"],
        ["rollback", "d", "--to-revision", "4294967296"],
        ["admin", "keys", "create", "--org", "o", "--expires-in-days", "99999999999"],
    ],
    ids=["epochs", "learning-rate", "temperature", "revision", "key-expiry"],
)
def test_cli_number_options_are_bounded_before_anything_is_sent(prepared: Settings, arguments: list[str]) -> None:
    """Typer checks the range (and `finite` refuses NaN, which click's ranges let through) before
    the command connects to anything: exit status 2 names the option. (`mint admin` first opens
    the prepared database, whose settings are in the environment.)"""
    from typer.testing import CliRunner

    from mint.cli.main import app as cli

    result = CliRunner().invoke(cli, arguments, env={"MINT_API_KEY": "unused", "MINT_BASE_URL": "http://0.0.0.0:9"})
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--" in result.output, result.output
