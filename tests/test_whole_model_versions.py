"""Whole-model versions (what a full-parameter job registers: `kind` full, a transformers
checkpoint instead of PEFT files) wherever a version is consumed: an eval run loads it on the
worker, beside the base; deployments and inference refuse it with what to do instead; the
version's view says what it is.

The versions are registered through the adapters service (full-parameter jobs make them in real
use; tests/jobs covers that path): for the eval, the checkpoint a `FullParameterTrainer` saves
after two steps on the tiny base; where the version is only named, random bytes.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mint.config import Settings
from mint.services import catalog
from mint.services.models import adapters
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for
from mint.storage.tables import Adapter
from tests.conftest import Tenant, register_versions

pytestmark = pytest.mark.integration

BASE = "tiny-glm-moe"
OTHER_BASE = "tiny-qwen3-moe"
TASKS = [
    {"id": "add", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "reference": "5"},
    {"id": "mul", "messages": [{"role": "user", "content": "What is 6 * 7?"}], "reference": "42"},
    {"id": "sub", "messages": [{"role": "user", "content": "What is 9 - 4?"}], "reference": "5"},
]


def register_whole_model(settings: Settings, tenant: Tenant, name: str, archive: bytes) -> str:
    """A `kind` full version of the tenant's `name`, as a full-parameter job registers it; its `name@N`."""
    with session_scope(settings.database) as session:
        version = adapters.register_version(
            session,
            object_store_for(settings),
            organization_id=tenant.organization_id,
            name=name,
            base_model=BASE,
            archive=archive,
            lora={},
            kind="full",
        )
        return catalog.model_ref_of(session.get(Adapter, version.adapter_id), version)


