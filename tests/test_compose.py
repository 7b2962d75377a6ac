"""docker/compose.yaml publishes the API alone: serving nodes are reachable only on the internal network.

A node's internal API samples any adapter by its hash and pins or evicts cache entries; it
requires its credential, and compose keeps it off the host too. Read from the YAML as
`docker compose` reads it (anchors and merge keys resolved)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mint.config import PROJECT_ROOT

pytestmark = pytest.mark.backend_free

COMPOSE = PROJECT_ROOT / "docker" / "compose.yaml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def serving_nodes(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run `mint serve`."""
    return {
        name: service
        for name, service in compose["services"].items()
        if list(service.get("command", []))[:2] == ["mint", "serve"]
    }


def test_no_serving_node_publishes_a_port(compose: dict[str, Any]) -> None:
    nodes = serving_nodes(compose)
    assert nodes, "the compose file runs a serving node"
    for name, service in nodes.items():
        assert "ports" not in service, f"{name} publishes its internal API on the host"
        assert service.get("expose"), f"{name} should `expose` its port to the other containers"
        assert "--host" not in service["command"], f"{name}: the bind address is MINT_SERVING_HOST"


def test_serving_nodes_are_only_on_internal_networks_that_the_api_shares(compose: dict[str, Any]) -> None:
    networks, api = compose.get("networks") or {}, compose["services"]["api"]
    for name, service in serving_nodes(compose).items():
        joined = service.get("networks")
        assert joined, f"{name} would be on the default network, which is not internal"
        for network in joined:
            assert (networks.get(network) or {}).get("internal") is True, f"{name} is on {network!r}, not internal"
            assert network in api["networks"], f"the API cannot reach {name} on {network!r}"


def test_only_the_api_is_published(compose: dict[str, Any]) -> None:
    assert {name for name, service in compose["services"].items() if "ports" in service} == {"api"}
