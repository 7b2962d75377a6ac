"""The user commands as a person or a script runs them: `python -m mint ...` subprocesses
against the API on a real socket, connected by MINT_BASE_URL and MINT_API_KEY, with the
package's real worker and serving node doing the work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mint.sdk import Job, Mint
from tests.conftest import LiveServer, Tenant, free_port
from tests.sdk.conftest import ACK_TASKS, BASE, chat_rows, jsonl
from tests.test_dataset_formats import gsm8k_rows, parquet_of

pytestmark = [pytest.mark.integration, pytest.mark.client_surface]

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def cli(live_server: LiveServer, owner: Tenant) -> Cli:
    """Run `mint ARGS` as the owner's developer (or `key`); fail on a non-zero exit unless `code` says which."""

    def run(*args: str, key: str | None = None, stdin: str | None = None, code: int = 0, **env: str) -> Any:
        environment = {**os.environ, "MINT_BASE_URL": live_server.url, "MINT_API_KEY": key or owner.keys["developer"]}
        done = subprocess.run(
            [sys.executable, "-m", "mint", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=environment | env,
            timeout=900,  # a command that never returns fails its test instead of stalling the suite
        )
        assert done.returncode == code, f"mint {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done

    return run


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


@pytest.mark.torch
def test_upload_train_follow_and_download(cli: Cli, worker: Any, tmp_path: Path) -> None:
    data = tmp_path / "cli-train.jsonl"
    data.write_bytes(jsonl(chat_rows(8, "cli")))
    dataset = as_json(cli("datasets", "upload", str(data), "--kind", "chat", "--json"))
    assert dataset["kind"] == "chat" and dataset["row_count"] == 8 and dataset["filename"] == "cli-train.jsonl"
    assert dataset["id"] in {row["id"] for row in as_json(cli("datasets", "list", "--json"))}

    created = cli(
        "jobs", "create", "--model", BASE, "--file", dataset["id"], "--steps", "3", "--suffix", "cli-bot",
        "--seed", "3", "--learning-rate", "0.01", "--batch-size", "4", "--wait", "--json",
    )  # fmt: skip
    job = json.loads(created.stdout)
    assert job["status"] == "succeeded" and job["completed_steps"] == 3 and job["fine_tuned_model"] == "cli-bot@1"
    # The progress bar went to stderr: steps done of the total, and the latest loss.
    assert "3/3" in created.stderr and "steps" in created.stderr and "loss" in created.stderr

    listed = as_json(cli("jobs", "list", "--limit", "3", "--json"))
    assert job["id"] in {row["id"] for row in listed} and len(listed) <= 3
    assert as_json(cli("jobs", "get", job["id"], "--json"))["fine_tuned_model"] == "cli-bot@1"
    logs = cli("jobs", "logs", job["id"]).stdout
    assert "Step 3/3" in logs and logs.index("Step 1/3") < logs.index("Step 3/3")
    followed = [json.loads(line) for line in cli("jobs", "logs", job["id"], "--follow", "--json").stdout.splitlines()]
    assert [e["data"]["step"] for e in followed if e["type"] == "metrics"] == [1, 2, 3]

    adapters = as_json(cli("adapters", "list", "--json"))
    mine = next(a for a in adapters if a["name"] == "cli-bot")
    assert [v["model"] for v in mine["versions"]] == ["cli-bot@1"]
    versions = as_json(cli("adapters", "versions", "cli-bot", "--json"))
    assert versions == mine["versions"]
    assert "cli-bot@1" in cli("adapters", "versions", mine["id"], COLUMNS="200").stdout
    unknown = cli("adapters", "versions", "nobody", code=3).stderr
    assert "no adapter named 'nobody'" in unknown and "`mint adapters list`" in unknown and "/v1/" not in unknown
    out = tmp_path / "cli-bot"
    downloaded = as_json(cli("adapters", "download", "cli-bot@1", "--out", str(out), "--json"))
    assert downloaded["sha256"] == mine["versions"][0]["sha256"] and Path(downloaded["path"]) == out
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    # The downloaded folder comes back in as an adapter of its own (a worker then validates it).
    uploaded = as_json(cli("adapters", "upload", "cli-bot-copy", str(out), "--base", BASE, "--json"))
    assert uploaded["model"] == "cli-bot-copy@1" and uploaded["status"] == "validating"
    assert uploaded["sha256"] == downloaded["sha256"]  # the same files, archived the same way
    assert "not a PEFT adapter folder" in cli("adapters", "upload", "x", str(tmp_path), "--base", BASE, code=6).stderr


@pytest.mark.torch
def test_benchmark_evaluate_compare_and_mine(cli: Cli, trained: list[Job], sdk: Mint, tmp_path: Path) -> None:
    tasks = tmp_path / "ack.jsonl"
    tasks.write_bytes(jsonl(ACK_TASKS))
    benchmark = as_json(
        cli("benchmarks", "create", "ack-cli", "--file", str(tasks), "--grader", "normalized", "--json")
    )
    assert benchmark["latest_version"]["task_count"] == len(ACK_TASKS)
    builtin = as_json(cli("benchmarks", "create", "arith-cli", "--builtin", "arithmetic", "--n", "1", "--json"))
    assert builtin["latest_version"]["task_count"] == 2
    assert {"ack-cli", "arith-cli"} <= {row["name"] for row in as_json(cli("benchmarks", "list", "--json"))}
    # verl's parquet rows as they are: the file is uploaded as a prompts dataset, then read as tasks.
    verl = tmp_path / "gsm8k.parquet"
    verl.write_bytes(parquet_of(gsm8k_rows(3)))
    from_verl = as_json(cli("benchmarks", "create", "gsm8k-cli", "--file", str(verl), "--grader", "numeric", "--json"))
    assert from_verl["latest_version"]["task_count"] == 3

    base = cli("evals", "run", "--benchmark", benchmark["id"], "--model", BASE, "--max-tokens", "4", "--wait", "--json")
    before = json.loads(base.stdout)
    assert before["status"] == "succeeded" and before["metrics"]["tasks"] == len(ACK_TASKS)
    assert f"{len(ACK_TASKS)}/{len(ACK_TASKS)}" in base.stderr and "pass" in base.stderr  # the progress bar
    adapter = trained[0].fine_tuned_model or ""
    human = cli("evals", "run", "--benchmark", benchmark["id"], "--model", adapter, "--max-tokens", "4", "--wait")
    assert "succeeded" in human.stdout and adapter in human.stdout
    after = next(run for run in sdk.evals.list(benchmark_id=benchmark["id"]) if run.model == adapter)
    assert as_json(cli("evals", "get", after.id, "--json"))["status"] == "succeeded"

    listed = as_json(cli("evals", "list", "--benchmark", benchmark["id"], "--json"))
    assert {run["id"] for run in listed} == {before["id"], after.id}
    table = cli("evals", "list", "--benchmark", benchmark["id"], COLUMNS="200").stdout
    line = next(line for line in table.splitlines() if before["id"] in line)
    assert "succeeded" in line and BASE in line and f"/{len(ACK_TASKS)}" in line
    assert len(as_json(cli("evals", "list", "--limit", "1", "--json"))) == 1

    comparison = as_json(cli("evals", "compare", before["id"], after.id, "--json"))
    assert comparison["a"]["run_id"] == before["id"] and comparison["tasks"] == len(ACK_TASKS)
    table = cli("evals", "compare", before["id"], after.id).stdout
    assert "accuracy delta" in table and "fixed:" in table and "still failing:" in table

    # What the model answered, from the terminal: every task, one task, or the failures only.
    answers = as_json(cli("evals", "trajectories", before["id"], "--json"))
    assert sorted(answer["task_id"] for answer in answers) == sorted(task["id"] for task in ACK_TASKS)
    one = ACK_TASKS[1]["id"]
    assert [
        answer["task_id"] for answer in as_json(cli("evals", "trajectories", before["id"], "--task", one, "--json"))
    ] == [one]
    failed = as_json(cli("evals", "trajectories", before["id"], "--failed", "--json"))
    assert len(failed) == len(ACK_TASKS) - before["metrics"]["passed"] and not any(
        answer["passed"] for answer in failed
    )
    shown = cli("evals", "trajectories", before["id"], "--task", one, COLUMNS="200").stdout
    answered = next(answer for answer in answers if answer["task_id"] == one)
    assert f"task {one}" in shown and "user: Status check." in shown and "assistant:" in shown, shown
    assert ("passed" if answered["passed"] else "failed") in shown, shown
    assert ("graded:" in shown) == bool((answered["grade"] or {}).get("detail")), shown

    mined = as_json(cli("evals", "failures", before["id"], "--kind", "preference", "--json"))
    assert mined["kind"] == "preference" and mined["source_eval_run_id"] == before["id"]
    assert mined["failed_tasks"] == len(ACK_TASKS) - before["metrics"]["passed"]


@pytest.mark.torch
def test_deploy_promote_roll_back_and_chat(cli: Cli, trained: list[Job], node: Any, sdk: Mint) -> None:
    first, second = sorted((job.fine_tuned_model or "" for job in trained), key=lambda ref: int(ref.split("@")[1]))
    created = as_json(cli("deploy", "cli-prod", "--model", first, "--reason", "first", "--json"))
    assert created["current_revision"] == 1 and created["serving"]["routing"]["model"] == first
    promoted = as_json(cli("promote", "cli-prod", "--model", second, "--json"))
    assert promoted["current_revision"] == 2 and promoted["serving"]["routing"]["model"] == second
    rolled = as_json(cli("rollback", "cli-prod", "--json"))
    assert rolled["serving"]["routing"]["model"] == first and rolled["serving"]["action"] == "rollback"
    human = cli("rollback", "cli-prod", "--to-revision", "2", "--reason", "fixed").stdout
    assert second in human and "rollback" in human
    assert "already exists" in cli("deploy", "cli-prod", "--model", first, code=5).stderr
    assert "cli-prod" in {row["name"] for row in as_json(cli("deployments", "list", "--json"))}
    assert as_json(cli("deployments", "get", "cli-prod", "--json"))["current_revision"] == 4
    revisions = as_json(cli("deployments", "revisions", "cli-prod", "--json"))
    assert [(r["revision"], r["action"]) for r in revisions] == [
        (4, "rollback"), (3, "rollback"), (2, "promote"), (1, "create"),
    ]  # fmt: skip
    history = cli("deployments", "revisions", "cli-prod", COLUMNS="200").stdout
    assert "fixed" in history and "first" in history and second in history
    sdk.benchmarks.create("gate-cli", content=jsonl(ACK_TASKS).decode(), grader="normalized")
    gated = cli("deploy", "cli-gated", "--model", first, "--gate", '{"benchmark": "gate-cli"}', code=5)
    assert "needs an eval" in gated.stderr
    assert "--gate is not valid JSON" in cli("deploy", "cli-gated", "--model", first, "--gate", "{oops", code=6).stderr

    expected = sdk.chat.create(BASE, [{"role": "user", "content": "What is 2 + 3?"}], max_tokens=6, temperature=0)
    streamed = cli("chat", BASE, "What is 2 + 3?", "--max-tokens", "6", "--temperature", "0").stdout
    assert streamed == expected.choices[0]["message"]["content"] + "\n"

    turns = cli("chat", "cli-prod", "--max-tokens", "4", "--temperature", "0", "--json", stdin="Hello\n\nAre you up?\n")
    replies = [json.loads(line) for line in turns.stdout.splitlines()]
    assert len(replies) == 2 and all(reply["mint"]["adapter"] == second for reply in replies)
    assert replies[1]["usage"]["prompt_tokens"] > replies[0]["usage"]["prompt_tokens"]  # one conversation
    interactive = cli("chat", "cli-prod", "--max-tokens", "4", "--temperature", "0", stdin="Hello\nAre you up?\n")
    assert interactive.stdout.count("\n") >= 2


def test_exit_codes_that_scripts_can_trust(cli: Cli, owner: Tenant, tmp_path: Path) -> None:
    missing = cli("jobs", "get", "ftjob_missing", code=3)
    assert "ftjob_missing" in missing.stderr
    cli("adapters", "download", "nobody@1", "--out", str(tmp_path / "none"), code=3)
    assert not (tmp_path / "none").exists()

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl([*chat_rows(1), {"messages": [{"role": "robot", "content": "hi"}]}]))
    assert "line 2" in cli("datasets", "upload", str(bad), code=6).stderr
    assert "--method" in cli("jobs", "create", "--model", BASE, "--file", "f", "--method", "sft", code=2).stderr
    cli("evals", "compare", "eval_a", "eval_b", code=3)

    tasks = tmp_path / "t.jsonl"
    tasks.write_bytes(jsonl(ACK_TASKS))
    cli("benchmarks", "create", "viewer-bench", "--file", str(tasks), key=owner.keys["viewer"], code=4)
    cli("jobs", "list", key="tml-unknown", code=4)
    unreachable = f"http://127.0.0.1:{free_port()}"
    assert "could not reach" in cli("jobs", "list", "--base-url", unreachable, code=7).stderr

    # Priced before it starts; waited for at most --timeout (no worker runs tiny-qwen3-moe here).
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(jsonl(chat_rows(4, "timeout")))
    file_id = as_json(cli("datasets", "upload", str(rows), "--json"))["id"]
    job = ["jobs", "create", "--model", "tiny-qwen3-moe", "--file", file_id, "--steps", "2"]
    priced = as_json(cli(*job, "--estimate", "--json"))
    assert priced["object"] == "fine_tuning.job.estimate" and priced["steps"] == 2 and priced["cost_usd"] > 0
    gave_up = cli(*job, "--wait", "--timeout", "1", code=8)
    assert "did not finish within 1 s; it goes on running on the server" in gave_up.stderr, gave_up.stderr
    queued = as_json(cli("jobs", "list", "--json"))
    waited = next(entry for entry in queued if entry["training_file"] == file_id)
    assert waited["status"] == "queued"
    cli("jobs", "cancel", waited["id"])


