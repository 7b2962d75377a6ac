"""The official `tinker` CLI, unmodified, manages Mint's checkpoints: `run list`, `checkpoint
list | info | download | publish | unpublish | set-ttl | delete`, `session export-trace`, and the
key check of `tinker auth login`.

`checkpoint download` of a training state runs the whole export path: a training client made
from the state, `save_weights_external`, signed URLs (`external_weights_urls`, served by the API
on both backends: S3 presigns only where MINT_PRESIGNED_URL_S asks it to), each file fetched with
no key, and the temporary export deleted. The files are the PEFT folder that `peft` loads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
import tinker
from safetensors.torch import load_file
from tinker import types
from tinker.cli.auth_api import AuthApiError, TinkerAuthApi

from mint.config import Settings
from mint.services.upkeep.retention import expire_tinker_checkpoints
from mint.storage.objects import object_store_for
from tests.conftest import LiveServer, Tenant, make_tenant, serving_node
from tests.tinker_compat.conftest import BASE, HANG_S, TinkerWorker, api

pytestmark = pytest.mark.torch

TINKER_CLI = str(Path(sys.executable).with_name("tinker"))


def tinker_cli(live_server: LiveServer, tenant: Tenant, *args: str) -> Any:
    """Run `tinker --format json ARGS` as a user would, against the live server; its JSON output.

    The SDK's client process is now and then killed by SIGABRT at interpreter exit, after it
    has printed its whole answer (its background threads, outside Mint); such a run is made
    once more. Every command here can be repeated (downloads pass --force)."""
    env = {**os.environ, "TINKER_BASE_URL": live_server.url, "TINKER_API_KEY": tenant.keys["developer"]}
    command = [TINKER_CLI, "--format", "json", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_S)
    if done.returncode < 0:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, f"tinker {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout) if done.stdout.strip() else None


def trained_model(service: tinker.ServiceClient, *, seed: int, text: str, steps: int) -> tinker.TrainingClient:
    """A rank-4 LoRA model of the tiny base after `steps` Adam steps on `text`."""
    training = service.create_lora_training_client(base_model=BASE, rank=4, seed=seed).result()
    ids = training.get_tokenizer().encode(text)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )
    for _ in range(steps):
        training.forward_backward([datum], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    return training


def checkpoints_of(live_server: LiveServer, tenant: Tenant, model_id: str) -> dict[str, dict[str, Any]]:
    listed = tinker_cli(live_server, tenant, "checkpoint", "list", "--run-id", model_id)
    return {item["tinker_path"]: item for item in listed["checkpoints"]}


@pytest.mark.client_surface
def test_the_tinker_cli_lists_downloads_publishes_and_expires_checkpoints(
    connect: Callable[[Tenant], tinker.ServiceClient],
    rest: Callable[[Tenant], tinker.RestClient],
    live_server: LiveServer,
    prepared: Settings,
    alice: Tenant,
    bob: Tenant,
    tinker_worker: TinkerWorker,
    tmp_path: Path,
) -> None:
    training = trained_model(connect(alice), seed=5, text="Ping 7 -> OK 7", steps=1)
    ids = training.get_tokenizer().encode("Ping 7 -> OK 7")
    state = training.save_state("trained").result().path
    sampler_path = training.save_weights_for_sampler("trained").result().path
    model_id = training.model_id

    # run list and checkpoint list
    runs = tinker_cli(live_server, alice, "run", "list")
    assert model_id in {run["training_run_id"] for run in runs["runs"]}
    listed = checkpoints_of(live_server, alice, model_id)
    assert {state, sampler_path} <= set(listed)
    assert listed[state]["checkpoint_type"] == "training" and not listed[state]["public"]

    # download: the training state exported as PEFT files, through signed URLs, then the export is gone
    tinker_cli(live_server, alice, "checkpoint", "download", state, "--output", str(tmp_path), "--force")
    folder = tmp_path / f"{model_id}_weights_trained"
    assert sorted(path.name for path in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    downloaded = load_file(folder / "adapter_model.safetensors")
    assert any(name.endswith("lora_A.weight") for name in downloaded)
    # The same weights as the sampler weights saved at the same step (an adapter version of Mint).
    version = sampler_version(live_server, alice, sampler_path)
    with api(live_server, alice) as http:
        archive = http.get(f"/v1/adapters/{version['adapter_id']}/versions/{version['version']}/download")
    assert archive.status_code == 200, archive.text
    saved = unpack_weights(archive.content, tmp_path / "saved")
    assert downloaded.keys() == saved.keys()
    for name, tensor in downloaded.items():
        assert tensor.equal(saved[name]), name
    assert not any("external_weights" in path for path in checkpoints_of(live_server, alice, model_id))

    # An export of its own, and what its signed URLs allow: the file, with no key; nothing once tampered.
    export = training.save_weights_external("mine").result().path
    assert export == f"tinker://{model_id}/external_weights/mine"
    urls = rest(alice).get_external_weights_urls(export).result()
    assert set(urls.urls) == {"adapter_config.json", "adapter_model.safetensors"}
    assert urls.expires > datetime.now(UTC) + timedelta(minutes=30)
    with httpx.Client(timeout=60) as anyone:
        assert json.loads(anyone.get(urls.urls["adapter_config.json"]).content)["r"] == 4
        assert all(url.startswith(f"{live_server.url}/api/v1/signed/") for url in urls.urls.values())
        tampered = tamper(urls.urls["adapter_model.safetensors"])
        assert tampered is not None
        refused = anyone.get(tampered)
        assert refused.status_code == 404 and "expired" in refused.json()["error"]["message"]
    with api(live_server, bob) as http:
        hidden = http.get(f"/api/v1/training_runs/{model_id}/checkpoints/external_weights/mine/external_weights_urls")
    assert hidden.status_code == 404

    # set-ttl, then remove it
    tinker_cli(live_server, alice, "checkpoint", "set-ttl", state, "--ttl", "7200")
    expires = datetime.fromisoformat(checkpoints_of(live_server, alice, model_id)[state]["expires_at"])
    assert timedelta(minutes=110) < expires - datetime.now(UTC) <= timedelta(hours=2)
    tinker_cli(live_server, alice, "checkpoint", "set-ttl", state, "--remove")
    assert checkpoints_of(live_server, alice, model_id)[state]["expires_at"] is None
    info = tinker_cli(live_server, alice, "checkpoint", "info", state)
    assert info["tinker_path"] == state and info["lora_rank"] == 4 and info["expires_at"] is None

    # publish: bob can read the sampler weights (and sample them), not change them; unpublish hides them again
    assert_bob_reads(rest, bob, sampler_path, readable=False)
    tinker_cli(live_server, alice, "checkpoint", "publish", sampler_path)
    assert checkpoints_of(live_server, alice, model_id)[sampler_path]["public"] is True
    assert_bob_reads(rest, bob, sampler_path, readable=True)
    bob_sampler = connect(bob).create_sampling_client(model_path=sampler_path).result()
    sampled = bob_sampler.sample(
        types.ModelInput.from_ints(ids[:3]), num_samples=1, sampling_params=types.SamplingParams(max_tokens=2, seed=1)
    ).result()
    assert len(sampled.sequences[0].tokens) == 2
    with api(live_server, bob) as http:
        checkpoint_id = "sampler_weights/trained"
        assert http.delete(f"/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id}").status_code == 404
        assert http.post(f"/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id}/publish").status_code == 404
        assert (
            http.put(
                f"/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id}/ttl", json={"ttl_seconds": 3600}
            ).status_code
            == 404
        )
    tinker_cli(live_server, alice, "checkpoint", "unpublish", sampler_path)
    assert checkpoints_of(live_server, alice, model_id)[sampler_path]["public"] is False
    assert_bob_reads(rest, bob, sampler_path, readable=False)
    with httpx.Client(base_url=live_server.url, headers={"X-API-Key": alice.keys["admin"]}, timeout=60) as http:
        audit = http.get("/v1/audit_log", params={"limit": 20})
    assert audit.status_code == 200, audit.text
    actions = [entry["action"] for entry in audit.json()["data"]]
    assert "tinker_checkpoint.publish" in actions and "tinker_checkpoint.unpublish" in actions

    # An export past its TTL is deleted by beat's retention pass, row and files.
    tinker_cli(live_server, alice, "checkpoint", "set-ttl", export, "--ttl", "3600")
    report = expire_tinker_checkpoints(
        prepared.database, object_store_for(prepared), now=datetime.now(UTC) + timedelta(hours=2)
    )
    assert any(key.endswith("/adapter_model.safetensors") for key in report.deleted_objects)
    assert export not in checkpoints_of(live_server, alice, model_id)
    with httpx.Client(timeout=60) as anyone:
        assert anyone.get(urls.urls["adapter_config.json"]).status_code in (403, 404)

    # delete: the training state goes; the sampler weights stay listed.
    assert tinker_cli(live_server, alice, "checkpoint", "delete", state, "--yes")["deleted_count"] == 1
    assert set(checkpoints_of(live_server, alice, model_id)) == {sampler_path}


def assert_bob_reads(rest: Callable[[Tenant], tinker.RestClient], bob: Tenant, path: str, *, readable: bool) -> None:
    if readable:
        assert rest(bob).get_weights_info_by_tinker_path(path).result().lora_rank == 4
        return
    with pytest.raises(tinker.NotFoundError):
        rest(bob).get_weights_info_by_tinker_path(path).result()


def sampler_version(live_server: LiveServer, tenant: Tenant, path: str) -> dict[str, Any]:
    """The adapter version that named sampler weights are, found by its `tinker_path`."""
    with api(live_server, tenant) as http:
        adapters = http.get("/v1/adapters", params={"limit": 100}).json()["data"]
        for adapter in adapters:
            versions = http.get(f"/v1/adapters/{adapter['id']}/versions").json()
            for version in versions:
                if (version.get("metrics") or {}).get("tinker_path") == path:
                    return {"adapter_id": adapter["id"], **version}
    raise AssertionError(f"no adapter version for {path}")


def unpack_weights(archive: bytes, folder: Path) -> dict[str, Any]:
    import io
    import tarfile

    folder.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return load_file(next(folder.rglob("adapter_model.safetensors")))


def tamper(url: str) -> str | None:
    """The URL with its signature changed, if it is one the API signed (`signature=`)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if "signature" not in query:
        return None
    query["signature"] = ["0" * 64]
    return parts._replace(query=urlencode({k: v[0] for k, v in query.items()})).geturl()


