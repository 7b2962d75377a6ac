"""The dashboard's review page, in headless Chromium against the live API, worked with the keyboard alone.

The queue is real: tiny-glm-moe answers four tasks in this process (`run_in_this_process`) and
judges them too; it never writes a `SCORE:` line, so every judge part gives no verdict and every
task fails. One task's prompt holds an earlier tool call and its result, which the conversation
shows. A developer makes the queue of the run's failures through the API; an expert signs in
with a viewer key, opens the list of queues and then the queue, and from there on uses only
keys: moves back and forth, passes the first item marking a rubric criterion, fails the second
with a correction written in the editor (which starts from the model's own text; the letters
typed there trigger no shortcut, and Escape closes the editor without losing them), and fails
the third. The API then has the three reviews, by the viewer's key, with the verdicts given, the
mark, and the correction holding the edited text. A screenshot goes to
test-artifacts/dashboard/reviews-queue.png.
"""

from __future__ import annotations

from typing import Any

import pytest

from mint.config import Settings
from tests.conftest import LiveServer, Tenant
from tests.dashboard.conftest import ARTIFACTS
from tests.dashboard.test_dashboard import Api, benchmark_tasks, signed_in
from tests.evals.test_evals_api import jsonl, resident, run_in_this_process  # noqa: F401 - resident is a fixture
from tests.evals.test_reviews import judged

# A client of the API, like the rest of the dashboard's tests: the embedded pass only.
pytestmark = [pytest.mark.client_surface, pytest.mark.torch, pytest.mark.integration, pytest.mark.slow]

# A prompt with an earlier tool call and its result, as the whole-loop test's benchmark has one.
LOOKUP_PROMPT = next(task["messages"] for task in benchmark_tasks() if task["id"] == "after-lookup")
# Typed in the correction editor: its letters are shortcuts elsewhere on the page (j, k, p, f, c).
ADDED = " Just check: 2 + 3 = 5, pick five for certain."