def test_usage_is_readable_with_any_key(cli: Cli, owner: Tenant) -> None:
    summary = as_json(cli("usage", "--since", "2020-01-01", "--json", key=owner.keys["viewer"]))
    assert summary["object"] == "usage_summary" and summary["since"].startswith("2020-01-01")
    assert all(set(line) == {"kind", "base_model", "tokens", "records", "cost_usd"} for line in summary["data"])
    assert summary["total_cost_usd"] == pytest.approx(sum(line["cost_usd"] for line in summary["data"]), abs=1e-5)
    table = cli("usage", key=owner.keys["viewer"]).stdout
    assert all(header in table for header in ("kind", "base_model", "tokens", "records", "cost_usd"))


def test_models_keys_and_audit_log_of_the_organization(cli: Cli, owner: Tenant) -> None:
    from mint.cli.organization import AUDIT_COLUMNS, KEY_COLUMNS

    assert BASE in {card["id"] for card in as_json(cli("models", "list", "--json"))}
    keys = as_json(cli("keys", "list", "--json", key=owner.keys["admin"]))
    assert {"admin", "developer", "viewer"} <= {key["role"] for key in keys}
    assert all("key" not in key and key["organization_id"] == owner.organization_id for key in keys)
    table = cli("keys", "list", key=owner.keys["admin"], COLUMNS="80").stdout
    assert all(header in table for header in KEY_COLUMNS) and all(key["id"] in table for key in keys)
    audit = cli("audit", "--limit", "5", key=owner.keys["admin"], COLUMNS="80").stdout
    assert all(header in audit for header in AUDIT_COLUMNS)
    assert len(as_json(cli("audit", "--limit", "2", "--json", key=owner.keys["admin"]))) <= 2
    assert "admin" in cli("audit", key=owner.keys["viewer"], code=4).stderr