def test_tinker_auth_checks_a_key_and_revokes_only_itself(live_server: LiveServer, prepared: Settings) -> None:
    """`tinker auth login` verifies a pasted key with GET /api/v1/auth/apikey/me; `logout` revokes it."""
    tenant = make_tenant(prepared, "tinker-auth")
    auth = TinkerAuthApi(httpx.Client(timeout=60), base_url=live_server.url)
    me = auth.get_self_api_key(tenant.keys["viewer"])
    assert me.details.org_details.name == "tinker-auth" and isinstance(me.key_id, int)
    assert auth.get_self_api_key(tenant.keys["developer"]).key_id != me.key_id
    auth.delete_self_api_key(tenant.keys["viewer"])  # a viewer may give up its own key
    with pytest.raises(AuthApiError, match="HTTP 401"):
        auth.get_self_api_key(tenant.keys["viewer"])
    assert auth.get_self_api_key(tenant.keys["developer"]).name  # the other keys stay


@pytest.fixture(scope="module")
def node(prepared: Settings) -> Iterator[Any]:
    """A serving node of the tiny base: what the OpenAI routes send requests to."""
    yield from serving_node(prepared, BASE)


def test_sampler_weights_answer_on_the_openai_routes_as_the_tinker_sampler_does(
    connect: Callable[[Tenant], tinker.ServiceClient],
    live_server: LiveServer,
    alice: Tenant,
    bob: Tenant,
    tinker_worker: TinkerWorker,
    node: Any,
) -> None:
    from openai import BadRequestError, NotFoundError, OpenAI

    # Weights far enough from the base's that the adapter shows in what is sampled.
    training = trained_model(connect(alice), seed=9, text="Ping 9 -> OK 9", steps=3)
    tokenizer = training.get_tokenizer()
    path = training.save_weights_for_sampler("served").result().path
    prompt = "Ping 9 ->"
    sampler = connect(alice).create_sampling_client(model_path=path).result()
    sampled = sampler.sample(
        types.ModelInput.from_ints(tokenizer.encode(prompt)),
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=6, temperature=0.0, stop=[]),
    ).result()
    expected = tokenizer.decode(sampled.sequences[0].tokens)

    openai = OpenAI(base_url=f"{live_server.url}/v1", api_key=alice.keys["developer"], max_retries=0)
    completion = openai.completions.create(model=path, prompt=prompt, max_tokens=6, temperature=0.0)
    assert completion.model == path and completion.choices[0].text == expected
    chat = openai.chat.completions.create(
        model=path, messages=[{"role": "user", "content": "Ping?"}], max_tokens=3, temperature=0.0
    )
    assert chat.model == path and chat.usage is not None and chat.usage.completion_tokens >= 1
    # The same at the path Tinker's docs point an OpenAI client to, with the token logprobs.
    at_tinker_path = OpenAI(base_url=f"{live_server.url}/oai/api/v1", api_key=alice.keys["developer"], max_retries=0)
    again = at_tinker_path.completions.create(model=path, prompt=prompt, max_tokens=6, temperature=0.0, logprobs=2)
    assert again.choices[0].text == expected
    assert again.choices[0].logprobs is not None
    token_logprobs = again.choices[0].logprobs.token_logprobs or []
    assert token_logprobs == pytest.approx(list(sampled.sequences[0].logprobs or [])[: len(token_logprobs)], abs=1e-3)
    assert BASE in {model.id for model in at_tinker_path.models.list()}

    # Another organization reaches it once it is published, not before.
    theirs = OpenAI(base_url=f"{live_server.url}/v1", api_key=bob.keys["developer"], max_retries=0)
    with pytest.raises(NotFoundError):
        theirs.completions.create(model=path, prompt=prompt, max_tokens=6, temperature=0.0)
    tinker_cli(live_server, alice, "checkpoint", "publish", path)
    assert (
        theirs.completions.create(model=path, prompt=prompt, max_tokens=6, temperature=0.0).choices[0].text == expected
    )
    with pytest.raises(BadRequestError, match="sampler_weights"):  # a training state is not served
        openai.completions.create(model=path.replace("sampler_weights", "weights"), prompt=prompt, max_tokens=2)


