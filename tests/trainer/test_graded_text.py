"""The text that is graded and shown: what the model wrote, without the token or string that
stopped it (`mint.chat.completion_text`), on the real sampler and through an RL job's plan.

A right answer that ends with the base's end-of-sequence token scores full marks under every
grader family an RL job may use, and an eval run gives the same output the same grade. The
answers are scripted (`AnsweringPolicy`): the tiny random base cannot write JSON or a tool
call, and what is under test is how sampled ids become the text a grader reads, whatever
tokens a model picks. The samples are shaped exactly as the resident base's sampler returns
them (the stop token kept, `stop_reason` "stop"), which the first tests check on the real one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from mint.chat.completion_text import completion_text, sampled_text, text_decoder
from mint.chat.render import render_prompt
from mint.evals.benchmark import BenchmarkTask
from mint.evals.graders import Grade, GraderSpec, output_text, register_python_grader
from mint.evals.runner import SamplerGenerate, run_tasks
from mint.schemas.plans import RlPlan
from mint.trainer.methods import METHODS
from mint.trainer.recipes.common import RecipeInputs, StepReport
from mint.trainer.recipes.rl import NoRewardSignal, RlConfig, RlPrompt, run_rl
from mint.trainer.session import ResidentBase
from mint.trainer.types import AdamParams, Datum, ForwardOutput, SampledSequence, SampleRequest, SamplingParams

pytestmark = pytest.mark.backend_free

PLAN_COMMON = {"n_epochs": 1, "learning_rate_multiplier": 1.0, "checkpoint_interval": 1}
TRIAGE = '{"team": "billing", "priority": "low"}'


@register_python_grader("tests.ends_with_reference")
def _ends_with_reference(output: Any, reference: Any, options: Any) -> Grade:
    """A user's grader that reads the raw text: exposed to anything appended to the answer."""
    ends = output_text(output).endswith(str(reference))
    return Grade(score=float(ends), passed=ends, detail="ends with the reference" if ends else "does not")


# family -> (the right answer, the grader, the reference)
FAMILIES: dict[str, tuple[str, dict[str, Any], Any]] = {
    "exact": ("ANSWER: 42", {"type": "exact"}, "ANSWER: 42"),
    "normalized": ("ANSWER: Paris", {"type": "normalized"}, "answer paris"),
    "regex": ("ANSWER: 42", {"type": "regex", "config": {"pattern": r"ANSWER: \d+"}}, None),
    "json_match": (TRIAGE, {"type": "json_match"}, {"team": "billing", "priority": "low"}),
    "numeric": ("The total is 17", {"type": "numeric"}, 17),
    "tool_call": (
        '{"name": "ping", "arguments": {"host": "a"}}',
        {"type": "tool_call"},
        {"name": "ping", "arguments": {"host": "a"}},
    ),
    "python": ("the end", {"type": "python", "config": {"name": "tests.ends_with_reference"}}, "the end"),
    "composite": (
        TRIAGE,
        {
            "type": "composite",
            "config": {
                "parts": [
                    {"weight": 1, "grader": {"type": "regex", "config": {"pattern": r"\{.*\}"}}},
                    {"weight": 1, "grader": {"type": "json_match", "config": {"mode": "subset"}}},
                ]
            },
        },
        {"team": "billing"},
    ),
}


class AnsweringPolicy:
    """Answers every prompt with its scripted text followed by the stop token, as a sampler
    ending on end-of-sequence does; as a sampler of eval runs and as an RL policy alike. Its
    weights never change."""

    version = "scripted"

    def __init__(self, tokenizer: Any, answers: dict[tuple[int, ...], str], stop_token: int) -> None:
        self.tokenizer = tokenizer
        self.answers = {prompt: [*tokenizer.encode(text), stop_token] for prompt, text in answers.items()}

    def _samples(self, request: SampleRequest) -> list[SampledSequence]:
        tokens = self.answers[tuple(request.prompt_tokens)]
        sample = SampledSequence(
            tokens=tokens, logprobs=[-0.1] * len(tokens), stop_reason="stop", adapter_version=self.version
        )
        return [sample] * request.num_samples

    def sample_batch(self, *args: Any) -> list[list[SampledSequence]]:
        """`sample_batch(requests)` as an RL policy, `sample_batch(adapter, requests)` as an eval sampler."""
        return [self._samples(request) for request in args[-1]]

    def check_sample_request(self, request: SampleRequest) -> None:
        return None

    def forward(self, data: Sequence[Datum], loss_fn: str | None = None, loss_fn_config: Any = None) -> ForwardOutput:
        return ForwardOutput(logprobs=[list(datum.loss_fn_inputs["logprobs"]) for datum in data])

    def forward_backward(self, data: Sequence[Datum], loss_fn: str, loss_fn_config: Any = None) -> ForwardOutput:
        return ForwardOutput(logprobs=[list(d.loss_fn_inputs["logprobs"]) for d in data], metrics={"loss:sum": 0.0})

    def optim_step(self, adam: AdamParams | None = None) -> dict[str, float]:
        return {"grad_norm:mean": 0.0}