@pytest.mark.torch
def test_lists_keep_every_column_at_80_columns(cli: Cli, trained: list[Job]) -> None:
    """A pipe or a default terminal is 80 columns wide: every column of every row stays, whole
    where it is a status, a method or a step count, and no line is wider."""
    from mint.cli.adapters import LIST_COLUMNS as ADAPTER_COLUMNS
    from mint.cli.jobs import LIST_COLUMNS as JOB_COLUMNS

    jobs = cli("jobs", "list", COLUMNS="80").stdout
    assert all(len(line) <= 80 for line in jobs.splitlines()), jobs
    assert all(header in jobs for header in JOB_COLUMNS), jobs
    for job in trained:
        assert job.id in jobs and (job.fine_tuned_model or "") in jobs
    assert "succeeded" in jobs and "supervised" in jobs and "3/3" in jobs

    adapters = cli("adapters", "list", COLUMNS="80").stdout
    assert all(len(line) <= 80 for line in adapters.splitlines()), adapters
    assert all(header in adapters for header in ADAPTER_COLUMNS), adapters
    assert "sdk-bot" in adapters and "sdk-bot@2" in adapters and trained[0].model in adapters

    wide = cli("jobs", "list", COLUMNS="200").stdout  # one line per job when the terminal has room
    row = next(line for line in wide.splitlines() if trained[0].id in line)
    assert all(value in row for value in ("succeeded", "supervised", "3/3", trained[0].fine_tuned_model or ""))


