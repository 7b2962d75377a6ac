"""Adapters trained outside Mint come in (`POST /v1/adapters`): one trained by plain peft on the
tiny base is checked, loaded by a real worker of its base, and then evaluated and trained on like
any version; Mint computes with it exactly what peft computes. Uploads that are not LoRA adapters
are refused at once with what is wrong; one that does not fit its base is marked invalid by the
worker, with the loader's reason."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from mint.config import Settings
from mint.schemas.base_models import get_base_model_spec
from mint.sdk import Mint
from tests.conftest import LiveServer, Tenant, Workers, wait_for
from tests.jobs.conftest import BASE, chat_rows, upload

pytestmark = pytest.mark.torch

FILES = ("adapter_config.json", "adapter_model.safetensors")


def peft_adapter(settings: Settings, folder: Path) -> tuple[Path, torch.Tensor, list[int]]:
    """A rank-4 LoRA on q_proj and v_proj trained by plain peft and torch (two AdamW steps), saved
    with `save_pretrained`; with the logits it gives for a sentence, and the sentence's ids."""
    from peft import LoraConfig, get_peft_model

    from mint.trainer.models import load_base_model

    torch.manual_seed(0)
    base, tokenizer = load_base_model(get_base_model_spec(BASE, settings.model_configs_dir), settings.models_cache_dir)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    ids = tokenizer.encode("Ping 5 -> OK 5")
    batch = torch.tensor([ids])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    with torch.no_grad():
        logits = model(input_ids=batch).logits[0]
    return folder, logits, ids


def post_adapter(client: TestClient, tenant: Tenant, name: str, files: dict[str, bytes]) -> Any:
    return client.post(
        "/v1/adapters",
        headers=tenant.headers("developer"),
        data={"name": name, "base_model": BASE},
        files=[("files", (file_name, data, "application/octet-stream")) for file_name, data in files.items()],
    )


def settled(client: TestClient, tenant: Tenant, version: dict[str, Any]) -> dict[str, Any]:
    url = f"/v1/adapters/{version['adapter_id']}/versions/{version['version']}"

    def done() -> dict[str, Any] | None:
        seen = client.get(url, headers=tenant.headers("viewer")).json()
        return seen if seen["status"] != "validating" else None

    return wait_for(done, f"the worker to validate {version['model']}")


