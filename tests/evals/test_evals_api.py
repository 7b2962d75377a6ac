"""Benchmarks and eval runs over HTTP, on the session's real database, object store and broker.

Eval runs execute on a real worker process (`python -m mint worker --base tiny-glm-moe`),
which keeps the tiny base resident and consumes its training queue, exactly as in
production. Tests that play the worker themselves (a stale message, a redelivered one) call
the task's body in-process; their runs are created without a queue message, so the worker
process never sees them.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mint.config import Settings
from mint.evals.builtin import load_builtin
from mint.services import catalog
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for
from mint.storage.tables import Adapter, EvalRun
from tests.conftest import Tenant, make_tenant, poisoned, reconcile_after

pytestmark = pytest.mark.integration

BASE = "tiny-glm-moe"
IDLE_BASE = "tiny-qwen3-moe"  # no worker of this module consumes its queue
# Only to stop a hung run from hanging the suite; runs here take seconds.
HANG_S = 600.0
ANYTHING = {"type": "regex", "config": {"pattern": "(?s).*"}}


def task(task_id: str, question: str, answer: str, **extra: Any) -> dict[str, Any]:
    return {"id": task_id, "messages": [{"role": "user", "content": question}], "reference": answer, **extra}


ARITHMETIC = [task("add", "What is 2 + 3?", "5"), task("mul", "What is 6 * 7?", "42", split="hard")]


def jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def create_benchmark(client: TestClient, tenant: Tenant, **body: Any) -> Any:
    body = {"name": f"bench-{secrets.token_hex(4)}", **body}
    return client.post("/v1/benchmarks", headers=tenant.headers("developer"), json=body)


def numeric_benchmark(client: TestClient, tenant: Tenant, rows: list[dict[str, Any]] = ARITHMETIC) -> dict[str, Any]:
    response = create_benchmark(client, tenant, format="jsonl", content=jsonl(rows), grader={"type": "numeric"})
    assert response.status_code == 201, response.text
    return dict(response.json())


def stored_benchmarks(settings: Settings) -> list[str]:
    return [info.key for info in object_store_for(settings).list("benchmarks/")]


def wait_for(condition: Callable[[], Any], what: str, worker: subprocess.Popen[bytes] | None = None) -> Any:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if worker is not None and worker.poll() is not None:
            raise AssertionError(f"the worker exited with {worker.returncode} while waiting for {what}")
        time.sleep(0.2)
    raise AssertionError(f"gave up waiting for {what}")


# ---- benchmarks ------------------------------------------------------------------------------


def test_create_from_jsonl_and_yaml_and_read_back(client: TestClient, tenant: Tenant) -> None:
    created = numeric_benchmark(client, tenant)
    assert created["object"] == "benchmark" and created["description"] == ""
    version = created["latest_version"]
    assert version["version"] == 1 and version["task_count"] == 2 and version["splits"] == {"hard": 1}
    assert version["grader"] == {"type": "numeric", "config": {}} and version["locked_at"] is None

    yaml_content = "description: the same two sums\ngrader: {type: numeric}\ntasks:\n" + "".join(
        f"  - {json.dumps(row)}\n" for row in ARITHMETIC
    )
    from_yaml = create_benchmark(client, tenant, format="yaml", content=yaml_content)
    assert from_yaml.status_code == 201, from_yaml.text
    assert from_yaml.json()["description"] == "the same two sums"
    # The same tasks, written either way, are the same content.
    assert from_yaml.json()["latest_version"]["sha256"] == version["sha256"]

    viewer = tenant.headers("viewer")
    assert client.get(f"/v1/benchmarks/{created['id']}", headers=viewer).json() == created
    listed = client.get("/v1/benchmarks", headers=viewer, params={"limit": 1}).json()
    assert listed["data"][0]["id"] == from_yaml.json()["id"] and listed["has_more"]
    versions = client.get(f"/v1/benchmarks/{created['id']}/versions", headers=viewer).json()
    assert [v["version"] for v in versions["data"]] == [1]
    refused = client.post(
        "/v1/benchmarks", headers=viewer, json={"name": "nope", "format": "jsonl", "content": jsonl(ARITHMETIC)}
    )
    assert refused.status_code == 403


def test_bad_input_names_the_line_and_field_and_stores_nothing(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    before = stored_benchmarks(prepared)
    rows = [ARITHMETIC[0], task("b", "hi", "1") | {"messages": [{"role": "robot", "content": "hi"}]}]
    response = create_benchmark(
        client, tenant, name="broken", format="jsonl", content=jsonl(rows), grader={"type": "numeric"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "content"
    assert "line 2 (task 'b'): messages[0].role: must be one of system, user, assistant, tool" in error["message"]
    assert "nothing was stored" in error["message"]

    cases = [
        ({"format": "yaml", "content": "tasks:\n  - id: a\n    messages: hi\n"}, 400, "line 2 (task 'a'): messages"),
        ({"format": "jsonl", "content": jsonl([ARITHMETIC[0]]), "grader": {"type": "vibes"}}, 400, "unknown grader"),
        ({}, 400, "give the tasks"),
        ({"content": jsonl(ARITHMETIC)}, 400, "`content` needs its `format`"),
        ({"format": "jsonl"}, 400, "there is no `content`"),
        (
            {"format": "jsonl", "content": jsonl(ARITHMETIC), "grader": {"type": "numeric"}, "n": 3},
            400,
            "n applies to built-in",
        ),
        ({"builtin": "chess"}, 422, "builtin"),
        ({"format": "csv", "content": "a,b"}, 422, "format"),
    ]
    for body, status, expected in cases:
        answer = create_benchmark(client, tenant, name="broken", **body)
        assert answer.status_code == status, (body, answer.text)
        assert expected in answer.json()["error"]["message"], (body, answer.text)

    names = [b["name"] for b in client.get("/v1/benchmarks", headers=tenant.headers("viewer")).json()["data"]]
    assert "broken" not in names
    assert stored_benchmarks(prepared) == before

    taken = numeric_benchmark(client, tenant)
    again = create_benchmark(client, tenant, name=taken["name"], format="jsonl", content=jsonl(ARITHMETIC))
    assert again.status_code == 409 and "already exists" in again.json()["error"]["message"]


def test_builtin_benchmarks_import_with_their_splits(client: TestClient, tenant: Tenant) -> None:
    both = create_benchmark(client, tenant, builtin="arithmetic", n=4)
    assert both.status_code == 201, both.text
    assert both.json()["latest_version"]["splits"] == {"heldout": 4, "train": 4}
    assert both.json()["description"].startswith("Short-answer integer arithmetic")
    one = create_benchmark(client, tenant, builtin="tool_calling", split="heldout", n=3, seed=1)
    assert one.json()["latest_version"]["task_count"] == 3
    mixed = create_benchmark(
        client,
        tenant,
        builtin="format",
        split="train",
        n=2,
        format="jsonl",
        content=jsonl(ARITHMETIC),
        grader={"type": "numeric"},
    )
    assert mixed.status_code == 201 and mixed.json()["latest_version"]["splits"] == {"hard": 1, "train": 2}


def test_versions_are_immutable_once_an_eval_used_them(client: TestClient, tenant: Tenant) -> None:
    dev = tenant.headers("developer")
    benchmark = numeric_benchmark(client, tenant)
    versions = f"/v1/benchmarks/{benchmark['id']}/versions"
    same = client.post(
        versions, headers=dev, json={"format": "jsonl", "content": jsonl(ARITHMETIC), "grader": {"type": "numeric"}}
    )
    assert same.status_code == 409 and "already has exactly these tasks" in same.json()["error"]["message"]

    three = [*ARITHMETIC, task("sub", "What is 9 - 4?", "5")]
    replaced = client.post(
        versions,
        headers=dev,
        json={"format": "jsonl", "content": jsonl(three), "grader": {"type": "numeric"}, "replace_latest": True},
    )
    assert replaced.status_code == 201, replaced.text
    assert replaced.json()["version"] == 1 and replaced.json()["task_count"] == 3
    assert replaced.json()["sha256"] != benchmark["latest_version"]["sha256"]

    run = client.post("/v1/evals", headers=dev, json={"benchmark_id": benchmark["id"], "model": IDLE_BASE})
    assert run.status_code == 201, run.text
    assert run.json()["status"] == "queued" and run.json()["version"] == 1 and run.json()["config"]["task_count"] == 3
    locked = client.get(f"/v1/benchmarks/{benchmark['id']}", headers=dev).json()["latest_version"]
    assert locked["locked_at"] is not None
    # A benchmark is found by its name too, as a user types it.
    assert client.get(f"/v1/benchmarks/{benchmark['name']}", headers=dev).json()["id"] == benchmark["id"]

    refused = client.post(
        versions,
        headers=dev,
        json={"format": "jsonl", "content": jsonl(ARITHMETIC), "grader": {"type": "numeric"}, "replace_latest": True},
    )
    assert refused.status_code == 409
    assert (
        "version 1 of benchmark" in refused.json()["error"]["message"]
        and "is locked" in refused.json()["error"]["message"]
    )
    assert client.get(f"/v1/benchmarks/{benchmark['id']}", headers=dev).json()["latest_version"] == locked

    added = client.post(
        versions, headers=dev, json={"format": "jsonl", "content": jsonl(ARITHMETIC), "grader": {"type": "numeric"}}
    )
    assert added.status_code == 201 and added.json()["version"] == 2 and added.json()["locked_at"] is None
    listed = client.get(versions, headers=dev).json()["data"]
    assert [(v["version"], v["locked_at"] is not None) for v in listed] == [(2, False), (1, True)]

    bad_runs = [
        ({"version": 9}, 404, "has no version 9 (it has versions 1 to 2)"),
        ({"split": "easy"}, 400, "has no split 'easy'; its splits: hard (1 tasks)"),
        ({"model": "no-such-model"}, 404, "no base model or adapter named 'no-such-model'; list them"),
        ({"model": IDLE_BASE[:-2]}, 404, f"did you mean {IDLE_BASE!r}"),  # a mistyped base: the nearest names
        ({"benchmark_id": "bench_missing"}, 404, "No benchmark"),
        ({"benchmark_id": benchmark["name"] + "s"}, 404, f"(did you mean {benchmark['name']!r}?); create one with"),
        ({"max_tokens": 0}, 422, "max_tokens"),
    ]
    for change, status, expected in bad_runs:
        response = client.post(
            "/v1/evals", headers=dev, json={"benchmark_id": benchmark["id"], "model": IDLE_BASE, **change}
        )
        assert response.status_code == status, (change, response.text)
        assert expected in response.json()["error"]["message"], (change, response.text)
    # A refused run locks nothing: version 2 is still open.
    assert client.get(versions, headers=dev).json()["data"][0]["locked_at"] is None
    assert (
        client.post(
            "/v1/evals", headers=tenant.headers("viewer"), json={"benchmark_id": benchmark["id"], "model": IDLE_BASE}
        ).status_code
        == 403
    )


def test_cancelled_and_missing_runs_leave_the_worker_with_nothing_to_do(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    from mint.services.evals.runner import execute_eval_run

    dev = tenant.headers("developer")
    benchmark = numeric_benchmark(client, tenant)
    run = client.post("/v1/evals", headers=dev, json={"benchmark_id": benchmark["id"], "model": IDLE_BASE}).json()
    cancelled = client.post(f"/v1/evals/{run['id']}/cancel", headers=dev)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = client.post(f"/v1/evals/{run['id']}/cancel", headers=dev)
    assert again.status_code == 409 and "already cancelled" in again.json()["error"]["message"]

    def no_base(name: str) -> Any:
        raise AssertionError("a stale message must not load a model")

    assert execute_eval_run(prepared, run["id"], no_base) == "cancelled"
    assert execute_eval_run(prepared, "eval_gone", no_base) == "missing"
    assert client.get(f"/v1/evals/{run['id']}", headers=dev).json()["status"] == "cancelled"
    assert client.get(f"/v1/evals/{run['id']}/trajectories", headers=dev).json()["data"] == []


def test_a_run_out_of_attempts_fails_with_its_last_error(
    client: TestClient, tenant: Tenant, prepared: Settings
) -> None:
    """A poison run (its worker dies at every attempt) is not queued again once it has had
    `max_attempts` claims: the reconciler or the next claim fails it with its last error."""
    from mint.services.evals.runner import execute_eval_run

    dev, cap = tenant.headers("developer"), prepared.max_attempts
    benchmark = numeric_benchmark(client, tenant)
    dead, poison, redelivered, fresh = (
        client.post("/v1/evals", headers=dev, json={"benchmark_id": benchmark["id"], "model": IDLE_BASE}).json()["id"]
        for _ in range(4)
    )
    rows = poisoned(dead, poison, redelivered, cap)
    rows[fresh] = {**rows[dead], "attempts": cap - 1}  # one attempt left
    report, sent = reconcile_after(prepared, EvalRun, rows)
    sent_ids = {run_id for _task, (run_id,) in sent}
    assert {dead, poison} <= set(report.gave_up) and not {dead, poison} & sent_ids
    assert fresh in report.requeued_eval_runs and fresh in sent_ids
    views = {run_id: client.get(f"/v1/evals/{run_id}", headers=dev).json() for run_id in (dead, poison)}
    assert views[dead]["status"] == "failed" and views[dead]["error"]["message"] == (
        f"gave up after {cap} attempts: worker w-dead stopped renewing the lease (killed, out of memory, or lost)"
    )
    assert views[poison]["status"] == "failed" and views[poison]["attempts"] == 500
    assert views[poison]["error"]["message"].startswith("gave up after 500 attempts: the worker of the last attempt")
    assert client.get(f"/v1/evals/{fresh}", headers=dev).json()["attempts"] == cap - 1

    def no_base(name: str) -> Any:
        raise AssertionError("a run out of attempts must not load a model")

    # A message still in the broker for a run at the cap: the claim fails it instead.
    assert execute_eval_run(prepared, redelivered, no_base) == "failed"
    failed = client.get(f"/v1/evals/{redelivered}", headers=dev).json()
    assert failed["status"] == "failed" and failed["error"]["message"].startswith(f"gave up after {cap} attempts")


# ---- runs on the real tiny base --------------------------------------------------------------


@pytest.fixture(scope="module")
def resident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """tiny-glm-moe in this process, on one torch thread (the machine's cores are shared)."""
    import torch

    from mint.config import PROJECT_ROOT
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.session import ResidentBase

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    spec = get_base_model_spec(BASE, PROJECT_ROOT / "configs" / "models")
    yield ResidentBase(spec, Path(tmp_path_factory.mktemp("evals-api-base")))
    torch.set_num_threads(previous)


def run_in_this_process(
    settings: Settings,
    tenant: Tenant,
    benchmark_id: str,
    resident: Any,
    *,
    model: str = BASE,
    version: int | None = None,
) -> str:
    """Create an eval run of `benchmark_id` (its `version`, or newest) on `model` (BASE or an
    adapter version of it; 4 tokens, 1 step) with no queue message, run it here on `resident` as
    a worker would, and return its id once it has succeeded."""
    from mint.schemas.evals import EvalRunCreate
    from mint.services.auth import operator
    from mint.services.billing.quotas import QuotaDefaults
    from mint.services.evals import runner
    from mint.services.evals import runs as evals

    body = EvalRunCreate(benchmark_id=benchmark_id, version=version, model=model, max_tokens=4, max_steps=1)
    with session_scope(settings.database) as db:
        run_id = evals.create_eval_run(
            db,
            operator(tenant.organization_id),
            body,
            send=lambda *a, **k: None,
            quotas=QuotaDefaults.of(settings),
            store=object_store_for(settings),
        ).id
    assert runner.execute_eval_run(settings, run_id, lambda name: resident) == "succeeded"
    return run_id


def register_adapter(prepared: Settings, tenant: Tenant, resident: Any, tmp_path: Path) -> str:
    """An adapter version made by a few training steps on the tiny base, registered as `evals-adapter@1`."""
    from mint.chat.render import render_chat
    from mint.services.models import adapters
    from mint.trainer.types import AdamParams, Datum

    session = resident.create_session()
    try:
        tokens, weights = render_chat(
            resident.tokenizer, [*ARITHMETIC[0]["messages"], {"role": "assistant", "content": "5"}]
        )
        datum = Datum(model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]})
        for _ in range(3):
            session.forward_backward([datum], "cross_entropy")
            session.optim_step(AdamParams(learning_rate=5e-2))
        folder = session.save_weights_for_sampler(tmp_path / "adapter")
    finally:
        resident.close(session.session_id)
    with session_scope(prepared.database) as db:
        version = adapters.register_version(
            db,
            object_store_for(prepared),
            organization_id=tenant.organization_id,
            name="evals-adapter",
            base_model=BASE,
            archive=adapters.archive_adapter(folder),
            lora={"rank": 16, "alpha": 32},
        )
        return catalog.model_ref_of(db.get(Adapter, version.adapter_id), version)