@pytest.mark.torch
def test_auto_start_waits_for_the_run_and_shows_its_trials_and_decisions(cli: Cli, worker: Any) -> None:
    """`mint auto start --wait` on a built-in benchmark: one SFT trial on the tiny base, which
    cannot reach a held-out pass rate of 1, so the run stops (exit 1) naming its best version."""
    bench = as_json(cli("benchmarks", "create", "format-auto-cli", "--builtin", "format", "--n", "8", "--json"))
    done = cli(
        "auto", "start", "--benchmark", bench["id"], "--model", BASE, "--target", "1.0", "--budget-usd", "50",
        "--method", "sft", "--max-trials", "1", "--max-steps", "1", "--eval-max-tokens", "8", "--wait", "--json",
        code=1,
    )  # fmt: skip
    run = as_json(done)
    assert run["status"] == "stopped" and run["result"]["stop_reason"] == "all 1 trials allowed have run"
    assert [t["method"] for t in run["trials"]] == ["sft"] and run["best"]["model"] == run["trials"][0]["model"]
    assert "auto run" in done.stderr and "stopped" in done.stderr
    shown = cli("auto", "get", run["id"]).stdout
    assert "start trial 1: sft" in shown and "finish: stopped" in shown
    assert run["id"] in {row["id"] for row in as_json(cli("auto", "list", "--json"))}
