"""Expert review over HTTP: a queue built from a real run's failures on which a judge grader
disagrees with the format grader, two reviewers (two API keys, one a viewer's) judging the same
items, agreement figures checked by hand, a run read with expert verdicts, and the corrections
mined into a dataset and a benchmark version that name their reviewer.

The run is real: tiny-glm-moe answers six tasks in this process (`run_in_this_process`) and
also judges four of them; the untrained base never writes a `SCORE:` line, so its judge part
fails with no verdict (the judge's low confidence) while the format part passes.

The verdicts are chosen so that every figure can be checked on paper (`A` the developer's key,
`B` the viewer's; P pass, F fail):

    item   j1  j2  j3  j4
    A      P   P   F   F
    B      P   F   F   F
    expert P   -   F   F      (j2: split evenly, not settled)

Reviewers, Krippendorff's alpha (nominal): 8 values, 3 P and 5 F; one disagreeing unit gives
D_o = 2/8, D_e = 2*3*5/(8*7) = 30/56, alpha = 1 - D_o/D_e = 1 - 14/30 = 8/15. Graders against
the three settled verdicts (P, F, F): the judge fails all three, agreeing on 2 of 3 with
alpha 0 (no better than chance); the format grader passes all three, agreeing on 1 of 3 with
alpha 1 - (4/6)/(16/30) = -1/4.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mint.config import Settings
from mint.sdk import BadRequestError, Mint
from mint.services import benchmarks
from mint.storage.db import session_scope
from mint.storage.objects import object_store_for
from mint.storage.tables import AuditLog, BenchmarkVersion
from tests.conftest import LiveServer, Tenant, record_capture
from tests.evals.test_evals_api import (  # noqa: F401 - resident is a fixture
    ANYTHING,
    BASE,
    create_benchmark,
    jsonl,
    register_adapter,
    resident,
    run_in_this_process,
    task,
)
from tests.test_cli import mint

pytestmark = pytest.mark.integration

RUBRIC = "- The answer is the right sum.\n- It is brief."


def judged(task_id: str) -> dict[str, Any]:
    judge = {"type": "judge", "config": {"rubric": RUBRIC, "model": BASE}}
    grader = {
        "type": "composite",
        "config": {"parts": [{"weight": 1, "grader": ANYTHING}, {"weight": 1, "grader": judge}]},
    }
    return task(task_id, "What is 2 + 3?", "5", grader=grader)


@pytest.fixture(scope="module")
def reviewed(prepared: Settings, app: Any, resident: Any) -> dict[str, Any]:  # noqa: F811 - the fixture
    """A tenant, its benchmark and one run of it: p1 and p2 pass, j1..j4 fail on the judge."""
    return _judged_run(prepared, app, resident)


def _judged_run(prepared: Settings, app: Any, resident: Any) -> dict[str, Any]:  # noqa: F811 - the fixture
    from tests.conftest import make_tenant

    owner = make_tenant(prepared)
    rows = [task("p1", "Say hi.", "hi", grader=ANYTHING), task("p2", "Say ho.", "ho", grader=ANYTHING)]
    rows += [judged(f"j{n}") for n in range(1, 5)]
    with TestClient(app) as client:
        benchmark = create_benchmark(client, owner, format="jsonl", content=jsonl(rows)).json()
    run_id = run_in_this_process(prepared, owner, benchmark["id"], resident)
    return {"tenant": owner, "benchmark": benchmark, "run_id": run_id}


def _review(client: TestClient, owner: Tenant, role: str, item: dict[str, Any], **body: Any) -> Any:
    return client.post(f"/v1/reviews/items/{item['id']}/reviews", headers=owner.headers(role), json=body)


def test_a_review_round_from_failures_to_agreement_and_data(
    client: TestClient, prepared: Settings, reviewed: dict[str, Any]
) -> None:
    owner, run_id = reviewed["tenant"], reviewed["run_id"]
    dev, viewer = owner.headers("developer"), owner.headers("viewer")
    filters = {"failed": True, "disagree_graders": ["regex", "judge"], "judge_margin": 0.1}
    body = {"name": "sums round 1", "eval_id": run_id, "filters": filters, "reviews_per_item": 2}
    assert client.post("/v1/reviews/queues", headers=viewer, json=body).status_code == 403
    created = client.post("/v1/reviews/queues", headers=dev, json=body)
    assert created.status_code == 201, created.text
    queue = created.json()
    assert queue["item_count"] == 4 and queue["benchmark_version_id"] == reviewed["benchmark"]["latest_version"]["id"]
    assert queue["progress"] == {"items": 4, "reviewed": 0, "done": 0, "reviews": 0, "mine": 0, "todo": 4}

    items = client.get(f"/v1/reviews/queues/{queue['id']}/items", headers=viewer, params={"limit": 3}).json()
    rest = client.get(
        f"/v1/reviews/queues/{queue['id']}/items", headers=viewer, params={"after": items["last_id"]}
    ).json()
    assert items["has_more"] and not rest["has_more"]
    by_task = {item["task_id"]: item for item in items["data"] + rest["data"]}
    assert sorted(by_task) == ["j1", "j2", "j3", "j4"]
    j1 = by_task["j1"]
    snapshot = j1["snapshot"]
    # What a reviewer reads: the whole conversation, the reference, the grade with the judge's reply, the rubric.
    assert snapshot["messages"][0] == {"role": "user", "content": "What is 2 + 3?"} and snapshot["prompt_length"] == 1
    assert snapshot["messages"][1]["role"] == "assistant" and snapshot["reference"] == "5"
    assert snapshot["grade"]["parts"][1]["grade"]["judge"]["verdict"] is None
    assert [view["name"] for view in snapshot["graders"]] == ["overall", "0:regex", "1:judge"]
    assert snapshot["rubric"] == ["The answer is the right sum.", "It is brief."]
    assert j1["reasons"] == ["failed", "0:regex passed, 1:judge did not", "judge 1:judge gave no verdict"]

    a = {"j1": True, "j2": True, "j3": False, "j4": False}
    b = {"j1": True, "j2": False, "j3": False, "j4": False}
    fix = {"from_message": 1, "messages": [{"role": "assistant", "content": "5"}]}
    for task_id, passed in a.items():
        extra: dict[str, Any] = {"correction": fix} if task_id == "j3" else {}
        if task_id == "j1":
            extra["rubric"] = {"The answer is the right sum.": {"passed": True}, "It is brief.": {"score": 0.5}}
        response = _review(client, owner, "developer", by_task[task_id], passed=passed, **extra)
        assert response.status_code == 201, response.text
    for task_id, passed in b.items():
        extra = {"correction": fix, "comment": "first try"} if task_id == "j4" else {}
        assert _review(client, owner, "viewer", by_task[task_id], passed=passed, **extra).status_code == 201
    # The viewer sends j4 again: its review is replaced, one per reviewer per item, the first kept in the audit log.
    again = _review(client, owner, "viewer", by_task["j4"], passed=False, correction=fix, comment="the sum is 5")
    assert again.status_code == 201 and again.json()["comment"] == "the sum is 5"
    reviews = client.get(f"/v1/reviews/items/{by_task['j4']['id']}", headers=viewer).json()["reviews"]
    assert sorted(review["reviewer"] for review in reviews) == sorted(
        f"key:{owner.key_ids[role]}" for role in ("developer", "viewer")
    )
    with session_scope(prepared.database) as session:
        replaced = session.query(AuditLog).filter_by(action="review.replaced", resource_id=again.json()["id"]).one()
        assert replaced.data["was"]["comment"] == "first try"

    # Refusals name the field.
    bad_rubric = _review(client, owner, "developer", j1, passed=True, rubric={"Is polite.": {"passed": True}})
    assert bad_rubric.status_code == 400 and bad_rubric.json()["error"]["param"] == "rubric"
    bad_turn = _review(client, owner, "developer", j1, passed=False, correction={**fix, "from_message": 0})
    assert bad_turn.status_code == 400 and bad_turn.json()["error"]["param"] == "correction.from_message"
    assert _review(client, owner, "developer", j1).status_code == 422  # no verdict

    progress = client.get(f"/v1/reviews/queues/{queue['id']}", headers=dev).json()["progress"]
    assert progress == {"items": 4, "reviewed": 4, "done": 4, "reviews": 8, "mine": 4, "todo": 0}

    report = client.get(f"/v1/reviews/queues/{queue['id']}/agreement", headers=viewer).json()
    assert report["items"] == 4 and report["reviews"] == 8 and report["settled"] == 3
    assert report["reviewers"]["items"] == 4 and report["reviewers"]["percent_agreement"] == pytest.approx(3 / 4)
    assert report["reviewers"]["alpha"] == pytest.approx(8 / 15)
    (pair,) = report["pairs"]
    assert pair["items"] == 4 and pair["alpha"] == pytest.approx(8 / 15)
    graders = {grader["grader"]: grader for grader in report["graders"]}
    assert graders["1:judge"]["model"] == BASE and graders["1:judge"]["items"] == 3
    assert graders["1:judge"]["percent_agreement"] == pytest.approx(2 / 3) and graders["1:judge"]["alpha"] == 0.0
    assert graders["0:regex"]["percent_agreement"] == pytest.approx(1 / 3)
    assert graders["0:regex"]["alpha"] == pytest.approx(-0.25)
    assert all(grader["flagged"] for grader in graders.values()) and report["flagged_judges"] == [BASE]
    lenient = client.get(f"/v1/reviews/queues/{queue['id']}/agreement", headers=viewer, params={"threshold": 0})
    assert lenient.json()["flagged_judges"] == []
    version = reviewed["benchmark"]["latest_version"]
    per_version = client.get(
        f"/v1/reviews/benchmarks/{reviewed['benchmark']['id']}/versions/{version['version']}/agreement", headers=viewer
    ).json()
    assert per_version["reviewers"] == report["reviewers"] and per_version["benchmark_version_id"] == version["id"]

    # The run read with expert verdicts: j1 passes by the experts, j2 (split) keeps its grade.
    experts = client.get(f"/v1/reviews/runs/{run_id}", headers=viewer).json()
    assert experts["tasks"] == 6 and experts["reviewed"] == 4 and experts["differs"] == 1
    assert experts["grader_pass_rate"] == pytest.approx(2 / 6) and experts["pass_rate"] == pytest.approx(3 / 6)
    rows = {row["task_id"]: row for row in experts["trajectories"]}
    assert rows["j1"]["grader_passed"] is False and rows["j1"]["passed"] is True and rows["j1"]["differs"]
    assert rows["j2"]["expert"]["passed"] is None and rows["j2"]["passed"] is False

    # Corrections become data: SFT rows ending in the correction, DPO pairs over the model's turn.
    mined = client.post(f"/v1/reviews/queues/{queue['id']}/dataset", headers=dev, json={"kind": "chat"})
    assert mined.status_code == 201, mined.text
    assert mined.json()["row_count"] == 2 and mined.json()["source_eval_run_id"] == run_id
    pairs = client.post(f"/v1/reviews/queues/{queue['id']}/dataset", headers=dev, json={"kind": "preference"})
    assert pairs.status_code == 201 and pairs.json()["row_count"] == 2
    with session_scope(prepared.database) as session:
        from mint.services.datasets import get_dataset, read_rows

        store = object_store_for(prepared)
        sft = read_rows(store, get_dataset(session, owner.organization_id, mined.json()["id"]))
        dpo = read_rows(store, get_dataset(session, owner.organization_id, pairs.json()["id"]))
    assert [row["messages"][-1] for row in sft] == [{"role": "assistant", "content": "5"}] * 2
    assert {row["metadata"]["lineage"]["reviewer"] for row in sft} == {
        f"key:{owner.key_ids['developer']}",
        f"key:{owner.key_ids['viewer']}",
    }
    assert {row["metadata"]["lineage"]["task_id"] for row in sft} == {"j3", "j4"}
    assert all(row["preferred_output"][0]["content"] == "5" for row in dpo)
    assert [row["non_preferred_output"][0]["content"] for row in dpo] == [
        by_task[task_id]["snapshot"]["output"] for task_id in ("j3", "j4")
    ]

    # ... and a benchmark version with the corrections as tasks of split `expert`.
    grown = client.post(f"/v1/reviews/queues/{queue['id']}/benchmark_version", headers=dev, json={})
    assert grown.status_code == 201, grown.text
    assert grown.json()["version"] == 2 and grown.json()["task_count"] == 8 and grown.json()["splits"] == {"expert": 2}
    with session_scope(prepared.database) as session:
        row = session.get(BenchmarkVersion, grown.json()["id"])
        assert row is not None
        tasks = benchmarks.load_tasks(object_store_for(prepared), row.object_key, row.sha256)
    expert = [task for task in tasks if task.split == "expert"]
    assert {task.metadata["lineage"]["reviewer_name"] for task in expert} == {"developer key", "viewer key"}
    assert all(task.reference == "5" and task.messages == j1["snapshot"]["messages"][:1] for task in expert)
    again_grown = client.post(f"/v1/reviews/queues/{queue['id']}/benchmark_version", headers=dev, json={})
    assert again_grown.status_code == 400  # every correction is a task already


def test_assigned_items_sampling_and_filters_that_do_not_fit(client: TestClient, reviewed: dict[str, Any]) -> None:
    owner, run_id = reviewed["tenant"], reviewed["run_id"]
    dev, viewer = owner.headers("developer"), owner.headers("viewer")
    body = {
        "name": "passes",
        "eval_id": run_id,
        "filters": {"failed": False},
        "assignees": [owner.key_ids["developer"]],
    }
    queue = client.post("/v1/reviews/queues", headers=dev, json=body).json()
    items = client.get(f"/v1/reviews/queues/{queue['id']}/items", headers=dev).json()["data"]
    assert [item["task_id"] for item in items] == ["p1", "p2"]
    assert {item["assignee_key_id"] for item in items} == {owner.key_ids["developer"]}
    assert client.get(f"/v1/reviews/queues/{queue['id']}", headers=viewer).json()["progress"]["todo"] == 0
    refused = _review(client, owner, "viewer", items[0], passed=True)
    assert refused.status_code == 403 and owner.key_ids["developer"] in refused.json()["error"]["message"]
    opened = client.patch(f"/v1/reviews/items/{items[0]['id']}", headers=dev, json={"assignee": None})
    assert opened.status_code == 200 and opened.json()["assignee_key_id"] is None
    assert _review(client, owner, "viewer", items[0], passed=True, score=0.9).status_code == 201
    todo = client.get(f"/v1/reviews/queues/{queue['id']}/items", headers=dev, params={"status": "todo"}).json()
    assert [item["task_id"] for item in todo["data"]] == ["p2"]  # p1 has the one review wanted

    sampled = [
        client.post(
            "/v1/reviews/queues",
            headers=dev,
            json={"name": "sample", "eval_id": run_id, "filters": {"sample_rate": 0.5, "seed": 7}},
        ).json()
        for _ in range(2)
    ]
    picks = [
        [item["task_id"] for item in client.get(f"/v1/reviews/queues/{q['id']}/items", headers=dev).json()["data"]]
        for q in sampled
    ]
    assert picks[0] == picks[1] and 0 < len(picks[0]) < 6

    same = {"name": "x", "eval_id": run_id, "filters": {"disagree_with_run": run_id}}
    refused = client.post("/v1/reviews/queues", headers=dev, json=same)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "filters.disagree_with_run"
    nothing = {"name": "x", "eval_id": run_id, "filters": {"label": "no-such-split"}}
    assert client.post("/v1/reviews/queues", headers=dev, json=nothing).json()["error"]["param"] == "filters"
    both = {"name": "x", "eval_id": run_id, "deployment": "d"}
    assert client.post("/v1/reviews/queues", headers=dev, json=both).status_code == 422


def test_a_queue_of_captures(client: TestClient, tenant: Tenant) -> None:
    from tests.test_tenancy import _deployment

    dev = tenant.headers("developer")
    deployment = _deployment(client, tenant)
    kept = record_capture(tenant, deployment, asked="What is 2 + 3?", answered="6")
    record_capture(tenant, deployment, asked="hi", answered="hello")
    feedback = {"score": 0.0, "label": "wrong_sum"}
    assert (
        client.post(f"/v1/captures/{kept}/feedback", headers=tenant.headers("viewer"), json=feedback).status_code == 201
    )
    body = {"name": "prod", "deployment": deployment, "filters": {"label": "wrong_sum"}}
    queue = client.post("/v1/reviews/queues", headers=dev, json=body)
    assert queue.status_code == 201, queue.text
    (item,) = client.get(f"/v1/reviews/queues/{queue.json()['id']}/items", headers=dev).json()["data"]
    assert item["source_id"] == kept and item["snapshot"]["kind"] == "capture"
    assert item["snapshot"]["messages"][-1] == {"role": "assistant", "content": "6"}
    assert item["snapshot"]["feedback"][0]["label"] == "wrong_sum" and item["snapshot"]["score"] == 0.0
    graded = client.post("/v1/reviews/queues", headers=dev, json={**body, "filters": {"failed": True}})
    assert graded.status_code == 400 and graded.json()["error"]["param"] == "filters.failed"
    fix = {"from_message": 1, "messages": [{"role": "assistant", "content": "5"}]}
    assert _review(client, tenant, "viewer", item, passed=False, correction=fix).status_code == 201
    no_benchmark = client.post(f"/v1/reviews/queues/{queue.json()['id']}/benchmark_version", headers=dev, json={})
    assert no_benchmark.status_code == 400 and no_benchmark.json()["error"]["param"] == "benchmark_id"


@pytest.mark.client_surface
def test_the_sdk_and_the_cli_run_a_round(live_server: LiveServer, reviewed: dict[str, Any]) -> None:
    owner, run_id = reviewed["tenant"], reviewed["run_id"]
    with Mint(live_server.url, owner.keys["developer"]) as sdk:
        queue = sdk.reviews.create_queue("sdk round", eval_id=run_id, filters={"failed": True, "label": None})
        items = list(sdk.reviews.items(queue.id, status="todo", limit=2))
        assert sorted(item.task_id for item in items) == ["j1", "j2", "j3", "j4"]  # in the order they were graded
        fix = {"from_message": items[0].snapshot.prompt_length, "messages": [{"role": "assistant", "content": "5"}]}
        review = sdk.reviews.submit(items[0].id, passed=False, comment="wrong sum", correction=fix)
        assert review.reviewer == f"key:{owner.key_ids['developer']}"
        assert sdk.reviews.get_queue(queue.id).progress.todo == 3  # type: ignore[union-attr]
        with pytest.raises(BadRequestError):  # refused before anything is sent
            sdk.reviews.submit(items[1].id, score=2.0)
    environment = {**os.environ, "MINT_BASE_URL": live_server.url, "MINT_API_KEY": owner.keys["viewer"]}
    mint("reviews", "submit", items[1].id, "--verdict", "pass", "--correct", "5", "--json", env=environment)
    report = json.loads(mint("reviews", "agreement", queue.id, "--json", env=environment).stdout)
    assert report["items"] == 2 and report["settled"] == 2
    environment["MINT_API_KEY"] = owner.keys["developer"]
    mined = json.loads(mint("reviews", "mine", queue.id, "--kind", "chat", "--json", env=environment).stdout)
    assert mined["row_count"] == 2 and mined["source_eval_run_id"] == run_id


@pytest.fixture(scope="module")
def flagged(
    prepared: Settings,
    app: Any,
    resident: Any,  # noqa: F811 - the fixture
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """A benchmark like `reviewed`'s whose judge the experts disagree with, and an adapter version
    evaluated on it. The developer's key passes j1..j4, all four of which the judge failed: the
    judge agrees with the experts on none of four items, 8 values, 4 P and 4 F, D_o = 1,
    D_e = 2*4*4/(8*7) = 4/7, alpha = 1 - 7/4 = -0.75."""
    run = _judged_run(prepared, app, resident)
    owner, run_id = run["tenant"], run["run_id"]
    dev = owner.headers("developer")
    with TestClient(app) as client:
        body = {"name": "judge check", "eval_id": run_id, "filters": {"failed": True}}
        queue = client.post("/v1/reviews/queues", headers=dev, json=body).json()
        items = client.get(f"/v1/reviews/queues/{queue['id']}/items", headers=dev).json()["data"]
        assert sorted(item["task_id"] for item in items) == ["j1", "j2", "j3", "j4"]
        for item in items:
            assert _review(client, owner, "developer", item, passed=True).status_code == 201
    adapter = register_adapter(prepared, owner, resident, tmp_path_factory.mktemp("flagged"))
    run_in_this_process(prepared, owner, run["benchmark"]["id"], resident, model=adapter)
    return {**run, "adapter": adapter}


def _is_the_judge_warning(warning: str, version_id: str) -> bool:
    """The warning names the judge's model, its alpha, the items reviewed, and what to do."""
    return (
        f"judge {BASE} (1:judge)" in warning
        and f"benchmark version {version_id}" in warning
        and "alpha -0.75 over 4 reviewed items" in warning
        and "Review more items" in warning
        and "another judge" in warning
    )