@pytest.fixture(scope="module")
def worker_runs(
    app: Any, prepared: Settings, resident: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Three runs executed by a real worker process: the base and an adapter version on one
    benchmark version, and the base on a second version."""
    owner = make_tenant(prepared)
    adapter_ref = register_adapter(prepared, owner, resident, tmp_path_factory.mktemp("adapter"))
    process = subprocess.Popen(
        [sys.executable, "-m", "mint", "worker", "--base", BASE, "--name", f"evals-{secrets.token_hex(3)}@%h"],
        env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    )
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            dev = owner.headers("developer")
            rows = [
                task("free-1", "Say anything.", "", grader=ANYTHING),
                task("free-2", "Say something else.", "", grader=ANYTHING),
                *ARITHMETIC,
            ]
            response = create_benchmark(
                client,
                owner,
                builtin="tool_calling",
                split="heldout",
                n=2,
                format="jsonl",
                content=jsonl(rows),
                grader={"type": "numeric"},
            )
            assert response.status_code == 201, response.text
            benchmark = response.json()
            settings = {"benchmark_id": benchmark["id"], "max_tokens": 8, "max_steps": 2}
            runs = {
                "base": client.post("/v1/evals", headers=dev, json={**settings, "model": BASE}).json(),
                "adapter": client.post("/v1/evals", headers=dev, json={**settings, "model": adapter_ref}).json(),
            }
            version_2 = client.post(
                f"/v1/benchmarks/{benchmark['id']}/versions",
                headers=dev,
                json={"format": "jsonl", "content": jsonl(rows[:1]), "grader": {"type": "numeric"}},
            )
            assert version_2.status_code == 201, version_2.text
            runs["v2"] = client.post("/v1/evals", headers=dev, json={**settings, "model": BASE, "version": 2}).json()

            def finished() -> dict[str, Any] | None:
                views = {name: client.get(f"/v1/evals/{run['id']}", headers=dev).json() for name, run in runs.items()}
                done = all(view["status"] in ("succeeded", "failed", "cancelled") for view in views.values())
                return views if done else None

            views = wait_for(finished, "the eval runs to finish", process)
            yield {"owner": owner, "benchmark": benchmark, "runs": views, "adapter_ref": adapter_ref, "app": app}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_worker_runs_evals_and_records_every_trajectory(client: TestClient, worker_runs: dict[str, Any]) -> None:
    owner, runs = worker_runs["owner"], worker_runs["runs"]
    base, adapter = runs["base"], runs["adapter"]
    for run in runs.values():
        assert run["status"] == "succeeded", run
        assert run["started_at"] is not None and run["finished_at"] is not None
    metrics = base["metrics"]
    assert metrics["tasks"] == 6 and metrics["passed"] >= 2 and metrics["errors"] >= 0
    assert metrics["accuracy"] == metrics["passed"] / 6 and metrics["tasks_per_s"] > 0
    for name in ("mean_steps", "mean_tokens_in", "mean_tokens_out", "mean_latency_ms"):
        assert metrics[name] > 0, name
    assert adapter["model"] == worker_runs["adapter_ref"] and adapter["adapter_version_id"] is not None
    assert adapter["base_model"] == base["base_model"] == BASE
    assert base["adapter_version_id"] is None and base["benchmark_version_id"] == adapter["benchmark_version_id"]

    viewer = owner.headers("viewer")
    url = f"/v1/evals/{base['id']}/trajectories"
    pages, after = [], None
    while True:
        page = client.get(url, headers=viewer, params={"limit": 2, **({"after": after} if after else {})}).json()
        pages.append(page["data"])
        if not page["has_more"]:
            break
        after = page["last_id"]
    trajectories = [item for page in pages for item in page]
    assert [len(page) for page in pages] == [2, 2, 2]
    tool_ids = [t.id for t in load_builtin("tool_calling", "heldout", 2)]
    assert {t["task_id"] for t in trajectories} == {"free-1", "free-2", "add", "mul", *tool_ids}
    for trajectory in trajectories:
        assert trajectory["eval_run_id"] == base["id"] and 1 <= trajectory["steps"] <= 2
        assert trajectory["tokens_in"] > 0 and 0 < trajectory["tokens_out"] <= 8 * trajectory["steps"]
        assert trajectory["messages"][-1]["role"] in ("assistant", "tool") and trajectory["latency_ms"] > 0
    tool_trajectory = next(t for t in trajectories if t["task_id"] == tool_ids[0])
    assert tool_trajectory["messages"][0]["role"] == "system"  # the task's own messages come first

    passed = client.get(url, headers=viewer, params={"passed": "true", "limit": 100}).json()["data"]
    failed = client.get(url, headers=viewer, params={"passed": "false", "limit": 100}).json()["data"]
    assert {"free-1", "free-2"} <= {t["task_id"] for t in passed}
    assert all(t["passed"] for t in passed) and not any(t["passed"] for t in failed)
    assert len(passed) + len(failed) == 6 and len(passed) == metrics["passed"]

    listed = client.get("/v1/evals", headers=viewer, params={"benchmark_id": worker_runs["benchmark"]["id"]}).json()
    assert {run["id"] for run in listed["data"]} == {run["id"] for run in runs.values()}
    usage = client.get("/v1/usage", headers=owner.headers("admin")).json()["data"]
    assert any(line["kind"] == "sampled" and line["base_model"] == BASE and line["tokens"] > 0 for line in usage)


def test_compare_two_runs_task_by_task(client: TestClient, worker_runs: dict[str, Any], other_tenant: Tenant) -> None:
    owner, runs = worker_runs["owner"], worker_runs["runs"]
    viewer = owner.headers("viewer")
    params = {"a": runs["base"]["id"], "b": runs["adapter"]["id"], "resamples": 2000}
    response = client.get("/v1/evals/compare", headers=viewer, params=params)
    assert response.status_code == 200, response.text
    comparison = response.json()
    assert comparison["tasks"] == 6 and comparison["benchmark_version_id"] == runs["base"]["benchmark_version_id"]
    groups = [comparison[name] for name in ("fixed", "broken", "still_passing", "still_failing")]
    assert sum(len(group) for group in groups) == 6
    assert {"free-1", "free-2"} <= set(comparison["still_passing"])
    assert comparison["a"]["accuracy"] == runs["base"]["metrics"]["accuracy"]
    assert comparison["accuracy_delta"] == pytest.approx(comparison["b"]["accuracy"] - comparison["a"]["accuracy"])
    interval = comparison["interval"]
    assert interval["low"] <= comparison["accuracy_delta"] <= interval["high"] and interval["resamples"] == 2000
    assert set(comparison["efficiency_delta"]) == {"mean_steps", "mean_tokens_in", "mean_tokens_out", "mean_latency_ms"}
    itself = client.get(
        "/v1/evals/compare", headers=viewer, params={"a": runs["base"]["id"], "b": runs["base"]["id"]}
    ).json()
    assert itself["accuracy_delta"] == 0 and itself["interval"]["low"] == itself["interval"]["high"] == 0

    other_version = client.get(
        "/v1/evals/compare", headers=viewer, params={"a": runs["base"]["id"], "b": runs["v2"]["id"]}
    )
    assert other_version.status_code == 400 and other_version.json()["error"]["param"] == "b"
    message = other_version.json()["error"]["message"]
    assert "version 1" in message and "version 2" in message and "same tasks and graders" in message

    intruder = client.get("/v1/evals/compare", headers=other_tenant.headers("admin"), params=params)
    assert intruder.status_code == 404
    missing = client.get("/v1/evals/compare", headers=viewer, params={**params, "b": "eval_missing"})
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "b"


def test_from_failures_makes_datasets_of_each_kind(
    client: TestClient, worker_runs: dict[str, Any], other_tenant: Tenant
) -> None:
    owner, base = worker_runs["owner"], worker_runs["runs"]["base"]
    dev = owner.headers("developer")
    failed = 6 - base["metrics"]["passed"]
    for kind in ("chat", "preference", "prompts"):
        response = client.post("/v1/datasets/from-failures", headers=dev, json={"eval_id": base["id"], "kind": kind})
        assert response.status_code == 201, response.text
        dataset = response.json()
        assert dataset["kind"] == kind and dataset["source_eval_run_id"] == base["id"]
        assert dataset["failed_tasks"] == failed and dataset["row_count"] + len(dataset["skipped"]) == failed
        assert dataset["row_count"] >= 1
        stored = client.get(f"/v1/datasets/{dataset['id']}", headers=owner.headers("viewer")).json()
        assert stored["row_count"] == dataset["row_count"] and stored["status"] == "ready"
        content = client.get(f"/v1/datasets/{dataset['id']}/content", headers=owner.headers("viewer")).text
        rows = [json.loads(line) for line in content.splitlines()]
        if kind == "chat":  # the reference answers as targets: the numeric tasks' answers, the tool tasks' calls
            assert {"5", "42"} & {row["messages"][-1]["content"] for row in rows}
        if kind == "prompts":
            assert all("grader" in row["metadata"] for row in rows)
    again = client.post("/v1/datasets/from-failures", headers=dev, json={"eval_id": base["id"], "kind": "chat"})
    assert again.status_code == 201  # the same rows: the same dataset

    refusals = [
        (dev, {"eval_id": base["id"], "kind": "sft"}, 422),
        (owner.headers("viewer"), {"eval_id": base["id"], "kind": "chat"}, 403),
        (other_tenant.headers("admin"), {"eval_id": base["id"], "kind": "chat"}, 404),
    ]
    for headers, body, status in refusals:
        assert client.post("/v1/datasets/from-failures", headers=headers, json=body).status_code == status


def test_a_redelivered_run_skips_the_tasks_already_written(
    client: TestClient, prepared: Settings, resident: Any, worker_runs: dict[str, Any]
) -> None:
    """A worker dies after its first batch; the redelivered message finishes the run without
    running those tasks again, and a message for a finished run changes nothing."""
    from mint.schemas.evals import EvalRunCreate
    from mint.services.auth import operator
    from mint.services.billing.quotas import QuotaDefaults
    from mint.services.evals import runner
    from mint.services.evals import runs as evals
    from mint.storage.tables import Trajectory

    owner, benchmark = worker_runs["owner"], worker_runs["benchmark"]
    body = EvalRunCreate(benchmark_id=benchmark["id"], model=BASE, version=1, max_tokens=4, max_steps=1)
    with session_scope(prepared.database) as db:
        # No queue message: this process plays the worker.
        run_id = evals.create_eval_run(
            db,
            operator(owner.organization_id),
            body,
            send=lambda *a, **k: None,
            quotas=QuotaDefaults.of(prepared),
            store=object_store_for(prepared),
        ).id

    class WorkerDies(BaseException):
        """The process ends mid-run (not an error the run could record)."""

    class DyingBase:
        """The real base, but the process dies when the second batch of tasks samples (one
        sampling call per batch: its tasks' turns decode together)."""

        def __init__(self) -> None:
            self.tokenizer, self.calls = resident.tokenizer, 0

        def check_sample_request(self, request: Any) -> Any:
            return resident.check_sample_request(request)

        def sample_batch(self, *args: Any) -> Any:
            self.calls += 1
            if self.calls > 1:
                raise WorkerDies
            return resident.sample_batch(*args)

    with pytest.raises(WorkerDies):
        runner.execute_eval_run(prepared, run_id, lambda name: DyingBase(), batch_tasks=2)
    with session_scope(prepared.database) as db:
        first = {t.task_id: t.id for t in db.query(Trajectory).filter(Trajectory.eval_run_id == run_id)}
    assert len(first) == 2
    assert client.get(f"/v1/evals/{run_id}", headers=owner.headers("viewer")).json()["status"] == "running"
    # A duplicate message finds the run held by the (dead) worker and leaves it alone ...
    assert runner.execute_eval_run(prepared, run_id, lambda name: DyingBase()) == "not-claimed"
    # ... until its lease runs out: the reconciler queues it again with a new message.
    report, sent = reconcile_after(prepared, EvalRun, {}, lease_s=0, grace_s=1e9)
    assert run_id in report.requeued_eval_runs and (evals.RUN_EVAL_TASK, [run_id]) in sent

    counted: list[int] = []

    class CountingBase:
        """The real base, counting the prompts it samples."""

        tokenizer = resident.tokenizer
        check_sample_request = resident.check_sample_request

        def sample_batch(self, adapter_name: str | None, requests: list[Any]) -> Any:
            counted.extend(1 for _ in requests)
            return resident.sample_batch(adapter_name, requests)

    assert runner.execute_eval_run(prepared, run_id, lambda name: CountingBase(), batch_tasks=2) == "succeeded"
    assert len(counted) == 4  # only the four tasks not written yet
    with session_scope(prepared.database) as db:
        after = {t.task_id: t.id for t in db.query(Trajectory).filter(Trajectory.eval_run_id == run_id)}
    assert len(after) == 6 and all(after[task_id] == row_id for task_id, row_id in first.items())
    view = client.get(f"/v1/evals/{run_id}", headers=owner.headers("viewer")).json()
    assert view["status"] == "succeeded" and view["metrics"]["tasks"] == 6

    assert runner.execute_eval_run(prepared, run_id, lambda name: CountingBase()) == "succeeded"
    assert len(counted) == 4


# ---- judge graders: a model of the organization judges -----------------------------------------

RUBRIC = "Full marks if the answer is the right sum."


def judged(task_id: str, model: str | None) -> dict[str, Any]:
    config = {"rubric": RUBRIC, **({"model": model} if model is not None else {})}
    format_and_judge = {
        "type": "composite",
        "config": {
            "parts": [{"weight": 1, "grader": ANYTHING}, {"weight": 1, "grader": {"type": "judge", "config": config}}]
        },
    }
    return task(task_id, "What is 2 + 3?", "5", grader=format_and_judge)


def test_a_judge_model_must_be_a_model_of_the_organization(
    client: TestClient, prepared: Settings, tenant: Tenant, other_tenant: Tenant, resident: Any, tmp_path: Path
) -> None:
    dev = tenant.headers("developer")
    theirs = register_adapter(prepared, other_tenant, resident, tmp_path)  # another organization's adapter
    cases = [
        (
            "no-such-model",
            "the judge model 'no-such-model' (config.model of this benchmark's judge grader) cannot judge",
        ),
        (None, "a judge grader without config.model"),
        (theirs, f"the judge model {theirs!r}"),
    ]
    for model, says in cases:
        benchmark = create_benchmark(client, tenant, format="jsonl", content=jsonl([judged("j", model)])).json()
        refused = client.post("/v1/evals", headers=dev, json={"benchmark_id": benchmark["id"], "model": BASE})
        assert refused.status_code == 400, refused.text
        assert says in refused.json()["error"]["message"] and refused.json()["error"]["param"] == "benchmark_id"
    # Another organization's base name is a base of the platform, so it may judge; its runs are ours.
    benchmark = create_benchmark(client, tenant, format="jsonl", content=jsonl([judged("j", BASE)])).json()
    queued = client.post(
        "/v1/evals", headers=dev, json={"benchmark_id": benchmark["id"], "model": IDLE_BASE, "max_tokens": 2}
    )
    assert queued.status_code == 201, queued.text
    assert queued.json()["config"]["judges"] == {BASE: {"base_model": BASE, "adapter": None}}


def test_a_judge_on_the_real_base_keeps_its_prompt_and_its_unparseable_reply(
    client: TestClient, prepared: Settings, tenant: Tenant, resident: Any
) -> None:
    """The run's base judges its own answers through the worker's sampler. The untrained tiny
    base does not write a `SCORE: n` line: the trajectory keeps the prompt, the reply (the
    very text the base gives that prompt) and a verdict of None, and the judge part scores 0
    while the format part still earns its half."""
    from mint.evals.runner import GenerateRequest, SamplerGenerate
    from mint.services.evals import runner

    rows = [judged("j1", BASE), judged("j2", BASE)]
    benchmark = create_benchmark(client, tenant, format="jsonl", content=jsonl(rows)).json()
    run_id = run_in_this_process(prepared, tenant, benchmark["id"], resident)

    trajectories = client.get(f"/v1/evals/{run_id}/trajectories", headers=tenant.headers("viewer")).json()["data"]
    assert len(trajectories) == 2
    ask = SamplerGenerate(resident, max_tokens=runner.JUDGE_MAX_TOKENS, temperature=0.0)
    for trajectory in trajectories:
        assert trajectory["error"] is None and trajectory["score"] == 0.5 and not trajectory["passed"]
        format_part, judge_part = trajectory["grade"]["parts"]
        assert format_part["grade"]["passed"] and format_part["weight"] == 0.5
        verdict = judge_part["grade"]["judge"]
        assert verdict["model"] == BASE and verdict["verdict"] is None and verdict["max_score"] == 10
        assert RUBRIC in verdict["prompt"] and f"<answer>\n{trajectory['output']}\n</answer>" in verdict["prompt"]
        (again,) = ask([GenerateRequest(messages=[{"role": "user", "content": verdict["prompt"]}], seed=0)])
        assert verdict["reply"] == again.text and again.text
        assert "no 'SCORE: <n>' line" in judge_part["grade"]["detail"] and judge_part["grade"]["score"] == 0.0
