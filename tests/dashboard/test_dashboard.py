"""The dashboard at /ui, walked in headless Chromium over the whole loop with real data.

The data are made through the REST API on the live server, and the work is done by a real
worker subprocess on the tiny MoE base: a benchmark, an eval run of the base, a fine-tuning
job watched live on its page, the failures mined into a second job, eval runs of both adapter
versions, and a deployment behind a gate. Meanwhile the browser signs in and opens every page,
checking what each shows against the API's own numbers: the loss curve's points, the
failed-only filter of the trajectory browser, the before/after chart and confidence interval
of a comparison, and promote and roll back through the confirmation dialog. A screenshot of
every page is saved under test-artifacts/dashboard/.

The first job is created before the worker starts, so its page is certain to open on a job
that has not run yet; the page then has to follow it to the end by polling.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from mint.config import Settings
from tests.conftest import LiveServer, Tenant, Workers, record_capture, serving_node, wait_for

# A client of the API, like the SDK and the CLI: it runs in the embedded pass only (see
# tests/conftest.py); what it shows comes from routes tested on both backends.
pytestmark = [pytest.mark.client_surface, pytest.mark.torch, pytest.mark.integration, pytest.mark.slow]

BASE = "tiny-glm-moe"
BENCHMARK = "acknowledge"
REQUESTS = ["Confirm the order.", "Is the service up?", "Acknowledge this.", "Ready?"]
JOB_STEPS = 4
CHECKPOINT_INTERVAL = 2
# Waits for work done by the worker (load the base, train, evaluate) on two shared cores.
WORK_TIMEOUT_MS = 300_000
WORK_TIMEOUT_S = WORK_TIMEOUT_MS / 1000
FINISHED = ("succeeded", "failed", "cancelled")


def benchmark_tasks() -> list[dict[str, Any]]:
    """Four requests to answer `OK`; one with an earlier tool call in its conversation, so the
    trajectory browser has a tool call to show; and one any answer passes, so that every run
    (the untrained base's too) has both passed and failed trajectories."""
    tasks: list[dict[str, Any]] = [
        {"id": f"ok-{index}", "messages": [{"role": "user", "content": text}], "reference": "OK"}
        for index, text in enumerate(REQUESTS)
    ]
    tasks.append(
        {
            "id": "after-lookup",
            "messages": [
                {"role": "user", "content": "Where is order A1?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "lookup_order", "arguments": json.dumps({"order_id": "A1"})},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"status": "shipped"})},
                {"role": "user", "content": "Acknowledge the status."},
            ],
            "reference": "OK",
        }
    )
    tasks.append(
        {
            "id": "any-answer",
            "messages": [{"role": "user", "content": "Say anything at all."}],
            "grader": {"type": "regex", "config": {"pattern": ".*", "dotall": True}},
        }
    )
    return tasks


def training_rows() -> str:
    return "".join(
        json.dumps({"messages": [{"role": "user", "content": f"Request {i}"}, {"role": "assistant", "content": "OK"}]})
        + "\n"
        for i in range(8)
    )


def capture_request(live_server: LiveServer, tenant: Tenant, deployment_id: str, asked: str, answered: str) -> str:
    """Turn capture on for a deployment and record one request to it (this test runs no serving node)."""
    patched = httpx.patch(
        f"{live_server.url}/v1/deployments/{deployment_id}/capture", headers=tenant.headers("developer"),
        json={"rate": 1.0},
    )  # fmt: skip
    assert patched.status_code == 200, patched.text
    return record_capture(tenant, deployment_id, asked=asked, answered=answered)


class Api:
    """The REST API on the live server, with the tenant's developer key; every answer checked."""

    def __init__(self, url: str, tenant: Tenant) -> None:
        self.http = httpx.Client(base_url=url, headers=tenant.headers("developer"), timeout=60)

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    def post(self, path: str, body: dict[str, Any], status: int = 201) -> Any:
        response = self.http.post(path, json=body)
        assert response.status_code == status, response.text
        return response.json()

    def upload(self, name: str, content: str) -> Any:
        response = self.http.post("/v1/datasets", files={"file": (name, content.encode(), "application/jsonl")})
        assert response.status_code == 201, response.text
        return response.json()

    def evaluate(self, benchmark_id: str, model: str) -> dict[str, Any]:
        return self.post("/v1/evals", {"benchmark_id": benchmark_id, "model": model, "max_tokens": 4})

    def train(self, dataset_id: str, steps: int, seed: int) -> dict[str, Any]:
        body = {
            "model": BASE,
            "training_file": dataset_id,
            "suffix": "acknowledger",
            "seed": seed,
            "steps": steps,
            "learning_rate": 3e-3,
            "checkpoint_interval": CHECKPOINT_INTERVAL,
            "method": {"type": "supervised", "supervised": {"hyperparameters": {"batch_size": 8}}},
        }
        return self.post("/v1/fine_tuning/jobs", body, status=200)

    def finished(self, path: str) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            body = self.get(path)
            return body if body["status"] in FINISHED else None

        result = wait_for(done, path, timeout=WORK_TIMEOUT_S)
        assert result["status"] == "succeeded", result
        return result


def test_the_dashboard_is_served_with_a_strict_policy_and_only_its_own_files(client: TestClient) -> None:
    """/ui redirects to /ui/, which serves the page; scripts and styles come with their types
    and a content security policy that allows nothing but the page's own origin; any other name
    is a 404 in Mint's error shape (no URL part reaches a file path)."""
    redirect = client.get("/ui", follow_redirects=False)
    assert redirect.status_code == 308 and redirect.headers["location"] == "/ui/"
    page = client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert '<script type="module" src="app.js">' in page.text
    script = client.get("/ui/app.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/app.css").headers["content-type"].startswith("text/css")
    for missing in ("/ui/nothing.js", "/ui/..%2Fapp.py", "/ui/%2E%2E"):
        answer = client.get(missing)
        assert answer.status_code == 404, missing
        assert answer.json()["error"]["type"] == "not_found_error"
    assert "/ui/" not in client.get("/openapi.json").json()["paths"]


def nav(page: Any, name: str) -> Any:
    """A link of the dashboard's main navigation."""
    return page.get_by_role("navigation", name="Sections").get_by_role("link", name=name, exact=True)


def shoot(page: Any, artifacts: Path, name: str, shots: list[Path]) -> None:
    path = artifacts / f"{len(shots) + 1:02d}-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    shots.append(path)


def test_the_dashboard_walks_the_whole_loop(
    live_server: LiveServer, tenant: Tenant, workers: Workers, browser: Any, artifacts: Path
) -> None:
    from playwright.sync_api import expect

    api = Api(live_server.url, tenant)
    shots: list[Path] = []
    problems: list[str] = []

    # Work queued before any worker runs: the first job, and the base's eval run.
    content = "".join(json.dumps(task) + "\n" for task in benchmark_tasks())
    benchmark = api.post(
        "/v1/benchmarks",
        {"name": BENCHMARK, "format": "jsonl", "content": content, "grader": {"type": "normalized"}},
    )
    first_job = api.train(api.upload("acknowledge.jsonl", training_rows())["id"], steps=JOB_STEPS, seed=1)
    before = api.evaluate(benchmark["id"], BASE)

    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-US", timezone_id="UTC")
    page = context.new_page()
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "console",
        lambda message: (
            problems.append(f"console: {message.text}")
            if message.type == "error" and "Failed to load resource" not in message.text
            else None
        ),
    )
    page.set_default_timeout(60_000)
    ui = f"{live_server.url}/ui/"

    # Sign in: a wrong key is refused with the API's message; the right one opens the overview.
    page.goto(ui)
    expect(page.get_by_role("heading", name="Sign in to Mint")).to_be_visible()
    shoot(page, artifacts, "sign-in", shots)
    page.get_by_label("API key").fill("mint_not_a_key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator(".alert-error")).to_contain_text("401")
    page.get_by_label("API key").fill(tenant.keys["developer"])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview", level=1)).to_be_visible()
    expect(page.locator("#organization")).to_have_text(f"Organization: {tenant.name}")
    assert page.evaluate("sessionStorage.getItem('mint.apiKey')") == tenant.keys["developer"]

    # The first job's page, opened before any worker exists, follows the job to its end.
    page.goto(f"{ui}#/jobs/{first_job['id']}")
    status = page.locator("#job-status")
    expect(status).to_have_text(re.compile("validating_files|queued"))
    expect(page.locator("#loss-curve svg")).to_have_attribute("data-points", "0")
    expect(page.locator("#poll-note")).to_contain_text("updates every 2 seconds")
    shoot(page, artifacts, "job-waiting", shots)
    workers.start("dashboard")
    expect(status).to_have_text("succeeded", timeout=WORK_TIMEOUT_MS)
    curve = page.locator("#loss-curve svg")
    expect(curve).to_have_attribute("data-points", str(JOB_STEPS))
    expect(curve.locator("circle.point")).to_have_count(JOB_STEPS)
    assert len(curve.locator("polyline.series").get_attribute("points").split()) == JOB_STEPS
    expect(page.locator("#job-progress")).to_have_text(f"{JOB_STEPS} of {JOB_STEPS} steps")
    expect(page.get_by_role("cell", name=f"Step {JOB_STEPS}/{JOB_STEPS}", exact=False).first).to_be_visible()
    expect(page.get_by_role("cell", name=f"{first_job['id']}:step-{CHECKPOINT_INTERVAL}")).to_be_visible()
    finished = api.get(f"/v1/fine_tuning/jobs/{first_job['id']}")
    expect(page.locator("#job-cost")).to_have_text(f"${finished['cost_usd']:,.4f}")
    shoot(page, artifacts, "job", shots)
    version_1 = finished["fine_tuned_model"]
    assert version_1 == "acknowledger@1"
    after = api.evaluate(benchmark["id"], version_1)

    # While the worker evaluates: the overview.
    page.goto(ui)
    cards = page.get_by_role("list", name="Resource counts")
    expect(cards.get_by_role("link", name=re.compile(r"^1\s*Benchmarks"))).to_be_visible()
    expect(cards.get_by_role("link", name=re.compile(r"^2\s*Eval runs"))).to_be_visible()
    expect(cards.get_by_role("link", name=re.compile(r"^1\s*Fine-tuning jobs"))).to_be_visible()
    expect(cards.get_by_role("link", name=re.compile(r"^1\s*Adapters"))).to_be_visible()
    expect(page.get_by_role("table", name="The newest fine-tuning jobs").locator("tbody tr")).to_have_count(1)
    expect(page.get_by_role("table", name="The newest eval runs").locator("tbody tr")).to_have_count(2)
    shoot(page, artifacts, "overview", shots)

    # The base's failures become the second job's data; meanwhile, the base's run in the browser.
    before = api.finished(f"/v1/evals/{before['id']}")
    mined = api.post("/v1/datasets/from-failures", {"eval_id": before["id"], "kind": "chat"})
    second_job = api.train(mined["id"], steps=1, seed=2)
    nav(page, "Eval runs").click()
    expect(page.get_by_role("heading", name="Eval runs", level=1)).to_be_visible()
    expect(page.get_by_role("table", name="Eval runs, newest first").locator("tbody tr")).to_have_count(2)
    page.get_by_role("link", name=before["id"], exact=True).click()
    trajectories = page.locator("#trajectories > li")
    expect(trajectories).to_have_count(len(benchmark_tasks()))
    passed_before = before["metrics"]["passed"]
    assert 1 <= passed_before < len(benchmark_tasks()), before["metrics"]
    page.get_by_label("Failed only").check()
    expect(trajectories).to_have_count(len(benchmark_tasks()) - passed_before)
    expect(page.locator("#trajectories > li[data-passed='true']")).to_have_count(0)
    expect(page.locator("#trajectory-count")).to_contain_text("failed trajector")
    looked_up = page.locator("#trajectories > li[data-task='after-lookup']")
    looked_up.locator("summary").click()
    expect(looked_up.locator(".tool-call")).to_contain_text("lookup_order")
    expect(looked_up.locator(".message")).to_have_count(5)
    expect(looked_up.locator(".message.role-tool")).to_contain_text("shipped")
    shoot(page, artifacts, "eval-run", shots)
    page.get_by_label("Failed only").uncheck()
    expect(trajectories).to_have_count(len(benchmark_tasks()))

    # Benchmarks, and the comparison of the two runs of its version.
    after = api.finished(f"/v1/evals/{after['id']}")
    comparison = api.get("/v1/evals/compare", a=before["id"], b=after["id"])
    nav(page, "Benchmarks").click()
    page.get_by_role("link", name=BENCHMARK, exact=True).click()
    expect(page.get_by_role("heading", name=f"Benchmark {BENCHMARK}")).to_be_visible()
    expect(page.get_by_label("Before (run A)")).to_have_value(before["id"])
    expect(page.get_by_label("After (run B)")).to_have_value(after["id"])
    shoot(page, artifacts, "benchmark", shots)
    page.get_by_role("button", name="Compare").click()
    expect(page.get_by_role("heading", name="Comparison", level=1)).to_be_visible()
    chart = page.locator("svg[data-tasks]")
    expect(chart).to_have_attribute("data-tasks", str(len(benchmark_tasks())))
    for task in benchmark_tasks():
        expect(chart.locator(f"g.task[data-task='{task['id']}'] rect.bar")).to_have_count(2)
    expect(page.locator("#accuracy-before")).to_have_text(f"{100 * comparison['a']['accuracy']:.1f}%")
    expect(page.locator("#accuracy-after")).to_have_text(f"{100 * comparison['b']['accuracy']:.1f}%")
    low, high = (100 * comparison["interval"][end] for end in ("low", "high"))
    expect(page.locator("#interval")).to_contain_text("95% confidence interval")
    expect(page.locator("#interval")).to_contain_text(f"{abs(low):.1f} pts, ")
    expect(page.locator("#interval")).to_contain_text(f"{abs(high):.1f} pts]")
    scores = page.get_by_role("table", name="Scores per task")
    expect(scores.locator("tbody tr")).to_have_count(len(benchmark_tasks()))
    expect(scores.get_by_role("row", name=re.compile("any-answer still passing"))).to_be_visible()
    shoot(page, artifacts, "comparison", shots)

    # A deployment behind a gate; version 2 has no eval yet, so the gate refuses it.
    version_2 = api.finished(f"/v1/fine_tuning/jobs/{second_job['id']}")["fine_tuned_model"]
    assert version_2 == "acknowledger@2"
    gate = {"benchmark": BENCHMARK, "min_pass_rate": 0.1, "require_no_significant_regression": False}
    deployment = api.post("/v1/deployments", {"name": "acknowledge-prod", "model": version_1, "gate": gate})
    captured = capture_request(live_server, tenant, deployment["id"], "Ready?", "Hmm")
    api.post(
        f"/v1/captures/{captured}/feedback",
        {"score": 0.0, "correction": {"message": {"role": "assistant", "content": "OK"}}},
    )
    nav(page, "Deployments").click()
    page.get_by_role("link", name="acknowledge-prod", exact=True).click()
    history = page.get_by_role("table", name="Revisions, newest first").locator("tbody tr")
    expect(history).to_have_count(1)
    traffic = page.get_by_role("table", name="Captured requests, newest first").locator("tbody tr")
    expect(traffic).to_have_count(1)
    expect(traffic.first).to_contain_text("Ready?")
    expect(traffic.first).to_contain_text("score 0, → OK")
    expect(page.locator("#capture-state")).to_have_text("Capturing 100% of requests, each kept 30 days.")
    expect(history.first).to_contain_text("gate passed")
    dialog = page.locator("dialog#confirm")
    expect(page.get_by_label("Version to promote")).to_have_value(version_2)
    page.get_by_role("button", name="Promote…").click()
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text(f"Promote {version_2}?")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    expect(history).to_have_count(1)
    page.get_by_role("button", name="Promote…").click()
    dialog.get_by_role("button", name="Promote").click()
    expect(page.locator(".alert-error")).to_contain_text(f"the gate needs an eval of {version_2}")
    expect(history).to_have_count(1)
    shoot(page, artifacts, "deployment-refused", shots)

    # While version 2 is evaluated: the jobs, and both versions of the adapter they trained.
    last = api.evaluate(benchmark["id"], version_2)
    nav(page, "Jobs").click()
    expect(page.get_by_role("table", name="Fine-tuning jobs, newest first").locator("tbody tr")).to_have_count(2)
    shoot(page, artifacts, "jobs", shots)
    nav(page, "Adapters").click()
    page.get_by_role("link", name="acknowledger", exact=True).click()
    versions = page.get_by_role("table", name="Versions, newest first")
    expect(versions.locator("tbody tr")).to_have_count(2)
    expect(versions.locator("tbody tr").first).to_contain_text(version_2)
    shoot(page, artifacts, "adapter", shots)

    # Evaluated, version 2 passes the gate; then roll back to version 1.
    api.finished(f"/v1/evals/{last['id']}")
    nav(page, "Deployments").click()
    page.get_by_role("link", name="acknowledge-prod", exact=True).click()
    expect(history).to_have_count(1)
    page.get_by_role("button", name="Promote…").click()
    dialog.get_by_label(re.compile("^Reason")).fill("version 2 passed the gate")
    dialog.get_by_role("button", name="Promote").click()
    expect(page.locator(".alert-notice")).to_contain_text(f"revision 2 (promote) now serves {version_2}")
    expect(history).to_have_count(2)
    expect(history.first).to_contain_text("promote")
    expect(history.first).to_contain_text("gate passed")
    expect(history.first).to_contain_text("version 2 passed the gate")
    expect(page.locator("#serving")).to_have_text(version_2)
    expect(page.get_by_label("Revision to serve again")).to_have_value("1")
    page.get_by_role("button", name="Roll back…").click()
    expect(dialog).to_contain_text(f"will serve {version_1} again")
    dialog.get_by_role("button", name="Roll back").click()
    expect(history).to_have_count(3)
    expect(history.first).to_contain_text("rollback")
    expect(page.locator("#serving")).to_have_text(version_1)
    expect(page.locator("#current-revision")).to_have_text("3")
    shoot(page, artifacts, "deployment", shots)
    served = api.get(f"/v1/deployments/{deployment['id']}")
    assert served["current_revision"] == 3 and served["serving"]["routing"]["model"] == version_1
    nav(page, "Deployments").click()
    expect(page.get_by_role("table", name="Deployments, newest first")).to_contain_text(version_1)
    shoot(page, artifacts, "deployments", shots)

    # Usage: the tokens the jobs trained and the eval runs sampled, and what they cost.
    summary = api.get("/v1/usage")
    usage = {line["kind"]: line for line in summary["data"]}
    nav(page, "Usage").click()
    lines = page.get_by_role("table", name="Usage by kind and base model")
    for kind in ("trained", "sampled"):
        line = usage[kind]
        row = lines.get_by_role("row", name=re.compile(f"^{kind} {BASE} {line['tokens']:,} "))
        expect(row).to_be_visible()
        expect(row).to_contain_text(f"${line['cost_usd']:,.4f}")
    expect(page.locator("#usage-total")).to_have_text(f"${summary['total_cost_usd']:,.4f} in this window")
    spent = api.get("/v1/organization/spend_limits")["spent_this_month_usd"]
    expect(page.locator("#spent-this-month")).to_have_text(f"${spent:,.4f}")
    shoot(page, artifacts, "usage", shots)

    # Signing out forgets the key.
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in to Mint")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('mint.apiKey')") is None
    context.close()
    api.http.close()

    print("\nscreenshots:\n" + "\n".join(f"  {path}" for path in shots))
    assert problems == []


def test_a_reinforcement_jobs_page_shows_its_reward_and_signal(
    live_server: LiveServer, tenant: Tenant, workers: Workers, browser: Any
) -> None:
    """An RL job's page draws its mean reward per step and the latest step's signal: the
    reward's spread, the share of groups with signal, KL, entropy and clip fraction; and the
    latest step's samples as the grader read them."""
    from playwright.sync_api import expect

    api = Api(live_server.url, tenant)
    prompts = "".join(
        json.dumps({"messages": [{"role": "user", "content": f"Say something {i}."}], "reference": "x"}) + "\n"
        for i in range(4)
    )
    steps = 2
    job = api.post(
        "/v1/fine_tuning/jobs",
        {
            "model": BASE,
            "training_file": api.upload("prompts.jsonl", prompts)["id"],
            "steps": steps,
            "method": {
                "type": "reinforcement",
                "reinforcement": {
                    # About one sample in ten of the tiny base starts with a capital: groups with signal.
                    "grader": {"type": "regex", "config": {"pattern": "^[A-Z]", "mode": "search"}},
                    "hyperparameters": {"batch_size": 2, "group_size": 8, "max_tokens": 2},
                },
            },
        },
        status=200,
    )
    workers.start("dashboard-rl")
    api.finished(f"/v1/fine_tuning/jobs/{job['id']}")
    reported = [e["data"] for e in api.get(f"/v1/fine_tuning/jobs/{job['id']}/events", limit=100)["data"]]
    newest = next(data for data in reported if "reward" in data)

    page = browser.new_page()
    page.goto(f"{live_server.url}/ui/")
    page.get_by_label("API key").fill(tenant.keys["viewer"])
    page.get_by_role("button", name="Sign in").click()
    page.goto(f"{live_server.url}/ui/#/jobs/{job['id']}")
    expect(page.locator("#job-status")).to_have_text("succeeded")
    expect(page.locator("#reward-curve svg")).to_have_attribute("data-points", str(steps))
    signal = page.locator("#rl-signal")
    expect(signal).to_contain_text(f"Step{steps}")
    expect(page.locator("#groups-with-signal")).to_have_text(f"{100 * newest['groups_with_signal']:.0f}%")
    for label in ("Reward", "KL to the base", "Entropy", "Clip fraction", "Tokens sampled"):
        expect(signal).to_contain_text(label)
    # The newest step's samples as graded: each text, with its reward and the reference.
    samples = page.locator("#rl-samples")
    expect(samples).to_contain_text(f"Samples of step {steps}, as graded")
    for sample in newest["samples"]:
        expect(samples).to_contain_text(sample["text"].strip() or "Reward")
    expect(samples.locator("tbody tr")).to_have_count(len(newest["samples"]))
    page.close()
    api.http.close()


def test_an_auto_runs_page_shows_its_trials_decisions_and_held_out_result(
    live_server: LiveServer, tenant: Tenant, workers: Workers, browser: Any
) -> None:
    """A finished auto run, as a viewer sees it: listed with its status and best version; its
    page gives the phase, the cost so far, the trial (linked to its job and its dev eval run),
    the held-out comparison with the base and every decision with its reason."""
    from playwright.sync_api import expect

    api = Api(live_server.url, tenant)
    benchmark = api.post("/v1/benchmarks", {"name": "format-auto-ui", "builtin": "format", "n": 8})
    body = {
        "model": BASE,
        "benchmark_id": benchmark["id"],
        "target": {"pass_rate": 1.0},
        "budget": {"usd": 50.0},
        "constraints": {"methods": ["sft"], "max_trials": 1, "max_steps": 1},
        "eval_max_tokens": 8,
    }
    created = api.post("/v1/autotune", body)
    # A budget that pays for no trial: the run stops with no held-out comparison to show.
    starved = api.post("/v1/autotune", {**body, "budget": {"usd": 1e-6}})
    workers.start("dashboard-auto", env={"MINT_AUTOTUNE_POLL_S": "0.2"})

    def done(run_id: str) -> dict[str, Any] | None:
        run = api.get(f"/v1/autotune/{run_id}")
        return run if run["status"] not in ("queued", "running") else None

    run = wait_for(lambda: done(created["id"]), "the auto run to finish", timeout=WORK_TIMEOUT_S)
    assert run["status"] == "stopped", run
    trial = run["trials"][0]

    page = browser.new_page()
    page.goto(f"{live_server.url}/ui/")
    page.get_by_label("API key").fill(tenant.keys["viewer"])
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("link", name="Auto runs").click()
    row = page.get_by_role("row").filter(has_text=run["id"])
    expect(row).to_contain_text("stopped")
    expect(row).to_contain_text(run["best"]["model"])
    row.get_by_role("link", name=run["id"]).click()
    expect(page.locator("#auto-status")).to_have_text("stopped")
    expect(page.locator("#auto-phase")).to_have_text("done")
    expect(page.locator("#auto-cost")).to_have_text(f"${run['cost_usd']:.4f}")
    expect(page.locator("#auto-heldout")).to_have_text(f"{100 * run['result']['heldout_pass_rate']:.1f}%")
    expect(page.locator("#auto-result")).to_contain_text("all 1 trials allowed have run")
    trials = page.get_by_role("table", name="Trials, in order")
    expect(trials.get_by_role("link", name=trial["job_id"])).to_have_attribute("href", f"#/jobs/{trial['job_id']}")
    expect(trials.get_by_role("link", name=trial["eval_id"])).to_be_visible()
    decisions = page.locator("#auto-decisions li")
    expect(decisions).to_have_count(len(run["decisions"]))
    expect(decisions.last).to_contain_text("finish: stopped")
    expect(page.locator("#auto-decisions")).to_contain_text("evaluate the base")

    stopped = wait_for(lambda: done(starved["id"]), "the starved auto run to finish", timeout=WORK_TIMEOUT_S)
    assert stopped["status"] == "stopped" and stopped["trials"] == [], stopped
    page.goto(f"{live_server.url}/ui/#/autotune/{starved['id']}")
    expect(page.locator("#auto-status")).to_have_text("stopped")
    expect(page.locator("#auto-result")).to_contain_text("no trial produced a version")
    expect(page.locator("#auto-heldout")).to_have_count(0)
    page.close()
    api.http.close()


def test_the_tinker_runs_pages_show_runs_and_their_checkpoints(
    live_server: LiveServer, tenant: Tenant, workers: Workers, browser: Any
) -> None:
    """A model trained through the official tinker SDK, as a viewer sees it: listed under Tinker
    runs with its base, rank and last checkpoints; its page lists each checkpoint with its type,
    whether it is published, and when it expires."""
    import tinker
    from playwright.sync_api import expect

    workers.start("dashboard-tinker", base=BASE)
    service = tinker.ServiceClient(base_url=live_server.url, api_key=tenant.keys["developer"])
    training = service.create_lora_training_client(base_model=BASE, rank=4, seed=1).result()
    state = training.save_state("ui-state").result().path
    weights = training.save_weights_for_sampler("ui-weights").result().path
    # Unnamed sampler weights make a sampler of the session, not a checkpoint.
    training.save_weights_and_get_sampling_client().result()
    rest = service.create_rest_client()
    rest.publish_checkpoint_from_tinker_path(weights).result()
    rest.set_checkpoint_ttl_from_tinker_path(state, 7200).result()
    service.close("success").result()

    page = browser.new_page()
    page.goto(f"{live_server.url}/ui/")
    page.get_by_label("API key").fill(tenant.keys["viewer"])
    page.get_by_role("button", name="Sign in").click()
    nav(page, "Tinker runs").click()
    runs = page.get_by_role("table", name="Tinker runs, newest first")
    row = runs.get_by_role("row").filter(has_text=training.model_id)
    expect(row).to_contain_text(BASE)
    expect(row).to_contain_text(state)
    expect(row).to_contain_text(weights)
    row.get_by_role("link", name=training.model_id).click()
    checkpoints = page.get_by_role("table", name="Checkpoints, oldest first")
    expect(checkpoints.get_by_role("row").filter(has_text=weights)).to_contain_text("public")
    saved = checkpoints.get_by_role("row").filter(has_text=state)
    expect(saved).to_contain_text("private")
    expect(saved).not_to_contain_text("never")  # it has a TTL now
    expect(checkpoints.locator("tbody tr")).to_have_count(2)
    samplers = page.get_by_role("table", name="Samplers, oldest first").locator("tbody tr")
    expect(samplers).to_have_count(1)
    expect(samplers.first).to_contain_text("weights saved for sampling without a name")
    page.close()


def test_a_versions_lineage_page_shows_what_it_was_trained_from(
    live_server: LiveServer, tenant: Tenant, workers: Workers, browser: Any
) -> None:
    """A version warm-started from another, as a viewer sees it: the adapter's page links each
    version's lineage, which lists the parent then the child, oldest first, with how each was
    made and the job that made it."""
    from playwright.sync_api import expect

    api = Api(live_server.url, tenant)
    rows = api.upload("lineage.jsonl", training_rows())
    workers.start("dashboard-lineage")
    common = {"model": BASE, "training_file": rows["id"], "steps": 1, "method": {"type": "supervised"}}
    parent_job = api.post("/v1/fine_tuning/jobs", {**common, "suffix": "lineage-parent"}, status=200)
    parent = api.finished(f"/v1/fine_tuning/jobs/{parent_job['id']}")["fine_tuned_model"]
    child_job = api.post(
        "/v1/fine_tuning/jobs", {**common, "suffix": "lineage-child", "from_adapter": parent}, status=200
    )
    child = api.finished(f"/v1/fine_tuning/jobs/{child_job['id']}")["fine_tuned_model"]

    page = browser.new_page()
    page.goto(f"{live_server.url}/ui/")
    page.get_by_label("API key").fill(tenant.keys["viewer"])
    page.get_by_role("button", name="Sign in").click()
    nav(page, "Adapters").click()
    page.get_by_role("link", name="lineage-child", exact=True).click()
    page.get_by_role("link", name=f"Lineage of {child}").click()
    chain = page.get_by_role("table", name="Lineage, oldest first").locator("tbody tr")
    expect(chain).to_have_count(2)
    expect(chain.nth(0)).to_contain_text(parent)
    expect(chain.nth(0)).to_contain_text(parent_job["id"])
    expect(chain.nth(1)).to_contain_text(child)
    expect(chain.nth(1)).to_contain_text("sft")
    expect(chain.nth(1).get_by_role("link", name=child_job["id"])).to_have_attribute(
        "href", f"#/jobs/{child_job['id']}"
    )
    page.close()
    api.http.close()


@pytest.fixture(scope="module")
def node(prepared: Settings) -> Iterator[Any]:
    """A serving node of the tiny base: the playground's replies come from its engine."""
    yield from serving_node(prepared, BASE)


def test_the_playground_shows_a_reply_token_by_token_with_the_alternatives(
    live_server: LiveServer, tenant: Tenant, node: Any, browser: Any
) -> None:
    """A developer samples the base greedily in the playground: the reply's tokens, logprobs
    and alternatives are those the OpenAI route gives for the same request, and at temperature
    0 every token is the likeliest of its step."""
    from playwright.sync_api import expect

    body = {
        "model": BASE,
        "messages": [{"role": "user", "content": "Ping 1"}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
    }
    answer = httpx.post(
        f"{live_server.url}/v1/chat/completions", headers=tenant.headers("developer"), json=body, timeout=120
    )
    assert answer.status_code == 200, answer.text
    expected = answer.json()["choices"][0]["logprobs"]["content"]
    assert expected, "the base replied with no tokens"

    page = browser.new_page()
    page.goto(f"{live_server.url}/ui/")
    page.get_by_label("API key").fill(tenant.keys["developer"])
    page.get_by_role("button", name="Sign in").click()
    nav(page, "Playground").click()
    page.get_by_label("Model", exact=True).fill(BASE)
    page.get_by_label("Message").fill("Ping 1")
    page.get_by_label("Max tokens").fill("5")
    page.get_by_label("Temperature").fill("0")
    page.get_by_role("button", name="Sample").click()
    tokens = page.get_by_role("table", name="Tokens of the reply")
    rows = tokens.locator("tbody tr")
    expect(rows).to_have_count(len(expected))
    for row, entry in zip(rows.all(), expected, strict=True):
        cells = row.locator("td").all_inner_texts()
        assert cells[1] == json.dumps(entry["token"]), cells
        assert float(cells[2]) == pytest.approx(entry["logprob"], abs=1e-4)
        # Greedy: the token is the first, likeliest, of its step's alternatives.
        assert cells[4].startswith(json.dumps(entry["token"])), cells
    expect(page.get_by_label("Reply, token by token")).to_have_text("".join(entry["token"] for entry in expected))

    page.get_by_label("Model", exact=True).fill("no-such-model")
    page.get_by_role("button", name="Sample").click()
    expect(page.locator(".alert-error")).to_contain_text("no-such-model")
    page.close()


# ---- the dashboard alone starts the loop -------------------------------------------------------


def signed_in(browser: Any, live_server: LiveServer, key: str) -> tuple[Any, Any, list[str]]:
    """A fresh page signed in with `key`, and the problems it reports (page errors, console
    errors other than a refused request's, which the forms show themselves)."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-US", timezone_id="UTC")
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "console",
        lambda message: (
            problems.append(f"console: {message.text}")
            if message.type == "error" and "Failed to load resource" not in message.text
            else None
        ),
    )
    page.set_default_timeout(60_000)
    page.goto(f"{live_server.url}/ui/")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview", level=1)).to_be_visible()
    return context, page, problems


def jsonl_file(name: str, text: str) -> dict[str, Any]:
    return {"name": name, "mimeType": "application/jsonl", "buffer": text.encode()}


def benchmark_file() -> dict[str, Any]:
    return jsonl_file("acknowledge.jsonl", "".join(json.dumps(task) + "\n" for task in benchmark_tasks()))


def test_on_a_fresh_platform_the_dashboard_alone_starts_an_eval_a_job_and_a_deployment(
    live_server: LiveServer, tenant: Tenant, workers: Workers, browser: Any
) -> None:
    """A new organization, nothing made through the API: its pages offer forms instead of API
    calls. A benchmark from a file, an eval run of the base on it, a dataset uploaded and a job
    trained on it (its estimate shown before it can start), and a deployment of the version the
    job made, each started from the dashboard; the API then has each as the forms said."""
    from playwright.sync_api import expect

    workers.start("dashboard-forms")
    api = Api(live_server.url, tenant)
    context, page, problems = signed_in(browser, live_server, tenant.keys["developer"])
    refused: list[str] = []
    page.on(
        "response",
        lambda response: refused.append(f"{response.status} {response.url}") if response.status >= 400 else None,
    )

    # A benchmark from a file of tasks.
    nav(page, "Benchmarks").click()
    expect(page.get_by_text("No benchmarks yet: create one with the form above.")).to_be_visible()
    form = page.locator("form#create-benchmark")
    form.get_by_label("Name", exact=True).fill(BENCHMARK)
    form.get_by_label("Tasks file", exact=True).set_input_files(benchmark_file())
    form.get_by_label("Grader", exact=True).select_option("normalized")
    form.get_by_role("button", name="Create the benchmark").click()
    expect(page.get_by_role("heading", name=f"Benchmark {BENCHMARK}")).to_be_visible()
    (benchmark,) = api.get("/v1/benchmarks")["data"]
    assert benchmark["name"] == BENCHMARK and benchmark["latest_version"]["task_count"] == len(benchmark_tasks())

    # An eval run of the base on it.
    page.get_by_role("link", name="Evaluate a model on it…").click()
    form = page.locator("form#start-eval")
    expect(form.get_by_label("Benchmark", exact=True)).to_have_value(benchmark["id"])
    form.get_by_label("Model", exact=True).fill(BASE)
    form.get_by_label("Max tokens", exact=True).fill("4")
    form.get_by_role("button", name="Start the eval run").click()
    expect(page.get_by_role("heading", name=re.compile("^Eval run "), level=1)).to_be_visible()
    (run,) = api.get("/v1/evals")["data"]
    assert (run["model"], run["benchmark_id"], run["config"]["max_tokens"]) == (BASE, benchmark["id"], 4), run
    assert page.url.endswith(f"#/evals/{run['id']}")

    # A dataset, and a job on it: the estimate first, then the start.
    nav(page, "Datasets").click()
    form = page.locator("form#upload-dataset")
    form.get_by_label("JSONL file", exact=True).set_input_files(jsonl_file("acknowledge.jsonl", training_rows()))
    form.get_by_role("button", name="Upload").click()
    dataset_id = page.locator("#uploaded-dataset").inner_text()
    page.get_by_role("link", name="Fine-tune on it…").click()
    form = page.locator("form#start-job")
    expect(form.get_by_label("Training file", exact=True)).to_have_value(dataset_id)
    expect(form.get_by_label("Method", exact=True)).to_have_value("supervised")
    form.get_by_label("Base model", exact=True).select_option(BASE)
    form.get_by_label("Adapter name (suffix)", exact=True).fill("first-hour")
    form.get_by_label("Steps", exact=True).fill("2")
    form.get_by_label("Seed", exact=True).fill("1")
    start = form.get_by_role("button", name="Start the job")
    expect(start).to_be_hidden()
    form.get_by_role("button", name="Estimate").click()
    body = {
        "model": BASE,
        "training_file": dataset_id,
        "suffix": "first-hour",
        "steps": 2,
        "seed": 1,
        "method": {"type": "supervised", "supervised": {}},
    }
    estimate = api.post("/v1/fine_tuning/jobs/estimate", body, status=200)
    expect(page.locator("#estimate-cost")).to_contain_text(f"${estimate['cost_usd']:,.4f}")
    expect(page.locator("#estimate-steps")).to_have_text("2")
    expect(start).to_be_visible()
    # A changed field needs a new estimate before the job can start.
    form.get_by_label("Steps", exact=True).fill("3")
    expect(start).to_be_hidden()
    form.get_by_label("Steps", exact=True).fill("2")
    form.get_by_role("button", name="Estimate").click()
    start.click()
    expect(page.get_by_role("heading", name=re.compile("^Job "), level=1)).to_be_visible()
    (job,) = api.get("/v1/fine_tuning/jobs")["data"]
    assert (job["training_file"], job["total_steps"], job["seed"], job["suffix"]) == (dataset_id, 2, 1, "first-hour")
    expect(page.locator("#job-status")).to_have_text("succeeded", timeout=WORK_TIMEOUT_MS)
    curve = page.locator("#loss-curve")
    expect(curve.locator("svg")).to_have_attribute("data-points", "2")
    expect(curve.locator("figcaption")).to_have_text("Loss at each of its 2 optimizer steps.")
    ticks = curve.locator("text.x-tick").all_text_contents()
    assert ticks and all(re.fullmatch(r"\d+", tick) for tick in ticks), ticks

    # A deployment of the version it made.
    nav(page, "Deployments").click()
    form = page.locator("form#create-deployment")
    form.get_by_label("Name", exact=True).fill("first-hour-prod")
    expect(form.get_by_label("Version to serve", exact=True)).to_have_value("first-hour@1")
    form.get_by_role("button", name="Create the deployment").click()
    expect(page.get_by_role("heading", name="Deployment first-hour-prod")).to_be_visible()
    expect(page.locator("#serving")).to_have_text("first-hour@1")
    (deployment,) = api.get("/v1/deployments")["data"]
    assert deployment["serving"]["routing"]["model"] == "first-hour@1" and deployment["gate"] is None

    context.close()
    api.http.close()
    assert refused == [] and problems == []


def test_a_form_shows_the_apis_refusal_and_keeps_what_was_typed(
    live_server: LiveServer, tenant: Tenant, browser: Any
) -> None:
    """A second benchmark of the same name and a dataset with a broken row: each form shows the
    API's 4xx message next to it, stays on its page, and keeps every field as it was."""
    from playwright.sync_api import expect

    headers = tenant.headers("developer")
    context, page, problems = signed_in(browser, live_server, tenant.keys["developer"])
    nav(page, "Benchmarks").click()
    form = page.locator("form#create-benchmark")
    form.get_by_label("Name", exact=True).fill(BENCHMARK)
    form.get_by_label("Tasks file", exact=True).set_input_files(benchmark_file())
    form.get_by_label("Grader", exact=True).select_option("normalized")
    form.get_by_role("button", name="Create the benchmark").click()
    expect(page.get_by_role("heading", name=f"Benchmark {BENCHMARK}")).to_be_visible()

    # The same name again: the API's 409, in its words, under the form.
    content = "".join(json.dumps(task) + "\n" for task in benchmark_tasks())
    refused = httpx.post(
        f"{live_server.url}/v1/benchmarks",
        headers=headers,
        json={"name": BENCHMARK, "format": "jsonl", "content": content},
    )
    assert refused.status_code == 409, refused.text
    nav(page, "Benchmarks").click()
    page.get_by_text("Create a benchmark", exact=True).click()
    form.get_by_label("Name", exact=True).fill(BENCHMARK)
    form.get_by_label("Description", exact=True).fill("the same tasks again")
    form.get_by_label("Tasks file", exact=True).set_input_files(benchmark_file())
    form.get_by_label("Grader", exact=True).select_option("exact")
    form.get_by_role("button", name="Create the benchmark").click()
    error = page.locator("#create-benchmark-error")
    expect(error).to_contain_text("409")
    expect(error).to_contain_text(refused.json()["error"]["message"])
    expect(page.get_by_role("heading", name="Benchmarks", level=1)).to_be_visible()
    expect(form.get_by_label("Name", exact=True)).to_have_value(BENCHMARK)
    expect(form.get_by_label("Description", exact=True)).to_have_value("the same tasks again")
    expect(form.get_by_label("Grader", exact=True)).to_have_value("exact")
    assert form.get_by_label("Tasks file", exact=True).evaluate("input => input.files[0].name") == "acknowledge.jsonl"

    # A dataset with a broken row: the API's 400 names it.
    broken = training_rows() + '{"messages": "not a list"}\n'
    answer = httpx.post(
        f"{live_server.url}/v1/datasets",
        headers=headers,
        files={"file": ("broken.jsonl", broken.encode(), "application/jsonl")},
    )
    assert answer.status_code == 400, answer.text
    nav(page, "Datasets").click()
    form = page.locator("form#upload-dataset")
    form.get_by_label("JSONL file", exact=True).set_input_files(jsonl_file("broken.jsonl", broken))
    form.get_by_label("Kind", exact=True).select_option("chat")
    form.get_by_role("button", name="Upload").click()
    error = page.locator("#upload-dataset-error")
    expect(error).to_contain_text(answer.json()["error"]["message"])
    expect(form.get_by_label("Kind", exact=True)).to_have_value("chat")
    assert form.get_by_label("JSONL file", exact=True).evaluate("input => input.files[0].name") == "broken.jsonl"
    expect(page.get_by_role("table", name="Datasets, newest first")).to_have_count(0)
    context.close()
    assert problems == []


def test_every_page_has_its_favicon(live_server: LiveServer, browser: Any) -> None:
    """The page names its icon, which is served (an SVG the browser decodes): no request of
    the page is answered 4xx."""
    from playwright.sync_api import expect

    page = browser.new_page()
    failed: list[str] = []
    page.on(
        "response",
        lambda response: failed.append(f"{response.status} {response.url}") if response.status >= 400 else None,
    )
    page.goto(f"{live_server.url}/ui/")
    expect(page.get_by_role("heading", name="Sign in to Mint")).to_be_visible()
    href = page.locator("link[rel='icon']").get_attribute("href")
    assert href == "favicon.svg"
    size = page.evaluate(
        """async (href) => {
            const image = new Image();
            image.src = new URL(href, document.baseURI).href;
            await image.decode();
            return [image.naturalWidth, image.naturalHeight];
        }""",
        href,
    )
    assert size[0] > 0 and size[1] > 0, size
    icon = page.request.get(f"{live_server.url}/ui/{href}")
    assert icon.status == 200 and icon.headers["content-type"] == "image/svg+xml"
    page.close()
    assert failed == []