def test_an_adapter_trained_by_peft_outside_mint_is_validated_evaluated_and_trained_on(
    client: TestClient, live_server: LiveServer, tenant: Tenant, workers: Workers, prepared: Settings, tmp_path: Path
) -> None:
    folder, peft_logits, ids = peft_adapter(prepared, tmp_path / "peft")
    assert (folder / "README.md").exists()  # save_pretrained writes one; the upload is the two PEFT files
    files = {name: (folder / name).read_bytes() for name in FILES}

    # Refused at once, with what is wrong, storing nothing:
    config = json.loads(files["adapter_config.json"])
    refusals = {
        "dora": {**files, "adapter_config.json": json.dumps({**config, "use_dora": True}).encode()},
        "one file": {"adapter_model.safetensors": files["adapter_model.safetensors"]},
        "not safetensors": {**files, "adapter_model.safetensors": b"not a safetensors file"},
    }
    for case, bad in refusals.items():
        refused = post_adapter(client, tenant, "peft-bad", bad)
        assert refused.status_code == 400, (case, refused.text)
    assert "use_dora" in post_adapter(client, tenant, "peft-bad", refusals["dora"]).json()["error"]["message"]
    listed = client.get("/v1/adapters", headers=tenant.headers("viewer")).json()["data"]
    assert "peft-bad" not in {adapter["name"] for adapter in listed}

    # Accepted: as two files, and (as a tar of the folder) a rank the weights do not have.
    accepted = post_adapter(client, tenant, "peft-outside", files)
    assert accepted.status_code == 201, accepted.text
    version = accepted.json()
    assert version["status"] == "validating" and version["model"] == "peft-outside@1" and version["rank"] == 4
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in {**files, "adapter_config.json": json.dumps({**config, "r": 8}).encode()}.items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    misfit = post_adapter(client, tenant, "peft-misfit", {"adapter.tar": archive.getvalue()})
    assert misfit.status_code == 201, misfit.text

    # The SDK uploads the folder save_pretrained wrote (as a tar of its two PEFT files).
    with Mint(base_url=live_server.url, api_key=tenant.keys["developer"]) as sdk:
        uploaded = sdk.adapters.upload("peft-sdk", BASE, folder)
    assert uploaded.status == "validating" and uploaded.model == "peft-sdk@1"

    workers.start("uploads")
    ready = settled(client, tenant, version)
    assert ready["status"] == "ready" and ready["error"] is None, ready
    assert settled(client, tenant, uploaded.model_dump())["status"] == "ready"
    invalid = settled(client, tenant, misfit.json())
    assert invalid["status"] == "invalid" and "does not fit base" in invalid["error"], invalid

    # Evaluated like any version ...
    benchmark = client.post(
        "/v1/benchmarks", headers=tenant.headers("developer"), json={"name": "uploads", "builtin": "arithmetic", "n": 2}
    ).json()
    run = client.post(
        "/v1/evals",
        headers=tenant.headers("developer"),
        json={"benchmark_id": benchmark["id"], "model": "peft-outside@1", "max_tokens": 4, "max_steps": 1},
    ).json()

    def run_done() -> dict[str, Any] | None:
        seen = client.get(f"/v1/evals/{run['id']}", headers=tenant.headers("viewer")).json()
        return seen if seen["status"] in ("succeeded", "failed") else None

    assert wait_for(run_done, "the eval run")["status"] == "succeeded"
    # ... and trained on: a warm start from it records it as its parent.
    chat = upload(client, tenant, chat_rows())
    body = {"model": BASE, "training_file": chat["id"], "suffix": "peft-continued", "steps": 1}
    job = client.post(
        "/v1/fine_tuning/jobs", headers=tenant.headers("developer"), json={**body, "from_adapter": "peft-outside@1"}
    ).json()

    def job_done() -> dict[str, Any] | None:
        seen = client.get(f"/v1/fine_tuning/jobs/{job['id']}", headers=tenant.headers("viewer")).json()
        return seen if seen["status"] in ("succeeded", "failed", "cancelled") else None

    assert wait_for(job_done, "the warm-started job")["status"] == "succeeded"
    continued = client.get("/v1/adapters", headers=tenant.headers("viewer")).json()["data"]
    child = next(adapter for adapter in continued if adapter["name"] == "peft-continued")
    child_version = client.get(f"/v1/adapters/{child['id']}/versions", headers=tenant.headers("viewer")).json()[0]
    assert child_version["parent_version_id"] == version["id"]

    # Mint computes with the adapter exactly what peft computes.
    from mint.trainer.session import ResidentBase

    resident = ResidentBase(get_base_model_spec(BASE, prepared.model_configs_dir), prepared.models_cache_dir)
    session = resident.create_session_from_adapter(folder)
    with torch.no_grad(), resident._use(session.session_id) as model:
        mint_logits = model(input_ids=torch.tensor([ids])).logits[0]
    assert torch.allclose(mint_logits, peft_logits, atol=1e-5, rtol=0)


def test_an_upload_whose_validation_message_was_lost_is_sent_again(
    client: TestClient, tenant: Tenant, prepared: Settings, tmp_path: Path
) -> None:
    """On a base whose queue no worker of the suite consumes, the upload stays `validating`; once
    it is older than the grace period and its message is not in the queue, the reconciler sends
    the validation again."""
    from datetime import timedelta

    from safetensors.torch import save_file

    from mint.services.adapter_uploads import VALIDATE_ADAPTER_TASK
    from mint.storage.tables import AdapterVersion, utcnow
    from tests.conftest import reconcile_after

    weights = tmp_path / "adapter_model.safetensors"
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file({f"{prefix}.lora_A.weight": torch.zeros(4, 8), f"{prefix}.lora_B.weight": torch.zeros(8, 4)}, weights)
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}
    response = client.post(
        "/v1/adapters",
        headers=tenant.headers("developer"),
        data={"name": "lost-validation", "base_model": "tiny-qwen3-moe"},
        files=[
            ("files", ("adapter_config.json", json.dumps(config).encode(), "application/json")),
            ("files", ("adapter_model.safetensors", weights.read_bytes(), "application/octet-stream")),
        ],
    )
    assert response.status_code == 201, response.text
    version_id = response.json()["id"]
    report, sent = reconcile_after(prepared, AdapterVersion, {})
    assert version_id not in report.resent_adapter_validations  # within the grace period
    report, sent = reconcile_after(
        prepared, AdapterVersion, {version_id: {"created_at": utcnow() - timedelta(hours=1)}}
    )
    assert version_id in report.resent_adapter_validations
    assert (VALIDATE_ADAPTER_TASK, [version_id]) in sent