def test_an_expert_reviews_three_items_with_the_keyboard_alone(
    live_server: LiveServer,
    tenant: Tenant,
    prepared: Settings,
    resident: Any,  # noqa: F811 - the fixture
    browser: Any,
) -> None:
    from playwright.sync_api import expect

    api = Api(live_server.url, tenant)
    rows = [judged("j1"), judged("j2"), {**judged("j3"), "messages": LOOKUP_PROMPT}, judged("j4")]
    benchmark = api.post("/v1/benchmarks", {"name": "sums-to-review", "format": "jsonl", "content": jsonl(rows)})
    run_id = run_in_this_process(prepared, tenant, benchmark["id"], resident)
    body = {
        "name": "sums round 1",
        "eval_id": run_id,
        "filters": {"failed": True},
        "instructions": "Fail a wrong sum; correct the first wrong turn.",
    }
    queue = api.post("/v1/reviews/queues", body)
    # Queue order is the order the run recorded its trajectories in; the page follows it.
    items = api.get(f"/v1/reviews/queues/{queue['id']}/items")["data"]
    assert sorted(item["task_id"] for item in items) == ["j1", "j2", "j3", "j4"], items
    order = [item["task_id"] for item in items]
    first, second, skipped, last = items
    criteria = first["snapshot"]["rubric"]
    assert criteria == ["The answer is the right sum.", "It is brief."]
    model_turn = second["snapshot"]["messages"][second["snapshot"]["prompt_length"]]

    context, page, problems = signed_in(browser, live_server, tenant.keys["viewer"])
    try:
        # The list of queues, with what is left for this key; then the queue.
        page.goto(f"{live_server.url}/ui/#/reviews")
        row = page.locator(f"tr[data-queue='{queue['id']}']")
        expect(row).to_contain_text("sums round 1")
        expect(row.locator("td").nth(6)).to_have_text("4")
        expect(row.get_by_role("link", name="sums round 1")).to_have_attribute("href", f"#/reviews/{queue['id']}")
        page.goto(f"{live_server.url}/ui/#/reviews/{queue['id']}")
        expect(page.get_by_role("heading", name="Review queue sums round 1")).to_be_visible()
        # From here on, keys only.
        keyboard = page.keyboard
        position = page.locator("#item-position")

        def at(index: int) -> None:
            """The page shows the queue's item `index`; j3's conversation shows its prompt's tool call."""
            expect(position).to_have_attribute("data-task", order[index])
            expect(position).to_contain_text(f"Item {index + 1} of 4")
            if order[index] == "j3":
                calls = page.locator("#item-messages .tool-call")
                expect(calls).to_have_count(1)
                expect(calls.first).to_contain_text("lookup_order")
                expect(page.locator("#item-messages .message.role-tool")).to_contain_text("shipped")

        at(0)
        expect(page.locator("#queue-todo")).to_have_text("4 left for you")
        expect(page.locator("#item-reasons")).to_contain_text("failed")
        judge = page.locator("#item-grades [data-grader='1:judge']")
        expect(judge).to_contain_text("gave no verdict")
        reply = first["snapshot"]["grade"]["parts"][1]["grade"]["judge"]["reply"]
        expect(judge.locator(".judge-reply pre").first).to_have_text(reply or "(empty)")
        expect(page.locator("#item-reference")).to_have_text("5")
        expect(page.locator("#review-keys")).to_be_hidden()
        keyboard.press("?")
        expect(page.locator("#review-keys")).to_be_visible()
        expect(page.locator("#review-keys")).to_contain_text("open the correction editor")

        # Back and forth: j/k and the arrows.
        keyboard.press("j")
        at(1)
        keyboard.press("ArrowRight")
        at(2)
        keyboard.press("k")
        at(1)
        keyboard.press("ArrowLeft")
        at(0)

        # The first: pass, the first rubric criterion met, Enter.
        keyboard.press("p")
        expect(page.locator("#verdict-pass")).to_be_checked()
        keyboard.press("1")
        expect(page.locator("#rubric-0")).to_have_value("met")
        keyboard.press("Enter")
        expect(page.locator("#review-said")).to_have_text(f"Review of {order[0]} saved: pass.")
        at(1)
        expect(page.locator("#queue-todo")).to_have_text("3 left for you")

        # The second: fail, and a correction that starts from the model's own text.
        keyboard.press("f")
        expect(page.locator("#verdict-fail")).to_be_checked()
        keyboard.press("c")
        text = page.locator("#correction-text")
        expect(text).to_be_focused()
        expect(text).to_have_value(model_turn["content"])
        expect(page.locator("#correction-from")).to_have_value(str(second["snapshot"]["prompt_length"]))
        keyboard.type(ADDED)
        at(1)  # the letters typed moved nothing
        expect(page.locator("#verdict-fail")).to_be_checked()
        keyboard.press("Escape")
        expect(page.locator("#correction-editor")).to_be_hidden()
        keyboard.press("c")
        expect(text).to_have_value(model_turn["content"] + ADDED)
        keyboard.press("Control+Enter")
        expect(page.locator("#review-said")).to_have_text(f"Review of {order[1]} saved: fail, with a correction.")
        at(2)

        # The third is left for later; the fourth: fail.
        keyboard.press("j")
        at(3)
        keyboard.press("f")
        keyboard.press("Enter")
        expect(page.locator("#review-said")).to_contain_text(f"Review of {order[3]} saved: fail.")
        expect(page.locator("#queue-todo")).to_have_text("1 left for you")
        expect(page.locator("#item-reviews")).to_contain_text("viewer key")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "reviews-queue.png"), full_page=True)
    finally:
        context.close()

    reviewer = f"key:{tenant.key_ids['viewer']}"
    stored = {item["id"]: item["reviews"] for item in api.get(f"/v1/reviews/queues/{queue['id']}/items")["data"]}
    assert stored[skipped["id"]] == []
    (passed,), (corrected,), (failed,) = stored[first["id"]], stored[second["id"]], stored[last["id"]]
    assert [review["reviewer"] for review in (passed, corrected, failed)] == [reviewer] * 3
    assert (passed["passed"], corrected["passed"], failed["passed"]) == (True, False, False)
    assert passed["rubric"] == {criteria[0]: {"passed": True}} and passed["correction"] is None
    assert corrected["correction"] == {
        "from_message": second["snapshot"]["prompt_length"],
        "messages": [{"role": "assistant", "content": model_turn["content"] + ADDED}],
    }
    assert failed["correction"] is None and failed["rubric"] == {}
    progress = api.get(f"/v1/reviews/queues/{queue['id']}")["progress"]
    assert (progress["reviewed"], progress["done"], progress["todo"]) == (3, 3, 1)
    api.http.close()
    assert problems == []
