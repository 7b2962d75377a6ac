"""The `mint` command as an operator uses it, in real subprocesses: `admin init`, keys and
organizations, and `mint up` starting the whole platform until `/readyz` answers 200."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mint.config import Settings
from tests.conftest import free_port, wait_for

UP_WAIT_S = 180.0


def mint(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mint", *args], capture_output=True, text=True, env=env or os.environ.copy(), check=check
    )


@pytest.mark.client_surface
def test_init_prints_a_working_key_and_other_orgs_are_isolated(prepared: Settings, client) -> None:  # type: ignore[no-untyped-def]
    home = Path(prepared.home)
    first = json.loads(mint("admin", "init", "--json").stdout)
    # The session's database may already hold organizations; init then makes none.
    if first["key"] is None:
        org = json.loads(mint("admin", "orgs", "create", f"cli-{os.getpid()}", "--json").stdout)
        created = json.loads(mint("admin", "keys", "create", "--org", org["name"], "--role", "admin", "--json").stdout)
        first = {"organization_id": org["id"], "key": created["key"]}
    assert home.exists()
    key = first["key"]
    assert key.startswith("tml-")
    me = client.get("/v1/organization", headers={"Authorization": f"Bearer {key}"})
    assert me.status_code == 200 and me.json()["id"] == first["organization_id"]

    other = json.loads(mint("admin", "orgs", "create", f"other-{os.getpid()}", "--json").stdout)
    other_key = json.loads(mint("admin", "keys", "create", "--org", other["id"], "--json").stdout)
    my_key_id = client.get("/v1/api_keys", headers={"Authorization": f"Bearer {key}"}).json()["data"][-1]["id"]
    own = client.get(f"/v1/api_keys/{my_key_id}", headers={"Authorization": f"Bearer {key}"})
    foreign = client.get(f"/v1/api_keys/{my_key_id}", headers={"Authorization": f"Bearer {other_key['key']}"})
    assert own.status_code == 200 and foreign.status_code == 404

    listed = json.loads(mint("admin", "keys", "list", "--org", other["name"], "--json").stdout)
    assert [k["id"] for k in listed] == [other_key["id"]] and "key" not in listed[0]
    mint("admin", "keys", "revoke", other_key["id"], "--org", other["name"])
    assert client.get("/v1/organization", headers={"Authorization": f"Bearer {other_key['key']}"}).status_code == 401


@pytest.mark.client_surface
def test_cli_errors_exit_with_documented_codes(prepared: Settings) -> None:
    missing = mint("admin", "keys", "list", "--org", "no-such-org", check=False)
    assert missing.returncode == 3 and "No organization" in missing.stderr
    duplicate = mint("admin", "orgs", "create", "dup-org", check=False)
    again = mint("admin", "orgs", "create", "dup-org", check=False)
    assert duplicate.returncode == 0 and again.returncode == 5 and "already exists" in again.stderr


def test_models_list_names_the_registry(prepared: Settings) -> None:
    names = {row["name"] for row in json.loads(mint("admin", "models", "list", "--json").stdout)}
    assert {"smollm2-135m-instruct", "tiny-glm-moe", "tiny-qwen3-moe"} <= names


@pytest.mark.slow
@pytest.mark.client_surface
def test_up_starts_the_platform_on_embedded_defaults(tmp_path: Path) -> None:
    """`mint up` with nothing but MINT_HOME set: API, worker, beat and a serving node, ready, with a key."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINT_")}
    env |= {"MINT_HOME": str(tmp_path / "home"), "MINT_API_PORT": str(port)}
    log_path = tmp_path / "up.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mint", "up", "--serve", "tiny-glm-moe"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + UP_WAIT_S
        while "Mint is up" not in log_path.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "Mint is up" in log_path.read_text(), log_path.read_text()[-5000:]
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
        assert ready.status_code == 200 and ready.json()["failed"] == []
        key = (tmp_path / "home" / "admin.key").read_text().strip()
        assert oct((tmp_path / "home" / "admin.key").stat().st_mode & 0o777) == "0o600"
        me = httpx.get(f"http://127.0.0.1:{port}/v1/organization", headers={"Authorization": f"Bearer {key}"})
        assert me.status_code == 200 and me.json()["name"] == "default"

        def answered() -> httpx.Response | None:
            chat = {"model": "tiny-glm-moe", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
            response = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json=chat,
                timeout=60,
            )
            return response if response.status_code != 503 else None

        reply = wait_for(answered, "the serving node to answer")
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1, reply.text

        # Besides the worker of every queue, one for the system queue alone: upkeep and auto-mode
        # drivers never wait behind a training job.
        def queues() -> list[list[str]]:
            rows = json.loads(mint("admin", "workers", "list", "--json", env=env).stdout)
            return [sorted(row["queues"]) for row in rows] if len(rows) >= 2 else []

        listed = wait_for(queues, "both workers to register")
        assert ["system"] in listed and any("system" in found and len(found) > 1 for found in listed), listed
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # never leave a platform running for the tests after this one
            process.kill()
            process.wait()
            raise


