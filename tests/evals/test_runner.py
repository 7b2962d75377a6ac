"""The runner: batched turns, multi-step tool use with scripted environments, grading,
and the same runner on the real tiny base through the trainer's sampler.

The first tests drive the loop with a scripted model (a function that returns fixed replies
per task and turn): it makes the loop's behaviour (steps, tool results, limits, errors,
batching) exact and checkable. The last ones run real generation on `tiny-glm-moe`.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from mint.chat.tool_calls import ToolCall, format_tool_calls
from mint.errors import InvalidRequest
from mint.evals.benchmark import BenchmarkTask, parse_benchmark
from mint.evals.builtin import load_builtin
from mint.evals.runner import (
    GenerateRequest,
    Generation,
    SamplerGenerate,
    request_seed,
    run_batch,
    run_tasks,
    summarize,
)

pytestmark = pytest.mark.backend_free


class Scripted:
    """A scripted model: the n-th turn of a task is replies[task][n] (the last reply repeats).

    It records every call, so tests can see how the runner batched the turns.
    """

    def __init__(self, tasks: Sequence[BenchmarkTask], replies: dict[str, list[str]]) -> None:
        self.by_prompt = {json.dumps(task.messages, sort_keys=True): task.id for task in tasks}
        self.lengths = {task.id: len(task.messages) for task in tasks}
        self.replies = replies
        self.calls: list[list[tuple[str, int | None]]] = []

    def task_of(self, request: GenerateRequest) -> str:
        for length in sorted(set(self.lengths.values())):
            found = self.by_prompt.get(json.dumps(list(request.messages[:length]), sort_keys=True))
            if found is not None and self.lengths[found] == length:
                return found
        raise AssertionError("unknown prompt")

    def __call__(self, requests: Sequence[GenerateRequest]) -> list[Generation]:
        batch = []
        out = []
        for request in requests:
            task_id = self.task_of(request)
            batch.append((task_id, request.seed))
            turn = sum(message["role"] == "assistant" for message in request.messages[self.lengths[task_id] :])
            replies = self.replies[task_id]
            text = replies[min(turn, len(replies) - 1)]
            out.append(Generation(text=text, tokens_in=len(request.messages), tokens_out=len(text), latency_ms=2.0))
        self.calls.append(batch)
        return out


def solution_turns(task: BenchmarkTask) -> list[str]:
    assert task.solution is not None
    return [
        message["content"] or format_tool_calls(ToolCall.from_openai(call) for call in message["tool_calls"])
        for message in task.solution
        if message["role"] == "assistant"
    ]


def tool_tasks(n: int = 3) -> list[BenchmarkTask]:
    return [BenchmarkTask.from_builtin(task) for task in load_builtin("tool_calling", "heldout", n, seed=2)]


def test_a_tool_task_runs_call_by_call_through_its_environment() -> None:
    task = tool_tasks(1)[0]
    model = Scripted([task], {task.id: solution_turns(task)})
    [record] = run_tasks([task], model)
    assert record.passed and record.score == 1.0 and record.error is None
    assert record.steps == 3 and len(model.calls) == 3
    added = record.added
    assert [message["role"] for message in added] == ["assistant", "tool", "assistant", "tool", "assistant"]
    # The environment answered each call with its scripted result, which the next turn saw.
    assert added[1]["content"] == task.solution[1]["content"] and added[3]["content"] == task.solution[3]["content"]
    assert record.output == task.solution[-1]["content"]
    assert record.messages[: record.prompt_length] == task.messages
    assert record.tokens_in == 2 + 4 + 6 and record.latency_ms == 6.0
    assert record.tokens_out == sum(len(turn) for turn in solution_turns(task))


def test_wrong_calls_get_error_observations_and_partial_credit() -> None:
    task = tool_tasks(1)[0]
    first = solution_turns(task)[0]
    wrong = '{"name": "delete_everything", "arguments": {}}'
    [record] = run_tasks([task], Scripted([task], {task.id: [first, wrong, "Sorry."]}))
    assert not record.passed and 0 < record.score < 1 and record.steps == 3
    assert "unknown tool 'delete_everything'" in record.added[3]["content"]
    assert "1 of 2 expected calls exact" in record.detail


def test_a_model_that_keeps_calling_tools_stops_at_max_steps() -> None:
    task = tool_tasks(1)[0]
    loop = solution_turns(task)[0]
    [record] = run_tasks([task], Scripted([task], {task.id: [loop]}), max_steps=4)
    assert record.steps == 4 and not record.passed
    assert record.error == "stopped after 4 steps while the model was still calling tools"


def test_tasks_without_tools_end_after_one_turn_even_if_the_text_looks_like_a_call() -> None:
    task = BenchmarkTask.from_builtin(load_builtin("arithmetic", "heldout", 1)[0])
    [record] = run_tasks([task], Scripted([task], {task.id: ['{"name": "calc", "arguments": {}}']}))
    assert record.steps == 1 and len(record.added) == 1 and not record.passed and record.error is None


def test_all_tasks_share_one_generate_call_per_step_and_batching_changes_nothing() -> None:
    tasks = tool_tasks(3) + [BenchmarkTask.from_builtin(t) for t in load_builtin("arithmetic", "heldout", 2)]
    replies = {task.id: solution_turns(task) for task in tasks}
    replies[tasks[1].id] = ["I cannot help."]  # ends at once
    batched_model = Scripted(tasks, replies)
    batched = run_tasks(tasks, batched_model, seed=9)
    # Step 1: all five; step 2: the two tool tasks still calling; step 3: their final answers.
    assert [len(call) for call in batched_model.calls] == [5, 2, 2]
    single_model = Scripted(tasks, replies)
    one_at_a_time = run_tasks(tasks, single_model, seed=9, batch_size=1)
    assert [len(call) for call in single_model.calls] == [1, 1, 1, 1, 1, 1, 1, 1, 1]
    assert one_at_a_time == batched
    # Each task's turns got the same seeds either way: seeds depend on the task and step only.
    assert sorted(seed for call in batched_model.calls for _, seed in call) == sorted(
        seed for call in single_model.calls for _, seed in call
    )
    assert batched_model.calls[0][0] == (tasks[0].id, request_seed(9, tasks[0].id, 0))
    metrics = summarize(batched)
    assert metrics["tasks"] == 5 and metrics["passed"] == 4 and metrics["accuracy"] == 0.8
    assert metrics["mean_steps"] == (3 + 1 + 3 + 1 + 1) / 5


def test_batches_are_reported_as_they_finish() -> None:
    tasks = tool_tasks(3)
    seen: list[list[str]] = []
    run_tasks(
        tasks,
        Scripted(tasks, {task.id: ["no"] for task in tasks}),
        batch_size=2,
        on_batch=lambda records: seen.append([r.task_id for r in records]),
    )
    assert seen == [[tasks[0].id, tasks[1].id], [tasks[2].id]]


def test_generation_and_grading_failures_are_recorded_per_task() -> None:
    content = "\n".join(
        [
            json.dumps({"id": "ok", "messages": [{"role": "user", "content": "1+1?"}], "reference": "2"}),
            json.dumps(
                {
                    "id": "judged",
                    "messages": [{"role": "user", "content": "Poem?"}],
                    "grader": {"type": "judge", "config": {"rubric": "A poem."}},
                }
            ),
        ]
    )
    tasks = parse_benchmark(content, "jsonl", grader={"type": "numeric"}).tasks

    def generate(requests: Sequence[GenerateRequest]) -> list[Generation]:
        return [
            Generation(text="", tokens_in=3000, tokens_out=0, latency_ms=0.5, error="the prompt is too long")
            if request.messages[0]["content"] == "1+1?"
            else Generation(text="Roses.", tokens_in=4, tokens_out=2, latency_ms=1.0)
            for request in requests
        ]

    ok, judged = run_tasks(tasks, generate)
    assert ok.error == "the prompt is too long" and ok.steps == 1 and not ok.passed and ok.added == []
    assert judged.error is not None and judged.error.startswith("grading failed: the judge grader needs a model")
    assert summarize([ok, judged])["errors"] == 2


def test_a_generate_that_drops_requests_is_refused() -> None:
    tasks = tool_tasks(2)
    with pytest.raises(InvalidRequest, match="must answer every request"):
        run_batch(tasks, lambda requests: [])
    with pytest.raises(InvalidRequest, match="max_steps"):
        run_batch(tasks, lambda requests: [], max_steps=0)


# ---- the real tiny base ----------------------------------------------------------------------

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the train extra")


@pytest.fixture(scope="module")
def resident(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """tiny-glm-moe on one torch thread (the machine's cores are shared; results do not depend on it)."""
    import torch

    from mint.config import PROJECT_ROOT
    from mint.schemas.base_models import get_base_model_spec
    from mint.trainer.session import ResidentBase

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    spec = get_base_model_spec("tiny-glm-moe", PROJECT_ROOT / "configs" / "models")
    yield ResidentBase(spec, Path(tmp_path_factory.mktemp("evals-base")))
    torch.set_num_threads(previous)


@needs_torch
@pytest.mark.torch
def test_the_runner_on_the_real_tiny_base(resident: Any) -> None:
    from mint.chat.render import render_prompt

    tasks = [BenchmarkTask.from_builtin(t) for t in load_builtin("arithmetic", "heldout", 2)] + tool_tasks(1)
    generate = SamplerGenerate(resident, max_tokens=6, temperature=0.0)
    batched = run_tasks(tasks, generate, max_steps=2)
    for task, record in zip(tasks, batched, strict=True):
        assert record.task_id == task.id and record.steps >= 1 and record.error is None
        assert record.tokens_in >= len(render_prompt(resident.tokenizer, task.messages, task.tools))
        assert 0 < record.tokens_out <= 6 * record.steps and record.latency_ms > 0
        assert record.added[0]["role"] == "assistant" and record.output == record.added[-1]["content"]
        assert 0.0 <= record.score <= 1.0
    # Greedy decoding: one at a time gives the same turns.
    one_at_a_time = run_tasks(tasks, generate, max_steps=2, batch_size=1)
    assert [r.messages for r in one_at_a_time] == [r.messages for r in batched]


@needs_torch
@pytest.mark.torch
def test_the_sampler_reports_a_prompt_the_base_cannot_take(resident: Any) -> None:
    long = parse_benchmark(
        json.dumps({"id": "long", "messages": [{"role": "user", "content": "word " * 3000}], "reference": "1"}),
        "jsonl",
        grader={"type": "numeric"},
    ).tasks
    [record] = run_tasks(long, SamplerGenerate(resident, max_tokens=4))
    assert record.error is not None and "leaves no room in the context" in record.error
    assert record.tokens_in > 2048 and record.tokens_out == 0 and not record.passed


@needs_torch
@pytest.mark.torch
def test_sampling_under_an_adapter_session(resident: Any) -> None:
    from mint.chat.render import render_chat
    from mint.trainer.types import AdamParams, Datum

    task = BenchmarkTask.from_builtin(load_builtin("arithmetic", "heldout", 1)[0])
    session = resident.create_session()
    try:
        # A few steps towards the reference make the adapter's answer differ from the base's.
        assert task.solution is not None
        tokens, weights = render_chat(resident.tokenizer, [*task.messages, *task.solution])
        datum = Datum(model_input=tokens[:-1], loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights[1:]})
        for _ in range(5):
            session.forward_backward([datum], "cross_entropy")
            session.optim_step(AdamParams(learning_rate=5e-2))
        adapted = run_tasks([task], SamplerGenerate(resident, adapter_name=session.session_id, max_tokens=6))
        base = run_tasks([task], SamplerGenerate(resident, max_tokens=6))
        assert adapted[0].output != base[0].output
    finally:
        resident.close(session.session_id)
