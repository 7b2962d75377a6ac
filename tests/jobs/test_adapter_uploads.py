"""Adapters trained outside Mint come in (`POST /v1/adapters`): one trained by plain peft on the
tiny base is checked, loaded by a real worker of its base, and then evaluated and trained on like
any version; Mint computes with it exactly what peft computes. Uploads that are not LoRA adapters
are refused at once with what is wrong; one that does not fit its base is marked invalid by the
worker, with the loader's reason."""

from __future__ import annotations

import io
import json
import struct
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
    # Its download names the base by its registry name, not the worker's folder of it.
    download = client.get(
        f"/v1/adapters/{child['id']}/versions/{child_version['version']}/download", headers=tenant.headers("viewer")
    )
    assert download.status_code == 200, download.text
    with tarfile.open(fileobj=io.BytesIO(download.content), mode="r:") as tar:
        config_file = tar.extractfile("adapter_config.json")
        assert config_file is not None
        saved_config = config_file.read().decode()
    assert json.loads(saved_config)["base_model_name_or_path"] == BASE
    assert str(prepared.models_cache_dir) not in saved_config

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

    from mint.services.models.uploads import VALIDATE_ADAPTER_TASK
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


def lora_weights() -> bytes:
    """A small safetensors file of one LoRA pair, as the API's checks want it."""
    from safetensors.torch import save

    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    return save({f"{prefix}.lora_A.weight": torch.zeros(4, 8), f"{prefix}.lora_B.weight": torch.zeros(8, 4)})


LORA_CONFIG = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}


def refusal(response: Any) -> dict[str, Any]:
    """The error of a 400 answer, in Mint's one error body."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"type", "message", "param"} and error["type"] == "invalid_request_error", error
    assert error["param"] == "files", error
    return error


def test_sparse_bombs_and_forged_sizes_in_an_uploaded_tar_are_refused_before_any_is_read(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    """A 3 KiB tar whose GNU sparse member declares 64 MiB (the review's took the API from 152 MB
    to 1.13 GB and wrote 954 MB to temporary disk): refused as a sparse file before a byte of it
    is expanded, as is its PAX form; a member that declares more than the upload limit is
    refused by its declared size."""
    import tracemalloc

    from tests import hostile_archives as hostile

    config = hostile.regular(FILES[0], json.dumps(LORA_CONFIG).encode())
    bombs = {
        "gnu": hostile.of(config, hostile.gnu_sparse(FILES[1], 64 * 1024 * 1024)),
        "pax": hostile.of(config, hostile.pax_sparse_10(FILES[1], 64 * 1024 * 1024)),
    }
    assert len(bombs["gnu"]) == 3072
    for kind, bomb in bombs.items():
        tracemalloc.start()
        try:
            response = post_adapter(client, tenant, f"bomb-{kind}", {"adapter.tar": bomb})
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        message = refusal(response)["message"]
        assert "GNU sparse file" in message and "tar -cf" in message, message
        assert peak < 8 * 1024 * 1024, f"{kind}: the request allocated {peak} bytes"

    forged = hostile.of(config, hostile.declared(FILES[1], hostile.TIB))
    message = refusal(post_adapter(client, tenant, "bomb-forged", {"adapter.tar": forged}))["message"]
    assert f"more than the {prepared.max_upload_bytes} bytes" in message, message

    for other in ("a directory", "a symbolic link"):
        member = tarfile.TarInfo(FILES[1])
        member.type, member.linkname = (
            (tarfile.DIRTYPE, "") if other == "a directory" else (tarfile.SYMTYPE, "/etc/passwd")
        )
        archive = hostile.of(config, member.tobuf(format=tarfile.GNU_FORMAT))
        message = refusal(post_adapter(client, tenant, "bomb-other", {"adapter.tar": archive}))["message"]
        assert f"'{FILES[1]}' is {other}" in message, message
    message = refusal(post_adapter(client, tenant, "bomb-other", {"adapter.tar": b"no tar" * 100}))["message"]
    assert "not a readable uncompressed tar" in message

    listed = client.get("/v1/adapters", headers=tenant.headers("viewer")).json()["data"]
    assert not [adapter["name"] for adapter in listed if adapter["name"].startswith("bomb-")]


def test_deeply_nested_json_is_a_400_not_a_500(client: TestClient, tenant: Tenant) -> None:
    """Python's JSON parser recurses once per level: 100,000 levels raised RecursionError (500)."""
    deep = b"[" * 100_000 + b"]" * 100_000
    config = json.dumps({**LORA_CONFIG, "x": "DEEP"}).encode().replace(b'"DEEP"', deep)
    message = refusal(post_adapter(client, tenant, "deep", {FILES[0]: config, FILES[1]: lora_weights()}))["message"]
    assert "adapter_config.json nests arrays or objects too deeply" in message, message

    # Deep, but within the parser's recursion: still no adapter config.
    shallow = json.dumps({**LORA_CONFIG, "x": "DEEP"}).encode().replace(b'"DEEP"', b"[" * 40 + b"]" * 40)
    message = refusal(post_adapter(client, tenant, "deep", {FILES[0]: shallow, FILES[1]: lora_weights()}))["message"]
    assert "nests arrays or objects 41 levels deep" in message, message

    header = b"[" * 100_000 + b"]" * 100_000
    weights = struct.pack("<Q", len(header)) + header
    message = refusal(
        post_adapter(client, tenant, "deep", {FILES[0]: json.dumps(LORA_CONFIG).encode(), FILES[1]: weights})
    )["message"]
    assert "adapter_model.safetensors is not a safetensors file" in message and "too deeply" in message, message


