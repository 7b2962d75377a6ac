"""The dashboard's episodes and online RL, in headless Chromium against the live API.

A deployment of a registered adapter version has its capture set to record tokens through the
dashboard's capture form; an agent's episodes on it are then recorded turn by turn as the API's
capture writer records them (this test runs no serving node: `tests/serving/test_episodes.py`
records real traffic), and one is rewarded through the API. The deployment's page lists them,
filtered to rewarded or open ones; an episode's page shows its turns in order (the tool result
the harness added, the assistant's tool call, the version that sampled each turn, its tokens),
and its reward form first shows the API's refusal of a wrong number of turn scores, keeping what
was typed, then rewards it, which the API then has.

An online RL job on the deployment is created through the API, but no worker runs it: a real
online job needs a serving node, a worker and a harness, far too slow for a dashboard test.
Its progress is written as its worker writes it: step events through the jobs events service
(`emit_event`, the rows and shapes `mint.services.jobs.training` and `live_episodes` write),
and its published version promoted through the deployments service by the job's principal with
the job's reason. The job's page, open meanwhile, follows it by polling: reward and groups with
signal per step, the episodes each step used, and the version it published and served; the
deployment's revision history shows the promotion by the job. The job is cancelled at the end,
so that no later worker of the session picks it up. Screenshots of the three pages go to
test-artifacts/dashboard/episodes-*.png.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from mint.config import Settings
from tests.conftest import LiveServer, Tenant, record_episode_turn, register_versions
from tests.dashboard.conftest import ARTIFACTS
from tests.dashboard.test_dashboard import BASE, Api, signed_in

# A client of the API, like the rest of the dashboard's tests: the embedded pass only.
pytestmark = [pytest.mark.client_surface, pytest.mark.integration, pytest.mark.slow]

DEPLOYMENT = "agent-prod"
ASKED = {"role": "user", "content": "Where is order A1?"}
LOOKUP = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}}
    ],
}
LOOKED_UP = {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'}
ANSWER = {"role": "assistant", "content": "Order A1 has shipped."}


def shoot(page: Any, name: str) -> None:
    """A screenshot beside the other dashboard tests' (whose fixture empties the folder: not this one)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"episodes-{name}.png"), full_page=True)


def emit_step(
    settings: Settings, job_id: str, step: int, steps: int, metrics: dict[str, float], samples: list[Any]
) -> None:
    """A step's `metrics` event, as the worker writes it (`JobTraining.on_step`)."""
    from mint.services.jobs.events import emit_event, rounded
    from mint.storage.db import session_scope

    shown = ", ".join(f"{name} {value:.4g}" for name, value in metrics.items() if name in ("reward", "loss"))
    with session_scope(settings.database) as session:
        emit_event(
            session,
            job_id,
            f"Step {step}/{steps}: {shown}",
            type="metrics",
            data={"step": step, "learning_rate": 1e-4, **rounded(metrics), "samples": samples},
        )


def publish(settings: Settings, tenant: Tenant, job_id: str, step: int, model: str, version_id: str) -> None:
    """What `VersionPublisher` does once the version is registered, with `serve: immediate`: the
    deployment promoted to it by the job (its principal, its reason), and the job's event."""
    from mint.services.jobs.events import emit_event
    from mint.services.principal import Principal
    from mint.services.serving import deployments
    from mint.storage.db import session_scope

    job = Principal(organization_id=tenant.organization_id, key_id=None, role="developer", name=f"job {job_id}")
    with session_scope(settings.database) as session:
        deployments.promote(
            session,
            job,
            DEPLOYMENT,
            model=model,
            mixture=None,
            reason=f"online RL job {job_id}, step {step}",
            send=None,
        )
        emit_event(
            session,
            job_id,
            f"Step {step}: published {model}, now served",
            data={"step": step, "model": model, "adapter_version_id": version_id, "served": True},
        )