def benchmark_of(client: TestClient, tenant: Tenant, rows: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    content = "".join(json.dumps(row) + "\n" for row in rows)
    response = client.post(
        "/v1/benchmarks",
        headers=tenant.headers("developer"),
        json={"name": f"bench-{secrets.token_hex(4)}", "format": "jsonl", "content": content, **body},
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def queued_run(settings: Settings, tenant: Tenant, **body: Any) -> Any:
    """An eval run created without a queue message: no worker process runs it; a test may play the worker."""
    from mint.schemas.evals import EvalRunCreate
    from mint.services.auth import operator
    from mint.services.billing.quotas import QuotaDefaults
    from mint.services.evals import runs as evals

    with session_scope(settings.database) as session:
        run = evals.create_eval_run(
            session,
            operator(tenant.organization_id),
            EvalRunCreate.model_validate(body),
            send=lambda *a, **k: None,
            quotas=QuotaDefaults.of(settings),
            store=object_store_for(settings),
        )
        return run.id, dict(run.config)


def refusal(response: Any, ref: str, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    message = str(error["message"])
    assert message.startswith(f"{ref} is a whole model trained with training_type 'full'"), message
    assert "POST /v1/evals" in message and "/download" in message and "local_path" in message
    return message


# ---- serving, deployments and the version's view ----------------------------------------------


def test_deployments_and_inference_refuse_a_whole_model_and_say_what_to_do(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    whole = register_whole_model(prepared, tenant, "whole-line", secrets.token_bytes(128))
    (lora,) = register_versions(prepared, tenant, "lora-line", 1)
    dev = tenant.headers("developer")

    created = client.post("/v1/deployments", headers=dev, json={"name": "whole-prod", "model": whole})
    refusal(created, whole, "model")
    rules = [{"adapter": whole, "keywords": ["sum"]}]
    mixture = {"adapters": [lora, whole], "policy": {"type": "rules", "rules": rules, "default": lora}}
    mixed = client.post("/v1/deployments", headers=dev, json={"name": "mix", "mixture": mixture})
    refusal(mixed, whole, "mixture.adapters")
    deployment = client.post("/v1/deployments", headers=dev, json={"name": "lora-prod", "model": lora})
    assert deployment.status_code == 201, deployment.text
    promoted = client.post(f"/v1/deployments/{deployment.json()['id']}/promote", headers=dev, json={"model": whole})
    refusal(promoted, whole, "model")
    assert client.get("/v1/deployments/lora-prod", headers=dev).json()["current_revision"] == 1

    message = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    said = refusal(client.post("/v1/chat/completions", headers=dev, json={**message, "model": whole}), whole, "model")
    assert "GET /v1/adapters/adapter_" in said and "/versions/1/download" in said
    refusal(client.post("/v1/completions", headers=dev, json={"model": whole, "prompt": "Hi"}), whole, "model")
    # `name` alone is its newest ready version: the whole model too.
    refusal(client.post("/v1/chat/completions", headers=dev, json={**message, "model": "whole-line"}), whole, "model")
    listed = {model["id"] for model in client.get("/v1/models", headers=dev).json()["data"]}
    assert lora in listed and whole not in listed


def test_the_version_view_says_what_kind_it_is(client: TestClient, tenant: Tenant, prepared: Settings) -> None:
    archive = secrets.token_bytes(128)
    whole = register_whole_model(prepared, tenant, "viewed", archive)
    viewer = tenant.headers("viewer")
    adapter = next(a for a in client.get("/v1/adapters", headers=viewer).json()["data"] if a["name"] == "viewed")
    (version,) = client.get(f"/v1/adapters/{adapter['id']}/versions", headers=viewer).json()
    assert version["model"] == whole and version["kind"] == "full" and version["rank"] == 0 and version["alpha"] == 0
    assert client.get(f"/v1/adapters/{adapter['id']}/versions/1", headers=viewer).json()["kind"] == "full"
    download = client.get(f"/v1/adapters/{adapter['id']}/versions/1/download", headers=viewer)
    assert download.status_code == 200 and download.content == archive
    (lora,) = register_versions(prepared, tenant, "viewed-lora", 1)
    other = next(a for a in client.get("/v1/adapters", headers=viewer).json()["data"] if a["name"] == "viewed-lora")
    assert client.get(f"/v1/adapters/{other['id']}/versions/1", headers=viewer).json()["kind"] == "lora"


def test_a_whole_model_judges_only_runs_of_its_own_base(client: TestClient, tenant: Tenant, prepared: Settings) -> None:
    """A judge runs on the worker of the evaluated base: a whole model of that base may judge
    (pinned with its kind), one of another base is refused when the run is created."""
    whole = register_whole_model(prepared, tenant, "judge-line", secrets.token_bytes(128))
    rubric = {"type": "judge", "config": {"rubric": "Full marks for the right sum.", "model": whole}}
    benchmark = benchmark_of(client, tenant, [{**TASKS[0], "grader": rubric}])
    dev = tenant.headers("developer")
    body = {"benchmark_id": benchmark["id"], "max_tokens": 2}
    refused = client.post("/v1/evals", headers=dev, json={**body, "model": OTHER_BASE})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "benchmark_id"
    assert f"the judge model {whole!r} is a whole model" in refused.json()["error"]["message"]
    _, config = queued_run(prepared, tenant, benchmark_id=benchmark["id"], model=BASE, max_tokens=2)
    pinned = config["judges"][whole]
    assert pinned["base_model"] == BASE and pinned["adapter"]["kind"] == "full"


# ---- an eval run of a whole model, on the worker -----------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """The tiny base resident in this process, and a whole model trained from it: two
    full-parameter steps towards answering "5", saved as a full-parameter job saves it (one
    torch thread: the machine's cores are shared)."""
    torch = pytest.importorskip("torch")
    from mint.chat.render import render_chat
    from mint.config import PROJECT_ROOT
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.full import FullParameterTrainer
    from mint.trainer.session import ResidentBase
    from mint.trainer.types import AdamParams, Datum

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    cache = tmp_path_factory.mktemp("whole-cache")
    spec = get_base_model_spec(BASE, PROJECT_ROOT / "configs" / "models")
    base = ResidentBase(spec, cache)
    trainer = FullParameterTrainer(spec, cache)
    tokens, weights = render_chat(base.tokenizer, [*TASKS[0]["messages"], {"role": "assistant", "content": "5"}])
    datum = Datum(model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]})
    for _ in range(2):
        trainer.forward_backward([datum], "cross_entropy")
        trainer.optim_step(AdamParams(learning_rate=2e-3))
    folder = trainer.save_weights(tmp_path_factory.mktemp("whole") / "model")
    del trainer
    yield base, folder
    torch.set_num_threads(previous)


@pytest.mark.torch
def test_an_eval_of_a_whole_model_runs_it_on_the_worker(
    client: TestClient, tenant: Tenant, prepared: Settings, tiny: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every task is answered by the version's own weights, loaded beside the resident base
    (never through a serving node): the very answers the same checkpoint gives when sampled
    directly, which are not the base's."""
    from mint.evals.benchmark import parse_benchmark
    from mint.evals.runner import SamplerGenerate, run_tasks
    from mint.services.evals import runner
    from mint.storage.archives import pack_folder
    from mint.trainer.models import spec_with_weights
    from mint.trainer.session import ResidentBase

    base, folder = tiny
    whole = register_whole_model(prepared, tenant, "whole-eval", pack_folder(folder))
    benchmark = benchmark_of(client, tenant, TASKS, grader={"type": "numeric"})
    run_id, _ = queued_run(
        prepared, tenant, benchmark_id=benchmark["id"], model=whole, max_tokens=6, max_steps=1, temperature=0.0
    )

    def no_node(self: Any) -> None:
        raise AssertionError("a whole model must not be sent to a serving node")

    monkeypatch.setattr(runner._Model, "_node", no_node)
    assert runner.execute_eval_run(prepared, run_id, lambda name: base) == "succeeded"

    viewer = tenant.headers("viewer")
    run = client.get(f"/v1/evals/{run_id}", headers=viewer).json()
    assert run["model"] == whole and run["metrics"]["generator"] == "trainer-sampler"
    assert run["metrics"]["tasks"] == 3 and run["metrics"]["passed"] == 2  # it learned to say "5"
    trajectories = client.get(f"/v1/evals/{run_id}/trajectories", headers=viewer).json()["data"]
    outputs = {t["task_id"]: t["output"] for t in trajectories}
    assert all(t["error"] is None and t["tokens_out"] > 0 for t in trajectories)

    tasks = parse_benchmark("".join(json.dumps(row) + "\n" for row in TASKS), "jsonl", grader={"type": "numeric"}).tasks
    direct = ResidentBase(spec_with_weights(base.spec, folder), prepared.models_cache_dir)
    expected = run_tasks(tasks, SamplerGenerate(direct, max_tokens=6, temperature=0.0))
    assert outputs == {record.task_id: record.output for record in expected}
    from_base = run_tasks(tasks, SamplerGenerate(base, max_tokens=6, temperature=0.0))
    assert outputs != {record.task_id: record.output for record in from_base}