@pytest.mark.client_surface
def test_models_pull_caches_a_base_as_safetensors(tmp_path: Path) -> None:
    env = {**os.environ, "MINT_HOME": str(tmp_path / "home")}
    result = mint("admin", "models", "pull", "tiny-glm-moe", env=env)
    folder = tmp_path / "home" / "models" / "tiny-glm-moe"
    assert str(folder) in result.stdout.replace("\n", "")
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    assert not list(folder.glob("*.bin")) and not list(folder.glob("*.pt"))
    unknown = mint("admin", "models", "pull", "no-such-base", env=env, check=False)
    assert unknown.returncode == 3 and "tiny-glm-moe" in unknown.stderr, unknown.stderr  # names the known bases


def test_admin_on_an_uninitialized_or_unreachable_database_says_what_to_do(tmp_path: Path) -> None:
    fresh = {k: v for k, v in os.environ.items() if not k.startswith("MINT_")} | {"MINT_HOME": str(tmp_path)}
    empty = mint("admin", "orgs", "list", env=fresh, check=False)
    assert empty.returncode == 1 and "mint admin init" in empty.stderr
    down = mint(
        "admin", "orgs", "list", env=fresh | {"MINT_DATABASE_URL": "postgresql+psycopg://u@127.0.0.1:1/x"}, check=False
    )
    assert down.returncode == 7 and "MINT_DATABASE_URL" in down.stderr


JOB_ROWS = [
    {
        "id": "ftjob_3pXabcdefghijklmnopqrs",
        "status": "validating_files",
        "model": "smollm2-135m-instruct",
        "method": "reinforcement",
        "steps": "12/300",
        "fine_tuned_model": None,
        "created_at": "2026-12-03 17:52:55",
    },
    {
        "id": "ftjob_9pXabcdefghijklmnopqrs",
        "status": "succeeded",
        "model": "tiny-glm-moe",
        "method": "supervised",
        "steps": "3/3",
        "fine_tuned_model": "support-bot@12",
        "created_at": "2026-12-03 17:52:55",
    },
]