def test_a_deployments_episodes_are_read_and_rewarded_and_its_online_job_followed(
    live_server: LiveServer, tenant: Tenant, prepared: Settings, browser: Any
) -> None:
    from playwright.sync_api import expect

    api = Api(live_server.url, tenant)
    first, second = register_versions(prepared, tenant, "agent", 2, base=BASE)
    deployment = api.post("/v1/deployments", {"name": DEPLOYMENT, "model": first})
    versions = {
        v["model"]: v["id"]
        for a in api.get("/v1/adapters")["data"]
        for v in api.get(f"/v1/adapters/{a['id']}/versions")
    }
    context, page, problems = signed_in(browser, live_server, tenant.keys["developer"])
    ui = f"{live_server.url}/ui/"
    job: dict[str, Any] | None = None
    try:
        # Capture with tokens, through the deployment page's form.
        page.goto(f"{ui}#/deployments/{deployment['id']}")
        expect(page.get_by_role("heading", name=f"Deployment {DEPLOYMENT}")).to_be_visible()
        expect(page.locator("#episodes-state")).to_contain_text("capture records tokens")
        expect(page.locator("#episodes .empty")).to_have_text("No episodes match.")
        tokens = page.get_by_label("Record episodes token-exact (tokens)")
        expect(tokens).not_to_be_checked()
        page.get_by_label("Share of requests to record (%)").fill("100")
        tokens.check()
        page.get_by_role("button", name="Set capture").click()
        expect(page.locator("#capture-state")).to_have_text(
            "Capturing 100% of requests, each kept 30 days. Marked episodes are recorded token-exact."
        )
        expect(page.get_by_label("Record episodes token-exact (tokens)")).to_be_checked()
        assert api.get(f"/v1/deployments/{deployment['id']}")["capture"] == {
            "rate": 1.0,
            "retention_days": 30,
            "tokens": True,
        }

        # Two episodes: one of a greeting, rewarded by its harness; the first turn of a lookup.
        record_episode_turn(
            tenant, deployment["id"], episode="ep-greet", task="greet", model_ref=first, revision=1,
            messages=[{"role": "user", "content": "Hello!"}], answer={"role": "assistant", "content": "Hi."},
            prompt_token_ids=[1, 2, 3], token_ids=[4, 5], logprobs=[-0.25, -0.25],
        )  # fmt: skip
        api.post("/v1/episodes/ep-greet/reward", {"score": 1.0, "label": "solved"}, status=200)
        record_episode_turn(
            tenant, deployment["id"], episode="ep-lookup", task="orders", model_ref=first, revision=1,
            messages=[ASKED], answer=LOOKUP, prompt_token_ids=[1, 2, 3, 6], token_ids=[7, 8, 9, 10],
            logprobs=[-0.25] * 4,
        )  # fmt: skip

        # An online RL job on the deployment; its page, open before any step, follows it.
        job = api.post(
            "/v1/fine_tuning/jobs",
            {
                "model": BASE,
                "steps": 2,
                "method": {
                    "type": "online_rl",
                    "online_rl": {"deployment": DEPLOYMENT, "hyperparameters": {"batch_size": 2, "max_wait_s": 5}},
                },
            },
            status=200,
        )
        assert job["method"]["type"] == "online_rl", job
        page.goto(f"{ui}#/jobs/{job['id']}")
        expect(page.locator("#job-status")).to_have_text(re.compile("validating_files|queued"))
        expect(page.locator("#reward-curve svg")).to_have_attribute("data-points", "0")
        expect(page.locator("#published-versions")).to_contain_text("No version published yet.")
        expect(page.locator("#online-deployment")).to_contain_text(DEPLOYMENT)

        # Step 1 trains on the greeting (and an episode of no signal), publishes version 2 and
        # serves it; the lookup's second turn is then sampled by version 2.
        step_1 = {
            "reward": 0.5, "reward_std": 0.5, "groups_with_signal": 0.5, "episodes": 2.0, "episodes_stale": 0.0,
            "episodes_late": 0.0, "episodes_unrewarded": 1.0, "wait_s": 3.5, "tokens": 9.0, "entropy": 0.25,
            "loss": 0.12, "published": 1.0,
        }  # fmt: skip
        sample = {"text": "episode ep-greet", "reward": 1.0, "detail": f"task 'greet'; sampled by {first}"}
        publish(prepared, tenant, job["id"], 1, second, versions[second])
        emit_step(prepared, job["id"], 1, 2, step_1, [sample])
        record_episode_turn(
            tenant, deployment["id"], episode="ep-lookup", task="orders", model_ref=second, revision=2,
            messages=[ASKED, LOOKUP, LOOKED_UP], answer=ANSWER, prompt_token_ids=[1, 2, 3, 6, 11, 12],
            token_ids=[13, 14, 15], logprobs=[-0.25] * 3,
        )  # fmt: skip
        step_2 = step_1 | {"reward": 0.75, "groups_with_signal": 1.0, "episodes_stale": 1.0, "published": 0.0}
        emit_step(prepared, job["id"], 2, 2, step_2, [sample])

        expect(page.locator("#reward-curve svg")).to_have_attribute("data-points", "2")
        expect(page.locator("#signal-curve svg")).to_have_attribute("data-points", "2")
        expect(page.locator("#groups-with-signal")).to_have_text("100%")
        expect(page.locator("#episodes-used")).to_have_text("2")
        signal = page.locator("#rl-signal")
        for label in ("Stale (dropped)", "Unrewarded past the timeout", "Waited for episodes"):
            expect(signal).to_contain_text(label)
        steps = page.get_by_role("table", name="Steps, newest first").locator("tbody tr")
        expect(steps).to_have_count(2)
        expect(steps.nth(0)).to_contain_text("0.750")
        expect(steps.nth(1)).to_contain_text("50%")
        published = page.get_by_role("table", name="Published versions, newest first").locator("tbody tr")
        expect(published).to_have_count(1)
        expect(published.first).to_contain_text(second)
        expect(published.first).to_contain_text("served")
        expect(page.get_by_role("link", name="episode ep-greet")).to_have_attribute("href", "#/episodes/ep-greet")
        shoot(page, "online-job")

        # The deployment: the job's promotion in its history; its episodes, filtered.
        page.get_by_role("link", name=DEPLOYMENT, exact=True).click()
        expect(page.get_by_role("heading", name=f"Deployment {DEPLOYMENT}")).to_be_visible()
        expect(page.locator("#serving")).to_have_text(second)
        history = page.get_by_role("table", name="Revisions, newest first").locator("tbody tr")
        expect(history).to_have_count(2)
        expect(history.first).to_contain_text(f"job {job['id']}")
        expect(history.first).to_contain_text(f"online RL job {job['id']}, step 1")
        expect(history.first.get_by_role("link", name=f"job {job['id']}")).to_have_attribute(
            "href", f"#/jobs/{job['id']}"
        )
        expect(history.nth(1)).not_to_contain_text("job ")
        expect(page.locator("#online-promotions")).to_contain_text(f"job {job['id']} promoted 1 version")
        episodes = page.get_by_role("table", name="Episodes, newest first").locator("tbody tr")
        expect(episodes).to_have_count(2)
        lookup = page.locator("tr[data-episode='ep-lookup']")
        for text in ("orders", "open", first, second):
            expect(lookup).to_contain_text(text)
        expect(lookup.locator("td").nth(4)).to_have_text("2")
        expect(page.locator("tr[data-episode='ep-greet']")).to_contain_text("1.000 (solved)")
        page.get_by_label("Show", exact=True).select_option("true")
        expect(episodes).to_have_count(1)
        expect(episodes.first).to_have_attribute("data-episode", "ep-greet")
        expect(page.locator("#episode-count")).to_have_text("Showing 1 rewarded episode.")
        page.get_by_label("Show", exact=True).select_option("false")
        expect(episodes).to_have_count(1)
        expect(episodes.first).to_have_attribute("data-episode", "ep-lookup")
        shoot(page, "deployment")

        # The lookup, turn by turn: the tool call, the tool result the harness added, the answer.
        page.get_by_role("link", name="ep-lookup", exact=True).click()
        expect(page.get_by_role("heading", name="Episode ep-lookup")).to_be_visible()
        turns = page.locator("#turns > li")
        expect(turns).to_have_count(2)
        expect(turns.nth(0)).to_contain_text(f"sampled by {first} (revision 1)")
        expect(turns.nth(0)).to_contain_text("4 prompt / 4 sampled tokens")
        expect(turns.nth(0).locator(".tool-call")).to_contain_text("lookup_order")
        expect(turns.nth(0).locator(".message.role-user")).to_contain_text("Where is order A1?")
        expect(turns.nth(1)).to_contain_text(f"sampled by {second} (revision 2)")
        expect(turns.nth(1)).to_contain_text("6 prompt / 3 sampled tokens")
        added = turns.nth(1).get_by_role("list", name="Messages added before turn 2").locator("> li")
        expect(added).to_have_count(1)
        expect(added.first).to_have_class(re.compile("role-tool"))
        expect(added.first).to_contain_text("shipped")
        expect(turns.nth(1).get_by_role("list", name="Answer of turn 2")).to_contain_text("Order A1 has shipped.")
        expect(page.locator("#episode-status")).to_have_text("open")

        # Rewarded through the form: one score per turn is needed, and the API says so.
        wrong = httpx.post(
            f"{live_server.url}/v1/episodes/ep-lookup/reward",
            headers=tenant.headers("developer"),
            json={"score": 0.75, "turn_scores": [1.0]},
        )
        assert wrong.status_code == 400, wrong.text
        form = page.locator("form#reward-episode")
        form.get_by_label("Score", exact=True).fill("0.75")
        form.get_by_label("Turn scores", exact=True).fill("1")
        form.get_by_label("Label", exact=True).fill("solved")
        form.get_by_label("Comment", exact=True).fill("found it with one lookup")
        form.get_by_role("button", name="Reward").click()
        error = page.locator("#reward-episode-error")
        expect(error).to_contain_text("400")
        expect(error).to_contain_text(wrong.json()["error"]["message"])
        expect(form.get_by_label("Score", exact=True)).to_have_value("0.75")
        expect(form.get_by_label("Turn scores", exact=True)).to_have_value("1")
        expect(form.get_by_label("Label", exact=True)).to_have_value("solved")
        expect(form.get_by_label("Comment", exact=True)).to_have_value("found it with one lookup")
        expect(page.locator("#episode-status")).to_have_text("open")
        form.get_by_label("Turn scores", exact=True).fill("0, 1")
        form.get_by_role("button", name="Reward").click()
        expect(page.locator(".alert-notice")).to_contain_text("Episode ep-lookup rewarded 0.75.")
        expect(page.locator("#episode-status")).to_have_text("rewarded")
        expect(page.locator("#episode-reward")).to_have_text("0.750 (solved)")
        expect(form.get_by_role("button", name="Change the reward")).to_be_visible()
        expect(form.get_by_label("Turn scores", exact=True)).to_have_value("0, 1")
        shoot(page, "episode")

        stored = api.get("/v1/episodes/ep-lookup")
        assert (stored["status"], stored["reward"], stored["turn_scores"]) == ("rewarded", 0.75, [0.0, 1.0]), stored
        assert (stored["label"], stored["comment"]) == ("solved", "found it with one lookup"), stored
        assert stored["rewarded_by"], stored
        listed = api.get("/v1/episodes", deployment=DEPLOYMENT, rewarded="false")["data"]
        assert listed == [], listed
    finally:
        if job is not None:
            api.http.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel")
        context.close()
        api.http.close()
    assert problems == []