@pytest.mark.parametrize(
    ("config_text", "said"),
    [
        ('"lora_alpha": Infinity', "it holds Infinity, which is no JSON number"),
        ('"lora_alpha": -Infinity', "it holds -Infinity, which is no JSON number"),
        ('"lora_alpha": NaN', "it holds NaN, which is no JSON number"),
        ('"lora_alpha": 1e999', "lora_alpha is inf; it is a number above 0 and at most 4096"),
        ('"lora_alpha": 1e300', "lora_alpha is 1e+300; it is a number above 0 and at most 4096"),
        ('"lora_alpha": 0', "lora_alpha is 0; it is a number above 0"),
        ('"r": Infinity', "it holds Infinity"),
        ('"r": 1e999', "r is inf; the rank is a whole number from 1 to 1024"),
        ('"r": 4.5', "r is 4.5; the rank is a whole number"),
        ('"r": 4096', "r is 4096; the rank is a whole number from 1 to 1024"),
        ('"r": 1' + "0" * 5000, "an integer of 5001 digits"),
        ('"lora_dropout": 1e9', "lora_dropout is 1000000000.0; it is a fraction from 0 up to, not including, 1"),
        ('"lora_dropout": -0.5', "lora_dropout is -0.5"),
        ('"eva_config": {"tau": [0.99, 1e308]}', "eva_config.tau[1] is 1e+308; every number of an adapter config"),
        ('"loftq_config": {"loftq_iter": 99999999999}', "an integer of 11 digits"),
        ('"eva_config": {"rho": -1e400}', "eva_config.rho is -inf; every number of an adapter config is finite"),
    ],
)
def test_every_number_of_an_uploaded_config_is_bounded(
    client: TestClient, tenant: Tenant, config_text: str, said: str
) -> None:
    """`"lora_alpha": Infinity` was accepted (the version became ready, shown as `alpha: null`)."""
    key = config_text.split(":")[0].strip('"')
    fields = {name: value for name, value in LORA_CONFIG.items() if name != key}
    config = (json.dumps(fields)[:-1] + ", " + config_text + "}").encode()
    response = post_adapter(client, tenant, "unbounded", {FILES[0]: config, FILES[1]: lora_weights()})
    message = refusal(response)["message"]
    assert message.startswith("adapter_config.json") and said in message, message
    listed = client.get("/v1/adapters", headers=tenant.headers("viewer")).json()["data"]
    assert "unbounded" not in {adapter["name"] for adapter in listed}


def test_a_config_with_every_number_in_range_is_taken(client: TestClient, tenant: Tenant) -> None:
    config = {
        **LORA_CONFIG,
        "lora_alpha": 4096,
        "lora_dropout": 0.05,
        "layers_to_transform": None,
        "eva_config": {"rho": 2.0, "tau": 0.99, "label_mask_value": -100},
    }
    response = post_adapter(
        client, tenant, "in-range", {FILES[0]: json.dumps(config).encode(), FILES[1]: lora_weights()}
    )
    assert response.status_code == 201, response.text
    assert response.json()["alpha"] == 4096 and response.json()["rank"] == 4


def test_a_config_larger_than_any_peft_config_is_refused_unparsed(client: TestClient, tenant: Tenant) -> None:
    """Python holds parsed JSON in several times its bytes: a config up to the upload limit of
    `[0,0,...]` would have cost gigabytes to parse."""
    from mint.services.models.uploads import MAX_CONFIG_BYTES

    config = json.dumps({**LORA_CONFIG, "layers_to_transform": [0] * MAX_CONFIG_BYTES}).encode()
    message = refusal(post_adapter(client, tenant, "big-config", {FILES[0]: config, FILES[1]: lora_weights()}))[
        "message"
    ]
    assert f"adapter_config.json is {len(config)} bytes; a PEFT config is a few KiB" in message, message