def test_a_judge_the_experts_disagree_with_is_flagged_by_gates_and_auto_runs(
    client: TestClient, flagged: dict[str, Any], tenant: Tenant
) -> None:
    owner, benchmark = flagged["tenant"], flagged["benchmark"]
    dev, version_id = owner.headers("developer"), benchmark["latest_version"]["id"]
    # A gate on the benchmark passes (it only warns), and its verdict carries the warning.
    gate = {"benchmark": benchmark["name"], "min_pass_rate": 0.0}
    body = {"name": f"gated-{owner.organization_id[-6:]}", "model": flagged["adapter"], "gate": gate}
    created = client.post("/v1/deployments", headers=dev, json=body)
    assert created.status_code == 201, created.text
    verdict = created.json()["serving"]["gate_verdict"]
    assert verdict["passed"] and len(verdict["warnings"]) == 1, verdict
    assert _is_the_judge_warning(verdict["warnings"][0], version_id), verdict["warnings"]
    # An auto run on the benchmark says the same from its creation on.
    auto = {"model": BASE, "benchmark_id": benchmark["id"], "target": {"pass_rate": 1.0}, "budget": {"usd": 1.0}}
    run = client.post("/v1/autotune", headers=dev, json=auto)
    assert run.status_code == 201, run.text
    read = client.get(f"/v1/autotune/{run.json()['id']}", headers=owner.headers("viewer")).json()
    assert len(read["warnings"]) == 1 and _is_the_judge_warning(read["warnings"][0], version_id), read["warnings"]
    assert client.post(f"/v1/autotune/{run.json()['id']}/cancel", headers=dev).status_code == 200
    # Another organization's auto run on a benchmark without reviews warns of nothing.
    theirs = create_benchmark(client, tenant, format="jsonl", content=jsonl([judged("j1")])).json()
    quiet = client.post(
        "/v1/autotune", headers=tenant.headers("developer"), json={**auto, "benchmark_id": theirs["id"]}
    )
    assert quiet.status_code == 201 and quiet.json()["warnings"] == []
    assert (
        client.post(f"/v1/autotune/{quiet.json()['id']}/cancel", headers=tenant.headers("developer")).status_code == 200
    )


@pytest.mark.client_surface
def test_the_cli_prints_the_judge_warning_of_gates_and_auto_runs(
    live_server: LiveServer, flagged: dict[str, Any]
) -> None:
    owner, benchmark = flagged["tenant"], flagged["benchmark"]
    environment = {**os.environ, "MINT_BASE_URL": live_server.url, "MINT_API_KEY": owner.keys["developer"]}
    gate = json.dumps({"benchmark": benchmark["name"], "min_pass_rate": 0.0})
    name = f"cli-gated-{owner.organization_id[-6:]}"
    deployed = mint("deploy", name, "--model", flagged["adapter"], "--gate", gate, env=environment)
    assert f"warning: judge {BASE} (1:judge)" in deployed.stderr and "Review more items" in deployed.stderr
    started = mint(
        "auto", "start", "--benchmark", benchmark["id"], "--model", BASE, "--target", "1", "--budget-usd", "1",
        env=environment,
    )  # fmt: skip
    assert f"warning: judge {BASE} (1:judge)" in started.stderr and "alpha -0.75" in started.stderr
    run_id = next(line.split()[-1] for line in started.stdout.splitlines() if line.startswith("id:"))
    mint("auto", "cancel", run_id, env=environment)
