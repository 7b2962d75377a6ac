"""Health endpoints: liveness, readiness of each backing service and of the bases to serve, Prometheus metrics."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import signal
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from mint.api.app import create_app
from mint.config import Settings
from tests.conftest import OwnInstall, free_port, wait_for


def test_healthz(client: TestClient) -> None:
    assert client.get("/healthz").json()["status"] == "ok"


def test_readyz_checks_every_backing_service(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ok" and body["failed"] == []
    assert set(body["checks"]) == {"database", "broker", "object_store"}
    assert all(check["ok"] for check in body["checks"].values())


def test_readyz_names_the_services_that_are_down(prepared: Settings, caplog: pytest.LogCaptureFixture) -> None:
    broken = prepared.model_copy(
        update={
            "broker_url": "redis://127.0.0.1:1/0",
            "object_store_url": "s3://no-such-bucket/x",
            "s3_endpoint_url": "http://127.0.0.1:1",
        }
    )
    with TestClient(create_app(broken)) as client, caplog.at_level(logging.WARNING, "mint.services.upkeep.health"):
        response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["failed"] == ["broker", "object_store"]
    assert body["checks"]["database"]["ok"] is True
    # A public probe: a fixed reason per service, the error itself (hosts, ports) only in the log.
    assert body["checks"]["broker"]["detail"] == "broker unreachable; the API log has the error"
    assert body["checks"]["object_store"]["detail"].startswith("object store unreachable")
    assert "127.0.0.1" not in response.text and "no-such-bucket" not in response.text
    assert any("readiness check broker failed" in record.getMessage() for record in caplog.records)


@pytest.mark.torch
def test_readyz_waits_until_a_node_has_loaded_each_base_it_must_serve(own_install: OwnInstall) -> None:
    """`mint up` names the bases it starts nodes for (MINT_READY_BASES): /readyz answers 503
    naming each base until a serving node has loaded it and registered, then 200."""
    base = "tiny-glm-moe"
    settings = own_install.settings.model_copy(update={"ready_bases": f"{base}, {base}"})
    with TestClient(create_app(settings)) as client:
        loading = client.get("/readyz")
        assert loading.status_code == 503, loading.text
        body = loading.json()
        assert body["status"] == "unavailable" and body["failed"] == [] and body["loading"] == [base]
        assert body["serving"] == {
            base: {"ready": False, "live_nodes": 0, "detail": f"loading: no live serving node has loaded {base} yet"}
        }

        node = subprocess.Popen(
            [sys.executable, "-m", "mint", "serve", "--base", base, "--port", str(free_port())],
            env={**os.environ, **own_install.env},
        )
        try:

            def ready() -> dict | None:
                assert node.poll() is None, f"the serving node exited with {node.returncode}"
                response = client.get("/readyz")
                if response.status_code == 503:  # still loading: says so, and names the base
                    assert response.json()["loading"] == [base], response.text
                    return None
                assert response.status_code == 200, response.text
                return dict(response.json())

            body = wait_for(ready, "the node to load its base and /readyz to say so")
            assert body["status"] == "ok" and body["loading"] == [] and body["failed"] == []
            assert body["serving"] == {base: {"ready": True, "live_nodes": 1, "detail": ""}}
        finally:
            node.send_signal(signal.SIGTERM)
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
        # A node that stops unregisters: the base is loading again (until `mint up` restarts it).
        assert client.get("/readyz").json()["loading"] == [base]


def test_metrics_count_requests_by_route_template(client: TestClient) -> None:
    client.get("/healthz")
    client.get("/v1/api_keys/key_does_not_matter")
    text = client.get("/metrics").text
    assert 'mint_http_requests_total{method="GET",route="/healthz",status="200"}' in text
    assert 'route="/v1/api_keys/{key_id}",status="401"' in text
    assert "mint_http_request_duration_seconds_bucket" in text


def test_metric_labels_come_from_closed_sets(client: TestClient) -> None:
    """No client adds label values: unknown methods count as `other`, unknown paths as `unmatched`."""
    assert client.request("BREW", "/healthz").status_code == 405
    assert client.get("/no/such/route-7f3a").status_code == 404
    text = client.get("/metrics").text
    assert 'method="other"' in text and "BREW" not in text
    assert 'route="unmatched",status="404"' in text and "route-7f3a" not in text


def test_api_process_does_not_import_torch() -> None:
    code = "import sys, mint.api.app, mint.cli.main, mint.worker.app; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_docs_load_nothing_from_another_host(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and "SwaggerUIBundle" in page.text
    policy = page.headers["Content-Security-Policy"]
    inline = re.search(r"<script>(.*?)</script>", page.text, re.DOTALL)
    assert inline is not None
    digest = base64.b64encode(hashlib.sha256(inline.group(1).encode()).digest()).decode()
    script_src = next(part.strip() for part in policy.split(";") if part.strip().startswith("script-src"))
    assert script_src == f"script-src 'self' 'sha256-{digest}'", policy
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page.text)
    urls += re.findall(r"""url:\s*["']([^"']+)["']""", page.text)
    assert len(urls) >= 4, urls  # the script, the stylesheet, the icon, the OpenAPI document
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), f"/docs loads {url} from another host"
        assert client.get(url).status_code == 200, url
    assert "http://" not in page.text and "https://" not in page.text
    assert client.get("/docs/assets/swagger-ui.css.map").status_code == 404
    assert client.get("/redoc").status_code == 404
