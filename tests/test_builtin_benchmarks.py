"""Built-in benchmarks and the scripted tool environment.

Checks determinism, split disjointness, JSONL round trips, that every task's own solution
scores 1.0 with its own grader while wrong answers score less, and that the environment
replays scripted results and reports bad calls as observations instead of raising.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from mint.chat.tool_calls import ScriptedCall, ToolCall, format_tool_calls
from mint.errors import InvalidRequest
from mint.evals.builtin import SHOP_TOOLS, Task, builtin_benchmarks, load_builtin, split_of
from mint.evals.environments import Environment

pytestmark = pytest.mark.backend_free

NAMES = ["arithmetic", "format", "tool_calling", "triage"]


def dumps(tasks: list[Task]) -> list[dict[str, Any]]:
    return [task.model_dump(mode="json") for task in tasks]


def test_the_builtin_benchmarks() -> None:
    assert sorted(builtin_benchmarks()) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_tasks_and_other_seeds_differ(name: str) -> None:
    first = load_builtin(name, "train", 30, seed=7)
    assert dumps(first) == dumps(load_builtin(name, "train", 30, seed=7))
    assert dumps(load_builtin(name, "train", 10, seed=7)) == dumps(first[:10])  # a smaller n is a prefix
    assert [task.id for task in first] != [task.id for task in load_builtin(name, "train", 30, seed=8)]
    assert len({task.id for task in first}) == 30


@pytest.mark.parametrize("name", NAMES)
def test_train_and_heldout_never_share_a_task_whatever_the_seeds(name: str) -> None:
    train = {task.id: task for seed in (0, 1, 2) for task in load_builtin(name, "train", 60, seed=seed)}
    heldout = {task.id: task for seed in (0, 3) for task in load_builtin(name, "heldout", 30, seed=seed)}
    assert not train.keys() & heldout.keys()
    # Not only the ids: no heldout prompt is ever a train prompt.
    prompts = {json.dumps(task.messages, sort_keys=True) for task in train.values()}
    assert not any(json.dumps(task.messages, sort_keys=True) in prompts for task in heldout.values())
    for task in heldout.values():
        assert task.metadata["split"] == "heldout" and task.metadata["benchmark"] == name


def test_split_depends_on_content_only() -> None:
    assert split_of("arithmetic", "37+48") == split_of("arithmetic", "37+48")
    buckets = [split_of("arithmetic", f"{a}+1") for a in range(1000)]
    assert 0.1 < buckets.count("heldout") / len(buckets) < 0.3


@pytest.mark.parametrize("name", NAMES)
def test_tasks_round_trip_through_jsonl(name: str) -> None:
    tasks = load_builtin(name, "heldout", 10, seed=1)
    lines = "\n".join(json.dumps(row) for row in dumps(tasks))
    again = [Task.model_validate(json.loads(line)) for line in lines.splitlines()]
    assert again == tasks


@pytest.mark.parametrize("name", NAMES)
def test_every_solution_scores_one_with_its_own_grader(name: str) -> None:
    for split, n in (("train", 150), ("heldout", 50)):
        for task in load_builtin(name, split, n, seed=0):
            assert task.solution is not None
            result = task.grade(task.solution)
            assert (result.score, result.passed) == (1.0, True), (task.id, result)


def test_arithmetic_tasks() -> None:
    for task in load_builtin("arithmetic", "train", 50, seed=0):
        question = task.messages[0]["content"]
        a, operation, b = question.removeprefix("What is ").split("?")[0].split()
        assert str(eval(f"{int(a)} {operation} {int(b)}")) == task.reference  # noqa: S307 -- digits and one operator
        assert question.endswith("Answer with the number only.")
        assert task.grade(f"The answer is {task.reference}.").passed
        assert task.grade(str(int(task.reference) + 1)).score == 0.0
        assert task.grade("").score == 0.0


def test_format_tasks() -> None:
    tasks = load_builtin("format", "train", 200, seed=0)
    assert {task.metadata["template"] for task in tasks} == {"city_json", "sum_json", "capital_answer", "upper_answer"}
    for task in tasks:
        if task.grader.type == "json_match":
            wrong = {key: "?" for key in task.reference}
            assert 0.0 <= task.grade(json.dumps({**task.reference, **dict(list(wrong.items())[:1])})).score < 1.0
            assert task.grade(json.dumps(task.reference) + " Hope that helps!").score == 0.0
        else:
            assert task.grader.type == "regex"
            assert task.grade(task.reference).score == 0.0  # the word without the required form
            assert task.grade(f"ANSWER: {task.reference}x").score == 0.0
            assert task.grade(f"answer: {task.reference}").score == 0.0
    paris = next(task for task in tasks if task.metadata["template"] == "city_json" and "Paris" in str(task.reference))
    assert paris.reference == {"city": "Paris", "country": "France"}


def test_tool_calling_tasks_are_two_steps_that_act_on_the_lookup() -> None:
    tasks = load_builtin("tool_calling", "train", 60, seed=0)
    assert {task.metadata["scenario"] for task in tasks} == {"cancel_latest", "order_total", "weather_destination"}
    tool_names = {tool["function"]["name"] for tool in SHOP_TOOLS}
    for task in tasks:
        assert task.tools == SHOP_TOOLS and task.grader.type == "tool_call"
        first, second = task.reference
        assert {first["name"], second["name"]} <= tool_names
        # The second call needs a value that only the first call's result holds, not the prompt.
        looked_up, prompt = json.dumps(task.environment[0].result), json.dumps(task.messages)
        found = [json.dumps(value).strip('"') for value in second["arguments"].values()]
        assert any(value in looked_up and value not in prompt for value in found), task.id


def test_tool_calling_wrong_trajectories_score_less() -> None:
    for task in load_builtin("tool_calling", "heldout", 20, seed=0):
        first, second = task.reference
        assert task.grade(json.dumps(first)).score == 0.5  # stopped after the lookup
        wrong_id = {"name": second["name"], "arguments": {key: "X" for key in second["arguments"]}}
        assert 0.5 < task.grade(format_tool_calls([ToolCall(**first), ToolCall(**wrong_id)])).score < 1.0
        assert task.grade("I cannot help with that.").score == 0.0
        assert task.grade(format_tool_calls([ToolCall(**first), ToolCall(**second)])).passed  # text form


def test_the_environment_replays_each_solution() -> None:
    for task in load_builtin("tool_calling", "train", 20, seed=3):
        assert task.solution is not None
        environment = task.make_environment()
        replayed: list[dict[str, Any]] = []
        for message in task.solution:
            if message["role"] == "assistant":
                replayed += [message, *environment.step(message)]
        assert replayed == task.solution
        assert environment.errors == 0 and len(environment.history) == 2


SCRIPT = [
    ScriptedCall(name="lookup_order", arguments={"order_id": "A1"}, result={"status": "processing"}),
    ScriptedCall(name="convert_currency", arguments={"amount": 10.0, "to": "USD"}, result="10.80 USD"),
]


def test_environment_reports_bad_calls_as_observations() -> None:
    environment = Environment(SCRIPT, tool_names=["lookup_order", "convert_currency", "cancel_order"])
    assert environment.call(ToolCall("lookup_order", {"order_id": "A1"})).content == '{"status": "processing"}'
    # Integral floats and key order do not change the script key.
    assert environment.call(ToolCall("convert_currency", {"to": "USD", "amount": 10})).content == "10.80 USD"
    unknown = environment.call(ToolCall("delete_database", {}))
    assert unknown.is_error and json.loads(unknown.content) == {
        "error": "unknown tool 'delete_database'; the tools are: cancel_order, convert_currency, lookup_order"
    }
    unscripted = environment.call(ToolCall("cancel_order", {"order_id": "A1"}))
    assert unscripted.is_error and "no result for arguments" in unscripted.content
    assert environment.call(ToolCall("lookup_order", "{oops")).is_error
    assert environment.call(ToolCall("", {})).is_error
    assert environment.errors == 4 and len(environment.history) == 6


def test_environment_steps_text_and_structured_messages() -> None:
    environment = Environment(SCRIPT)  # without tool_names, the script's names are the tools
    text = {"role": "assistant", "content": 'Checking.\n{"name": "lookup_order", "arguments": {"order_id": "A1"}}'}
    assert environment.step(text) == [{"role": "tool", "tool_call_id": "call_1", "content": '{"status": "processing"}'}]
    structured = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "abc", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}},
            {"id": "def", "type": "function", "function": {"name": "nope", "arguments": "{}"}},
            {"id": "ghi", "type": "function"},
        ],
    }
    answers = environment.step(structured)
    assert [answer["tool_call_id"] for answer in answers] == ["abc", "def", "ghi"]
    assert [json.loads(answer["content"]).get("error") is not None for answer in answers] == [False, True, True]
    assert environment.step({"role": "assistant", "content": "All done."}) == []


@pytest.mark.parametrize(
    ("arguments", "param"),
    [
        (("sudoku", "train", 1, 0), "name"),
        (("arithmetic", "test", 1, 0), "split"),
        (("arithmetic", "train", -1, 0), "n"),
        (("arithmetic", "train", 10**9, 0), "n"),
    ],
)
def test_bad_requests_raise_invalid_request(arguments: tuple[Any, ...], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        load_builtin(*arguments)
    assert raised.value.param == param


def test_zero_tasks() -> None:
    assert load_builtin("format", "heldout", 0, seed=0) == []