@pytest.mark.backend_free
@pytest.mark.parametrize("width", [60, 80, 130, 200])
def test_tables_fit_the_terminal_and_keep_every_column(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Narrow, wide or in between: no line is wider than the terminal, every header and every
    id is there whole, and so are the statuses, methods and step counts."""
    from rich.console import Console

    from mint.cli import output

    screen = Console(width=width, soft_wrap=True, record=True, force_terminal=False)
    monkeypatch.setattr(output, "console", screen)
    output.emit(JOB_ROWS, list(JOB_ROWS[0]), as_json=False, title="fine-tuning jobs")
    text = screen.export_text()
    assert all(len(line) <= width for line in text.splitlines()), text
    words = set(text.split())
    assert set(JOB_ROWS[0]) <= words, text
    for row in JOB_ROWS:
        assert {row["id"], row["status"], row["method"], row["steps"]} <= words, text
    if width >= 200:  # room for one line per row
        assert any(JOB_ROWS[1]["id"] in line and "support-bot@12" in line for line in text.splitlines())


@pytest.mark.backend_free
def test_json_output_keeps_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    from mint.cli import output

    output.emit(JOB_ROWS, ["id"], as_json=True)
    assert json.loads(capsys.readouterr().out) == JOB_ROWS


@pytest.mark.backend_free
def test_money_reads_as_money_and_numbers_never_in_scientific_notation() -> None:
    from mint.cli.output import cell

    assert cell(1.2e-05, "cost_usd") == "$0.000012"
    assert cell(12.5, "estimated_usd") == "$12.50"
    assert cell(0, "allowed_usd") == "$0.00"
    assert cell(0.4, "trained_usd_per_million") == "$0.40"
    assert cell(2.0, "gpu_hour_usd") == "$2.00"
    assert cell(1.2e-05, "dev_pass_rate") == "0.000012" and cell(3.0, "loss") == "3"
    assert cell({"trained": 0.4, "gpu_hour": 2.0}, "prices") == "trained=0.4, gpu_hour=2"


@pytest.mark.backend_free
def test_ids_in_any_column_never_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    """`adapters versions` at 80 columns: the job id a version came from is copied whole."""
    from rich.console import Console

    from mint.cli import output

    screen = Console(width=80, soft_wrap=True, record=True, force_terminal=False)
    monkeypatch.setattr(output, "console", screen)
    row = {
        "version": 3,
        "status": "ready",
        "kind": "lora",
        "sha256": "3f9d1c0a2b7e4f6a8c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b",
        "training_job_id": "ftjob-0123456789abcdef0123",
        "parent_version_id": "adv-fedcba9876543210fedc",
        "created_at": "2026-12-03 17:52:55",
    }
    output.emit([row], list(row), as_json=False)
    words = screen.export_text().split()
    assert row["training_job_id"] in words and row["parent_version_id"] in words, screen.export_text()


@pytest.mark.backend_free
def test_errors_name_commands_where_the_api_names_routes() -> None:
    from mint.cli.hints import in_cli_words

    assert (
        in_cli_words("no base model or adapter named 'x'; list them at /v1/base_models and /v1/adapters")
        == "no base model or adapter named 'x'; list them at `mint models list` and `mint adapters list`"
    )
    assert in_cli_words("the gate needs an eval: run POST /v1/evals first") == (
        "the gate needs an eval: run `mint evals run` first"
    )
    assert in_cli_words("price it with `POST /v1/fine_tuning/jobs/estimate`") == (
        "price it with `mint jobs create --estimate`"
    )
    # A route no command calls stays as the API wrote it.
    assert in_cli_words("see GET /v1/adapters/{version_id}") == "see GET /v1/adapters/{version_id}"
    # Episodes, and the capture that records them: the deployment the route names goes along
    # (NAME for a placeholder), and the body that turns tokens on becomes the flags that do.
    assert in_cli_words('turn it on (PATCH /v1/deployments/deploy_x1/capture {"rate": 1, "tokens": true}) so') == (
        "turn it on (`mint deployments capture deploy_x1 --rate 1 --tokens`) so"
    )
    assert in_cli_words("lower its rate (PATCH /v1/deployments/{id}/capture)") == (
        "lower its rate (`mint deployments capture NAME`)"
    )
    assert in_cli_words("rewarding them (POST /v1/episodes/{id}/reward)?") == "rewarding them (`mint episodes reward`)?"
    assert in_cli_words("read GET /v1/episodes/{episode_id}, or list /v1/episodes") == (
        "read `mint episodes get`, or list `mint episodes list`"
    )


@pytest.mark.backend_free
def test_a_local_file_given_as_a_dataset_names_the_upload_command(tmp_path: Path) -> None:
    """`mint jobs create --file good.jsonl`: the user means that file; the CLI says how to make
    it a dataset before it connects to anything (nothing listens at the URL)."""
    (tmp_path / "good.jsonl").write_text("{}\n")
    env = {**os.environ, "MINT_API_KEY": "unused", "MINT_BASE_URL": f"http://127.0.0.1:{free_port()}"}
    refused = subprocess.run(
        [sys.executable, "-m", "mint", "jobs", "create", "--model", "smollm2-135m-instruct", "--file", "good.jsonl"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 6, refused.stderr
    assert "`mint datasets upload good.jsonl`" in refused.stderr, refused.stderr