def test_tinker_session_export_trace_downloads_the_sessions_requests_on_a_timeline(
    connect: Callable[[Tenant], tinker.ServiceClient],
    live_server: LiveServer,
    alice: Tenant,
    bob: Tenant,
    tinker_worker: TinkerWorker,
    tmp_path: Path,
) -> None:
    training = trained_model(connect(alice), seed=3, text="Ping 3 -> OK 3", steps=2)
    session_id = training.model_id.split(":", 1)[0]  # a model id is <session>:train:<n>
    trace_file = tmp_path / "session.pftrace"
    tinker_cli(live_server, alice, "session", "export-trace", session_id, "--output", str(trace_file))
    events = json.loads(trace_file.read_text())["traceEvents"]
    tracks = {event["args"]["name"]: event["tid"] for event in events if event["ph"] == "M"}
    mine = [event for event in events if event["ph"] == "X" and event["tid"] == tracks[f"training {training.model_id}"]]
    assert [event["name"] for event in mine] == ["create_model", *["forward_backward", "optim_step"] * 2]
    assert all(event["dur"] > 0 and event["args"]["status"] == "succeeded" for event in mine)
    assert [event["ts"] for event in mine] == sorted(event["ts"] for event in mine)
    with api(live_server, bob) as http:
        assert http.get(f"/api/v1/sessions/{session_id}/trace_export").status_code == 404
