"""Mining failed trajectories into SFT rows, DPO pairs and RL prompts that the trainer's own
validators accept. Trajectories come from the runner with a scripted model (fixed replies
per task), so which tasks fail, and how, is known exactly."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from mint.chat.rows import validate_chat_row, validate_preference_row, validate_prompt_row
from mint.chat.tool_calls import ToolCall, format_tool_calls
from mint.evals.benchmark import BenchmarkTask, parse_benchmark
from mint.evals.builtin import load_builtin
from mint.evals.mining import mine_failures, reference_continuation
from mint.evals.runner import GenerateRequest, Generation, TrajectoryRecord, run_tasks

pytestmark = pytest.mark.backend_free

VALIDATORS = {"chat": validate_chat_row, "preference": validate_preference_row, "prompts": validate_prompt_row}


def builtin_tasks() -> list[BenchmarkTask]:
    return [
        BenchmarkTask.from_builtin(task)
        for name in ("arithmetic", "format", "tool_calling")
        for task in load_builtin(name, "heldout", 3, seed=4)
    ]


def scripted(replies: dict[str, list[str]]) -> Any:
    """A model that answers each task's n-th turn with replies[task id][n] (the last one after that).

    Tasks are recognised by their first messages, registered in the returned `prompts`.
    """

    def generate(requests: Sequence[GenerateRequest]) -> list[Generation]:
        out = []
        for request in requests:
            task_id = prompts[json.dumps(request.messages[:2], sort_keys=True)]
            turn = sum(message["role"] == "assistant" for message in request.messages)
            answers = replies[task_id]
            out.append(Generation(text=answers[min(turn, len(answers) - 1)], tokens_in=5, tokens_out=2, latency_ms=1))
        return out

    prompts: dict[str, str] = {}
    return generate, prompts


def run_scripted(tasks: list[BenchmarkTask], replies: dict[str, list[str]]) -> list[TrajectoryRecord]:
    generate, prompts = scripted(replies)
    for task in tasks:
        prompts[json.dumps(task.messages[:2], sort_keys=True)] = task.id
    return run_tasks(tasks, generate, max_steps=4)


def solution_turns(task: BenchmarkTask) -> list[str]:
    assert task.solution is not None
    return [
        message["content"] or format_tool_calls(ToolCall.from_openai(call) for call in message["tool_calls"])
        for message in task.solution
        if message["role"] == "assistant"
    ]


@pytest.fixture(scope="module")
def mined_run() -> tuple[list[BenchmarkTask], list[TrajectoryRecord]]:
    tasks = builtin_tasks()
    replies = {task.id: ["I do not know"] for task in tasks}
    arithmetic, fmt, tools = tasks[0:3], tasks[3:6], tasks[6:9]
    replies[arithmetic[0].id] = solution_turns(arithmetic[0])  # passes
    replies[fmt[0].id] = ["answer: paris"]  # the wrong form
    first, *_ = solution_turns(tools[0])
    replies[tools[0].id] = [first, '{"name": "get_weather", "arguments": {"city": "Atlantis"}}', "Done."]
    replies[tools[1].id] = solution_turns(tools[1])  # passes
    records = run_scripted(tasks, replies)
    assert [record.passed for record in records] == [True, False, False, False, False, False, False, True, False]
    return tasks, records


@pytest.mark.parametrize("kind", ["chat", "preference", "prompts"])
def test_every_failed_task_gives_a_valid_row(
    kind: str, mined_run: tuple[list[BenchmarkTask], list[TrajectoryRecord]]
) -> None:
    tasks, records = mined_run
    result = mine_failures(kind, tasks, records)  # type: ignore[arg-type]
    assert result.skipped == [] and len(result.rows) == 7
    for row in result.rows:
        assert VALIDATORS[kind](row) == []


def test_sft_rows_end_with_the_reference_trajectory(
    mined_run: tuple[list[BenchmarkTask], list[TrajectoryRecord]],
) -> None:
    tasks, records = mined_run
    rows = mine_failures("chat", tasks, records).rows
    by_prompt = {json.dumps(row["messages"][: len(task.messages)]): row for task in tasks for row in rows}
    tool_task = tasks[6]
    row = by_prompt[json.dumps(tool_task.messages)]
    assert row["messages"] == [*tool_task.messages, *tool_task.solution]  # calls, tool results, final answer
    assert row["tools"] == tool_task.tools
    number_task = tasks[1]
    assert by_prompt[json.dumps(number_task.messages)]["messages"][-1] == number_task.solution[-1]


def test_dpo_pairs_prefer_the_reference_where_the_model_left_it(
    mined_run: tuple[list[BenchmarkTask], list[TrajectoryRecord]],
) -> None:
    tasks, records = mined_run
    rows = {json.dumps(row["input"]["messages"][:2]): row for row in mine_failures("preference", tasks, records).rows}
    tool_task = tasks[6]
    # Its first call was right: the pair is at the second turn, after the first call and its result.
    row = rows[json.dumps(tool_task.messages[:2])]
    assert row["input"]["messages"] == [*tool_task.messages, *tool_task.solution[:2]]
    assert row["preferred_output"] == [tool_task.solution[2]]
    assert row["non_preferred_output"] == [
        {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Atlantis"}}'}
    ]
    format_task = tasks[3]
    row = rows[json.dumps(format_task.messages[:2])]
    assert row["preferred_output"] == format_task.solution
    assert row["non_preferred_output"] == [{"role": "assistant", "content": "answer: paris"}]


def test_rl_prompts_carry_reference_environment_and_grader(
    mined_run: tuple[list[BenchmarkTask], list[TrajectoryRecord]],
) -> None:
    tasks, records = mined_run
    rows = {row["id"]: row for row in mine_failures("prompts", tasks, records).rows}
    tool_task = tasks[6]
    row = rows[tool_task.id]
    assert row["messages"] == tool_task.messages and row["reference"] == tool_task.reference
    assert row["environment"] == [entry.model_dump(mode="json") for entry in tool_task.environment]
    assert row["metadata"]["grader"] == {"type": "tool_call", "config": {}}
    assert tasks[0].id not in rows  # passed: not mined


def test_tasks_without_a_usable_reference_are_skipped_with_the_reason() -> None:
    content = "\n".join(
        json.dumps(task)
        for task in [
            {"id": "n", "messages": [{"role": "user", "content": "2+3?"}], "reference": 5},
            {
                "id": "form",
                "messages": [{"role": "user", "content": "Capital of France?"}],
                "reference": "Paris",
                "grader": {"type": "regex", "config": {"pattern": "ANSWER: (\\w+)", "group": 1}},
            },
            {
                "id": "judged",
                "messages": [{"role": "user", "content": "Write a haiku"}],
                "reference": None,
                "grader": {"type": "judge", "config": {"rubric": "Is it a haiku?"}},
            },
        ]
    )
    tasks = parse_benchmark(content, "jsonl", grader={"type": "numeric"}).tasks
    assert reference_continuation(tasks[0])[0] == [{"role": "assistant", "content": "5"}]
    records = run_scripted(tasks, {task.id: ["no idea"] for task in tasks})
    result = mine_failures("chat", tasks, records)
    assert [row["messages"][-1]["content"] for row in result.rows] == ["5"]
    reasons = dict(result.skipped)
    assert "does not pass its grader" in reasons["form"] and "give the task a solution" in reasons["form"]
    assert "reference is not an answer text" in reasons["judged"]
    # Prompts need no reference answer: every failed task gives one.
    assert len(mine_failures("prompts", tasks, records).rows) == 3


def test_a_model_that_followed_the_reference_or_said_nothing_gives_no_pair() -> None:
    task = builtin_tasks()[0]
    silent = run_scripted([task], {task.id: [""]})
    result = mine_failures("preference", [task], silent)
    assert result.rows == [] and "is empty" in result.skipped[0][1]