def _messages(family: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Answer the {family} task."}]


# ---- the real sampler's samples --------------------------------------------------------------


def test_a_sample_ended_by_an_ordinary_token_reads_without_it(resident: ResidentBase) -> None:
    """A base whose end-of-sequence is an ordinary token: the real sampler, asked to stop on the
    third token its greedy answer would write, ends with that token; the text leaves it out,
    where dropping special tokens alone would keep it."""
    tokenizer = resident.tokenizer
    prompt = render_prompt(tokenizer, _messages("ordinary"))
    (free,) = resident.sample(prompt, SamplingParams(max_tokens=8, temperature=0.0))
    stop_at = next(index for index, token in enumerate(free.tokens) if index >= 2 and token not in free.tokens[:index])
    (stopped,) = resident.sample(prompt, SamplingParams(max_tokens=8, temperature=0.0, stop=[free.tokens[stop_at]]))
    assert stopped.stop_reason == "stop" and stopped.tokens == free.tokens[: stop_at + 1]
    decode = text_decoder(tokenizer)
    assert sampled_text(tokenizer, stopped) == decode(free.tokens[:stop_at])
    assert sampled_text(tokenizer, stopped) != decode(stopped.tokens)
    assert sampled_text(tokenizer, free) == decode(free.tokens)  # ran out of tokens: all of it is text


def test_a_sample_cut_by_a_stop_string_ends_before_it(resident: ResidentBase) -> None:
    tokenizer = resident.tokenizer
    prompt = render_prompt(tokenizer, _messages("string"))
    (free,) = resident.sample(prompt, SamplingParams(max_tokens=12, temperature=0.0))
    text = text_decoder(tokenizer)(free.tokens)
    stop = next(
        text[i : i + 2]
        for i in range(3, len(text) - 1)
        if text[i : i + 2].strip() and text[i : i + 2] not in text[: i + 1]
    )
    (stopped,) = resident.sample(prompt, SamplingParams(max_tokens=12, temperature=0.0, stop=[stop]))
    assert stopped.stop_reason == "stop"
    assert sampled_text(tokenizer, stopped, stops=[stop]) == text[: text.index(stop)]


def test_the_end_of_sequence_token_is_never_part_of_the_text(resident: ResidentBase) -> None:
    tokenizer = resident.tokenizer
    eos = tokenizer.eos_token_id
    tokens = [*tokenizer.encode(TRIAGE), eos]
    assert "<|im_end|>" in tokenizer.decode(tokens)  # what grading with a plain decode read
    assert completion_text(tokens, text_decoder(tokenizer), stopped=True) == TRIAGE
    # A special token that did not stop the sample is dropped by the decoder too.
    assert completion_text(tokens, text_decoder(tokenizer), stopped=False) == TRIAGE


# ---- every grader family, through an RL job's plan and an eval run ---------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_right_answer_ending_with_eos_earns_full_marks_in_rl_and_in_an_eval(
    resident: ResidentBase, family: str
) -> None:
    tokenizer = resident.tokenizer
    answer, grader, reference = FAMILIES[family]
    messages = _messages(family)
    policy = AnsweringPolicy(tokenizer, {tuple(render_prompt(tokenizer, messages)): answer}, tokenizer.eos_token_id)
    plan = RlPlan(
        steps=1,
        batch_size=1,
        learning_rate=1e-3,
        group_size=2,
        max_tokens=32,
        temperature=1.0,
        kl_beta=0.0,
        grader=grader,  # type: ignore[arg-type]
        max_steps_without_signal=2,
        **PLAN_COMMON,  # type: ignore[arg-type]
    )
    seen: list[StepReport] = []
    inputs = RecipeInputs(
        training=policy,  # type: ignore[arg-type]
        tokenizer=tokenizer,
        reference=policy,
        rows=[{"messages": messages, "reference": reference}],
        seed=0,
        on_step=seen.append,
        grader_for=GraderSpec.model_validate,
    )
    (report,) = METHODS.run(plan, inputs)
    assert report.metrics["reward"] == 1.0, report.samples
    # The step shows what it graded: the answer as written, its reward and the reference.
    assert seen[0].samples[0]["text"] == answer and seen[0].samples[0]["reward"] == 1.0
    assert "<|im_end|>" not in str(seen[0].samples)

    task = BenchmarkTask(id=family, messages=messages, reference=reference, grader=GraderSpec.model_validate(grader))
    (record,) = run_tasks([task], SamplerGenerate(policy, max_tokens=32))  # type: ignore[arg-type]
    assert record.output == answer and record.score == report.metrics["reward"]


def test_the_no_signal_stop_quotes_what_the_grader_was_given(resident: ResidentBase) -> None:
    """Every sample is valid text but not JSON: the stop says what the outputs read like and
    why the grader refused them, instead of blaming the model in general."""
    tokenizer = resident.tokenizer
    messages = _messages("prose")
    prompt = render_prompt(tokenizer, messages)
    policy = AnsweringPolicy(tokenizer, {tuple(prompt): "The team is billing."}, tokenizer.eos_token_id)
    grader = GraderSpec(type="json_match")
    with pytest.raises(NoRewardSignal) as stopped:
        run_rl(
            policy,  # type: ignore[arg-type]
            [RlPrompt(prompt, {"team": "billing"}, grader)],
            RlConfig(steps=3, prompts_per_step=1, group_size=2, max_steps_without_signal=2),
            tokenizer=tokenizer,
        )
    message = stopped.value.message
    assert "every sample scored 0; the graded outputs read like: 'The team is billing.'" in message, message
    assert "not JSON" in message, message
