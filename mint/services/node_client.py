"""Calls from the API and the CLI to serving nodes' internal routes: cache statistics, pins,
evictions and prefetch hints. Inference itself is forwarded by `mint.api.openai`."""

from __future__ import annotations

import logging
from typing import Any

import httpx
from sqlalchemy.orm import Session

from mint.errors import Conflict, InvalidRequest, MintError, NotFound, ServiceUnavailable
from mint.schemas.inference import AdapterOnNode
from mint.services.inference import plan_for
from mint.services.serving_nodes import live_nodes
from mint.storage.tables import Deployment

log = logging.getLogger(__name__)
TIMEOUT_S = 30.0
# A node's refusal keeps its meaning (and the CLI's exit code); anything else is the node failing.
ERRORS_BY_STATUS: dict[int, type[MintError]] = {400: InvalidRequest, 404: NotFound, 409: Conflict}


def call_node(url: str, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        response = httpx.request(method, f"{url}{path}", json=body, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ServiceUnavailable(f"serving node {url} did not answer: {exc}") from exc
    if response.status_code >= 400:
        try:
            message = str(response.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = response.text[:300]
        error = ERRORS_BY_STATUS.get(response.status_code, ServiceUnavailable)
        raise error(f"serving node {url}: {message}")
    return dict(response.json())


def deployment_adapters(session: Session, deployment: Deployment) -> list[AdapterOnNode]:
    """The adapter versions a deployment serves now (one, or a mixture's)."""
    plan = plan_for(session, deployment.organization_id, deployment.name)
    if plan.adapter is not None:
        return [plan.adapter]
    versions = (plan.mixture or {}).get("versions", {})
    return [AdapterOnNode.model_validate(version) for version in versions.values()]


def prefetch_on_nodes(urls: list[str], adapters: list[AdapterOnNode]) -> None:
    """Hint every node of the base to warm these adapters; a node that does not answer is skipped."""
    body = {"adapters": [adapter.model_dump() for adapter in adapters]}
    for url in urls:
        try:
            call_node(url, "POST", "/internal/v1/cache/prefetch", body)
        except ServiceUnavailable:
            log.warning("could not send a prefetch hint to %s", url, exc_info=True)


def node_urls(session: Session, base_model: str | None = None) -> list[str]:
    return [node.url for node in live_nodes(session, base_model)]
