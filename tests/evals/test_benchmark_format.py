"""Benchmark files: JSONL and YAML read into the same tasks, one canonical form and hash, and
every problem reported at once with its line, task and field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mint.errors import InvalidRequest
from mint.evals.benchmark import (
    BenchmarkTask,
    build_benchmark,
    canonical_jsonl,
    content_hash,
    load_canonical,
    parse_benchmark,
    select_split,
)
from mint.evals.builtin import load_builtin

pytestmark = pytest.mark.backend_free

TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup_order", "parameters": {"type": "object", "properties": {}}},
    }
]
ENVIRONMENT = [{"name": "lookup_order", "arguments": {"order_id": "A1"}, "result": {"status": "shipped"}}]


def arithmetic(task_id: str, question: str, answer: str, **extra: Any) -> dict[str, Any]:
    return {"id": task_id, "messages": [{"role": "user", "content": question}], "reference": answer, **extra}


TASKS = [
    arithmetic("add", "What is 2 + 3?", "5", split="train"),
    arithmetic("mul", "What is 4 * 6?", "24", split="heldout", metadata={"level": 1}),
    {
        "id": "order",
        "messages": [{"role": "user", "content": "Where is order A1?"}],
        "tools": TOOLS,
        "environment": ENVIRONMENT,
        "reference": [{"name": "lookup_order", "arguments": {"order_id": "A1"}}],
        "grader": {"type": "tool_call"},
        "split": "heldout",
        "solution": [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'},
            {"role": "assistant", "content": "It has shipped."},
        ],
    },
]
NUMERIC = {"type": "numeric"}


def jsonl(rows: list[Any]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def problems(content: str, format: str = "jsonl", **kwargs: Any) -> str:
    with pytest.raises(InvalidRequest) as caught:
        parse_benchmark(content, format, **kwargs)  # type: ignore[arg-type]
    assert caught.value.param == "content" or caught.value.param == "format"
    assert "nothing was stored" in caught.value.message or caught.value.param == "format"
    return caught.value.message


def test_jsonl_and_yaml_give_the_same_tasks_and_hash() -> None:
    from_jsonl = parse_benchmark(jsonl(TASKS), "jsonl", grader=NUMERIC)
    yaml_text = "grader: {type: numeric}\ndescription: sums and orders\ntasks:\n" + "".join(
        f"  - {json.dumps(task)}\n" for task in TASKS
    )
    from_yaml = parse_benchmark(yaml_text, "yaml")
    assert from_yaml.tasks == from_jsonl.tasks and from_yaml.description == "sums and orders"
    assert [task.id for task in from_jsonl.tasks] == ["add", "mul", "order"]
    assert from_jsonl.tasks[0].grader.type == "numeric" and from_jsonl.tasks[2].grader.type == "tool_call"
    assert from_jsonl.splits == {"heldout": 2, "train": 1}
    assert [task.id for task in select_split(from_jsonl.tasks, "heldout")] == ["mul", "order"]
    assert content_hash(from_jsonl.tasks) == content_hash(from_yaml.tasks)
    # The canonical form ignores key order and spacing, and reads back to the same tasks.
    shuffled = "\n".join(json.dumps(dict(reversed(task.items())), indent=None) for task in TASKS)
    assert content_hash(parse_benchmark(shuffled, "jsonl", grader=NUMERIC).tasks) == content_hash(from_jsonl.tasks)
    assert load_canonical(canonical_jsonl(from_jsonl.tasks)) == from_jsonl.tasks
    # Any change of content is another hash.
    changed = [*TASKS[:2], {**TASKS[2], "split": "train"}]
    assert content_hash(parse_benchmark(jsonl(changed), "jsonl", grader=NUMERIC).tasks) != content_hash(
        from_jsonl.tasks
    )


def test_a_yaml_list_of_tasks_and_yaml_values_that_are_not_json() -> None:
    parsed = parse_benchmark(
        "- id: when\n  messages: [{role: user, content: 'Date?'}]\n  reference: 2024-01-01\n",
        "yaml",
        grader={"type": "exact"},
    )
    assert parsed.tasks[0].reference == "2024-01-01"  # a date-like value stays text
    message = problems(
        "grader: {type: numeric}\ntasks:\n"
        "  - &x {id: a, messages: [{role: user, content: hi}], reference: 1}\n"
        "  - *x\n",
        "yaml",
    )
    assert "line 4" in message and "aliases" in message
    message = problems(
        "tasks:\n  - id: a\n    messages: [{role: user, content: hi}]\n    reference: .nan\n", "yaml", grader=NUMERIC
    )
    assert "line 2 (task 'a'): reference:" in message


def test_every_problem_names_its_line_task_and_field() -> None:
    rows = [
        jsonl([TASKS[0]]).strip(),
        '{"id": "broken", ',
        json.dumps(arithmetic("role", "hi", "1") | {"messages": [{"role": "usr", "content": "hi"}]}),
        json.dumps(arithmetic("add", "again", "5")),
        json.dumps(arithmetic("word", "What is 2 + 2?", "four")),
        json.dumps(arithmetic("wrong", "What is 2 + 2?", "4", solution=[{"role": "assistant", "content": "5"}])),
        json.dumps(
            {**TASKS[2], "id": "tools", "environment": [{"name": "cancel_order", "arguments": {}, "result": 1}]}
        ),
        json.dumps(arithmetic("grader", "hi", "1", grader={"type": "numeric", "config": {"tolerance": 0}})),
        json.dumps(arithmetic("kind", "hi", "1", grader={"type": "telepathy"})),
        json.dumps(arithmetic("extra", "hi", "1", colour="blue")),
        json.dumps({"messages": [{"role": "user", "content": "no id"}], "reference": "1"}),
        json.dumps(["not", "an", "object"]),
    ]
    message = problems("\n".join(rows), grader=NUMERIC)
    assert message.startswith("the benchmark has 11 problems")
    for expected in (
        "line 2: not valid JSON",
        "line 3 (task 'role'): messages[0].role: must be one of system, user, assistant, tool",
        "line 4 (task 'add'): id: is already used at line 1",
        "line 5 (task 'word'): reference: the numeric grader needs a finite number",
        "line 6 (task 'wrong'): solution: does not pass the task's own grader",
        "line 7 (task 'tools'): environment[0].name: 'cancel_order' is not one of the task's tools (lookup_order)",
        "line 8 (task 'grader'): grader: config.tolerance: is not an option here; the options are: rel_tol, abs_tol",
        "line 9 (task 'kind'): grader: unknown grader type 'telepathy'",
        "line 10 (task 'extra'): colour: unknown field",
        "line 11: id: is required",
        "line 12: a task must be an object",
    ):
        assert expected in message, expected


def test_a_solution_is_checked_as_the_continuation_of_the_messages() -> None:
    bad = {**TASKS[2], "solution": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}
    message = problems(jsonl([bad]), grader=NUMERIC)
    assert "solution[0].tool_call_id: 'nope' answers no earlier tool call" in message


def test_graders_come_from_the_task_the_request_or_the_file_once() -> None:
    message = problems(jsonl([arithmetic("a", "hi", "1")]))
    assert "line 1 (task 'a'): grader: no grader" in message
    message = problems("grader: {type: exact}\ntasks: []\n", "yaml", grader=NUMERIC)
    assert "grader: is given both in the request and in the YAML file" in message
    message = problems(jsonl([TASKS[0]]), grader={"type": "numeric", "config": {"rel": 1}})
    assert (
        message.startswith("the benchmark has 1 problem")
        and "the benchmark: grader: config.rel: is not an option" in message
    )


@pytest.mark.parametrize(
    ("content", "format", "expected"),
    [
        ("", "jsonl", "content: holds no tasks"),
        ("\n\n", "jsonl", "content: holds no tasks"),
        ("tasks: 3\n", "yaml", "tasks: is required"),
        ("just text", "yaml", "a YAML benchmark is a list of tasks"),
        ("tasks: [\n", "yaml", "not valid YAML"),
        ("tasks:\x96\n", "yaml", "not valid YAML (special characters are not allowed: U+0096)"),
        ("shots: 3\ntasks: []\n", "yaml", "shots: unknown top-level field"),
    ],
)
def test_empty_and_malformed_files(content: str, format: str, expected: str) -> None:
    assert expected in problems(content, format, grader=NUMERIC)


def test_unknown_format() -> None:
    with pytest.raises(InvalidRequest, match="format must be one of jsonl, yaml"):
        parse_benchmark("", "csv")  # type: ignore[arg-type]


def test_builtin_tasks_join_uploaded_ones_and_keep_their_splits_and_solutions() -> None:
    builtin = [BenchmarkTask.from_builtin(task) for task in load_builtin("tool_calling", "heldout", 3)]
    parsed = parse_benchmark(jsonl(TASKS[:1]), "jsonl", grader=NUMERIC, extra_tasks=builtin)
    assert len(parsed.tasks) == 4 and parsed.splits == {"heldout": 3, "train": 1}
    assert all(task.solution and task.grade(task.solution).passed for task in parsed.tasks[1:])
    assert load_canonical(canonical_jsonl(parsed.tasks)) == parsed.tasks
    with pytest.raises(InvalidRequest, match="is already used"):
        build_benchmark(builtin + builtin[:1])
