"""The recipes on real models at tiny scale: mechanics on tiny-glm-moe (LoRA on attention,
MLPs and the fused experts), and learning on the project's own synthetic tasks with held-out
splits and fixed seeds. Margins are wide: on one machine the runs are deterministic, and the
gaps measured are far larger than the thresholds."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mint.chat.render import PreferencePair, render_chat, render_preference, render_prompt
from mint.errors import InvalidRequest
from mint.evals.builtin import Task, load_builtin
from mint.evals.graders import GraderSpec
from mint.schemas.plans import PLAN_TYPES, DpoPlan, RlPlan, SftPlan
from mint.trainer.full import FullParameterTrainer
from mint.trainer.methods import METHODS, MethodRegistry
from mint.trainer.recipes.common import RecipeInputs, StepReport
from mint.trainer.recipes.dpo import DpoConfig, preference_accuracy, run_dpo, run_dpo_plan
from mint.trainer.recipes.rl import (
    NoRewardSignal,
    RlConfig,
    RlPrompt,
    clip_fraction,
    completion_datum,
    group_advantages,
    kl_to_base,
    run_rl,
)
from mint.trainer.recipes.sft import SftConfig, run_sft, run_sft_plan
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import LoraOptions, SampledSequence, SampleRequest, SamplingParams

pytestmark = pytest.mark.backend_free


def format_examples(resident: ResidentBase, split: str, n: int) -> list:  # type: ignore[type-arg]
    tasks = load_builtin("format", split, n, seed=0)  # type: ignore[arg-type]
    return [render_chat(resident.tokenizer, [*task.messages, *(task.solution or [])]) for task in tasks]


def format_pairs(resident: ResidentBase, split: str, n: int) -> list[PreferencePair]:
    """Preferred: the task's own answer in its strict format; rejected: the bare word."""
    pairs = []
    for task in load_builtin("format", split, n, seed=0):  # type: ignore[arg-type]
        answer = (task.solution or [])[0]["content"]
        bare = answer.split(":", 1)[-1].strip().lower() if answer.startswith("ANSWER") else "I am not sure."
        row = {
            "input": {"messages": task.messages},
            "preferred_output": [{"role": "assistant", "content": answer}],
            "non_preferred_output": [{"role": "assistant", "content": bare}],
        }
        pairs.append(render_preference(resident.tokenizer, row))
    return pairs


def weights_of(session: TrainingSession) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in session.named_parameters().items()}


def test_sft_lowers_the_loss_on_assistant_tokens(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    session = open_session(LoraOptions(seed=0))
    reports = run_sft(
        session, format_examples(resident, "train", 16), SftConfig(steps=6, batch_size=8, learning_rate=3e-3)
    )
    losses = [report.metrics["loss"] for report in reports]
    assert [report.step for report in reports] == list(range(1, 7))
    assert losses[-1] < losses[0] - 2.0, losses  # nats per assistant token
    assert all(report.metrics["trained_tokens"] < report.metrics["tokens"] for report in reports)


def test_sft_resumed_from_a_checkpoint_matches_a_straight_run(
    open_session: Callable[..., TrainingSession], resident: ResidentBase, tmp_path: Path
) -> None:
    examples = format_examples(resident, "train", 12)
    config = SftConfig(steps=4, batch_size=4, learning_rate=2e-3, seed=3)
    straight = open_session(LoraOptions(seed=1))
    run_sft(straight, examples, config)

    first = open_session(LoraOptions(seed=1))
    run_sft(first, examples, SftConfig(**{**config.__dict__, "steps": 4}), on_step=lambda report: report.step < 2)
    assert first.step == 2
    first.save_state(tmp_path / "step-2")
    resumed = resident.create_session_from_state(tmp_path / "step-2")
    run_sft(resumed, examples, config, start_step=2)
    assert resumed.step == 4
    expected, got = weights_of(straight), weights_of(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-6, rtol=0)


def test_full_parameter_sft_trains_every_weight(spec, base_cache: Path, resident: ResidentBase) -> None:  # type: ignore[no-untyped-def]
    trainer = FullParameterTrainer(spec, base_cache)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    reports = run_sft(
        trainer, format_examples(resident, "train", 8), SftConfig(steps=3, batch_size=4, learning_rate=1e-3)
    )
    assert reports[-1].metrics["loss"] < reports[0].metrics["loss"]
    changed = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    assert "model.embed_tokens.weight" in changed and any(".mlp.experts." in name for name in changed)
    assert any("self_attn.q_proj" in name for name in changed)


def test_dpo_raises_heldout_preference_accuracy(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    session = open_session(LoraOptions(seed=0))
    heldout = format_pairs(resident, "heldout", 16)
    before = preference_accuracy(session, heldout)
    assert before["accuracy"] == 0.0 and before["margin"] == 0.0  # the adapter starts as the reference
    reports = run_dpo(
        session, format_pairs(resident, "train", 32), DpoConfig(steps=8, pairs_per_step=4, learning_rate=2e-3)
    )
    after = preference_accuracy(session, heldout)
    assert after["accuracy"] >= 0.8, (reports[-1].metrics, after)
    assert after["margin"] > 0.5


def test_group_advantages_are_normalised_and_empty_without_signal() -> None:
    advantages = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert advantages == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]


def test_kl_penalty_lowers_the_advantage_of_tokens_the_base_finds_unlikely(resident: ResidentBase) -> None:
    prompt = render_prompt(resident.tokenizer, [{"role": "user", "content": "hi"}])
    sample = resident.sample(prompt, SamplingParams(max_tokens=3, seed=0))[0]
    # Pretend the policy gave its tokens higher logprobs than the base does.
    boosted = SampledSequence(tokens=sample.tokens, logprobs=[lp + 1.0 for lp in sample.logprobs], stop_reason="length")
    datum = completion_datum(prompt, boosted, advantage=1.0)
    (penalised,), kl = kl_to_base([datum], resident, kl_beta=0.5)
    assert kl == pytest.approx(1.0, abs=1e-3)
    completion = penalised.loss_fn_inputs["advantages"][len(prompt) - 1 :]
    assert completion == pytest.approx([0.5] * len(sample.tokens), abs=1e-3)


def test_rl_raises_mean_reward(smollm2: ResidentBase) -> None:
    """Reward: the completion (one token) starts with a capital letter (the closed `regex`
    grader), which SmolLM2 does about half the time on these prompts; group-normalised RL
    raises it to nearly always within a few steps (measured: 0.56 at the first step, 1.0 from
    the second on). A real base, because on a random one (tiny-glm-moe) tokens that begin with
    a capital share no feature: rewarding the few sampled ones leaves the class's mass where it
    was until the policy collapses onto one token, capital or not, as the seed and the
    machine's rounding decide."""
    grader = GraderSpec(type="regex", config={"pattern": "^[A-Z]", "mode": "search"})
    tasks: list[Task] = load_builtin("format", "train", 16, seed=0)
    prompts = [RlPrompt(render_prompt(smollm2.tokenizer, task.messages), None, grader) for task in tasks]
    session = smollm2.create_session(LoraOptions(seed=0))
    try:
        reports = run_rl(
            session,
            prompts,
            RlConfig(
                steps=6, prompts_per_step=4, group_size=8, max_tokens=1, learning_rate=1e-2, max_steps_without_signal=6
            ),
            tokenizer=smollm2.tokenizer,
        )
    finally:
        smollm2.close(session.session_id)
    rewards = [report.metrics["reward"] for report in reports]
    first, late = rewards[0], sum(rewards[-3:]) / 3
    assert late > first + 0.3 and late > 0.9, rewards


def test_each_rl_step_reports_what_shows_whether_it_can_learn(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    grader = GraderSpec(type="regex", config={"pattern": "^[A-Z]", "mode": "search"})
    tasks: list[Task] = load_builtin("format", "train", 8, seed=0)
    prompts = [RlPrompt(render_prompt(resident.tokenizer, task.messages), None, grader) for task in tasks]
    reports = run_rl(
        open_session(LoraOptions(seed=0)),
        prompts,
        RlConfig(steps=2, prompts_per_step=4, group_size=8, max_tokens=3, learning_rate=5e-3),
        tokenizer=resident.tokenizer,
        reference=resident,
    )
    for report in reports:
        metrics = report.metrics
        assert {"reward", "reward_std", "groups_with_signal", "kl", "entropy", "clip_fraction", "tokens"} <= set(
            metrics
        ), metrics
        assert 0 < metrics["groups_with_signal"] <= 1 and metrics["reward_std"] > 0
        assert metrics["tokens"] == 4 * 8 * 3  # prompts x group x max_tokens: the tiny base never stops early
        assert metrics["entropy"] > 0 and 0 <= metrics["clip_fraction"] <= 1
    # The first step samples from the very weights it trains: on-policy, no ratio leaves the band.
    assert reports[0].metrics["clip_fraction"] == 0.0
    assert abs(reports[0].metrics["kl"]) < 1e-4  # a fresh adapter (B = 0) is the base


def test_clip_fraction_counts_tokens_whose_ratio_left_the_band() -> None:
    sample = SampledSequence(tokens=[5, 6, 7, 8], logprobs=[-1.0, -1.0, -1.0, -1.0], stop_reason="length")
    datum = completion_datum([1, 2], sample, advantage=1.0)
    # Positions: one prompt position, then the four sampled tokens; ratios 1, e^0.1, e^0.5, e^-0.5.
    trained = [[0.0, -1.0, -0.9, -0.5, -1.5]]
    assert clip_fraction([datum], trained) == pytest.approx(0.5)


def test_rl_without_reward_signal_stops_and_says_what_to_do(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    """A grader the tiny base never satisfies: every group's rewards are all 0, so there is no
    signal; after `max_steps_without_signal` such steps the run stops, each step reported."""
    grader = GraderSpec(type="exact", config={})
    tasks: list[Task] = load_builtin("format", "train", 8, seed=0)
    prompts = [
        RlPrompt(render_prompt(resident.tokenizer, task.messages), "no sample says this", grader) for task in tasks
    ]
    seen: list[StepReport] = []
    with pytest.raises(NoRewardSignal) as stopped:
        run_rl(
            open_session(LoraOptions(seed=0)),
            prompts,
            RlConfig(steps=20, prompts_per_step=2, group_size=4, max_tokens=2, max_steps_without_signal=3),
            tokenizer=resident.tokenizer,
            on_step=seen.append,
        )
    assert [report.step for report in seen] == [1, 2, 3]
    assert all(r.metrics["groups_with_signal"] == 0 and r.metrics["reward"] == 0 for r in seen)
    message = stopped.value.message
    assert stopped.value.type == "no_reward_signal"
    assert message.startswith("no reward signal for 3 steps in a row: every sample scored 0"), message
    assert "Warm-start" in message and "partial credit" in message and "group_size or temperature" in message


class RecordingGrader:
    """The job's grader (a real `GraderSpec`), remembering the steps and tokens each reward was given."""

    def __init__(self, spec: GraderSpec) -> None:
        self.spec = spec
        self.seen: list[tuple[int, int, float]] = []

    def reward(self, output: str, reference: object, *, steps: int = 1, tokens: int = 0) -> float:
        reward = self.spec.reward(output, reference, steps=steps, tokens=tokens)
        self.seen.append((steps, tokens, reward))
        return reward


def test_rl_rewards_pay_the_token_penalty_of_each_sample(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    """Every sample passes the grader (any text matches), so its reward is 1 less 0.01 per token
    beyond the first: the recipe hands the grader each sample's own token count."""
    spec = GraderSpec(
        type="regex",
        config={"pattern": ".*", "dotall": True},
        penalties={"token": 0.01, "free_tokens": 1},
    )
    grader = RecordingGrader(spec)
    tasks: list[Task] = load_builtin("format", "train", 2, seed=0)
    prompts = [RlPrompt(render_prompt(resident.tokenizer, task.messages), None, grader) for task in tasks]
    (report,) = run_rl(
        open_session(LoraOptions(seed=0)),
        prompts,
        RlConfig(steps=1, prompts_per_step=2, group_size=4, max_tokens=6),
        tokenizer=resident.tokenizer,
    )
    assert len(grader.seen) == 8 and all(steps == 1 and 1 <= tokens <= 6 for steps, tokens, _ in grader.seen)
    assert [reward for _, _, reward in grader.seen] == pytest.approx(
        [1.0 - 0.01 * (tokens - 1) for _, tokens, _ in grader.seen]
    )
    assert report.metrics["reward"] == pytest.approx(sum(reward for *_, reward in grader.seen) / 8)


class ParityGrader:
    """A reward with variance on any base, even an untrained tiny one: the parity of the text's code points."""

    def reward(self, text: str, reference: object, *, steps: int = 1, tokens: int = 0) -> float:
        return float(sum(map(ord, text)) % 2)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "cispo", "dro", "gspo", "stable_reinforce"])
def test_rl_trains_with_every_policy_loss(
    open_session: Callable[..., TrainingSession], resident: ResidentBase, loss_fn: str
) -> None:
    """Each loss a job can name runs the recipe's steps and moves the weights; stable_reinforce
    reads the logprobs the session's sampler recorded."""
    grader = ParityGrader()
    tasks: list[Task] = load_builtin("format", "train", 4, seed=0)
    prompts = [RlPrompt(render_prompt(resident.tokenizer, task.messages), None, grader) for task in tasks]
    session = open_session(LoraOptions(seed=0))
    reports = run_rl(
        session,
        prompts,
        RlConfig(steps=2, prompts_per_step=2, group_size=4, max_tokens=3, learning_rate=5e-3, loss_fn=loss_fn),
        tokenizer=resident.tokenizer,
    )
    trained = [report for report in reports if "loss" in report.metrics]
    assert trained and all(report.metrics["grad_norm"] > 0 for report in trained)


def test_the_method_registry_is_closed_and_covers_every_plan() -> None:
    assert sorted(METHODS.names()) == sorted(PLAN_TYPES)
    assert all(METHODS.get(name).plan_type is PLAN_TYPES[name] for name in PLAN_TYPES)
    registry = MethodRegistry()
    registry.register("sft", SftPlan, run_sft_plan)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("sft", SftPlan, run_sft_plan)
    with pytest.raises(ValueError, match="runs DpoPlan"):
        registry.register("dpo", SftPlan, run_sft_plan)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mint.schemas.plans"):
        registry.register("ppo", DpoPlan, run_dpo_plan)


PLAN_COMMON = {"n_epochs": 1, "learning_rate_multiplier": 1.0, "checkpoint_interval": 1}


def test_jobs_plans_run_through_the_registry(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    """The runners a job reaches: rows rendered with the base's template, the plan's numbers
    in the recipe's config, and (RL with kl_beta > 0) the base as the reference."""
    tasks = load_builtin("format", "train", 4, seed=0)  # type: ignore[arg-type]
    chat = [{"messages": [*task.messages, *(task.solution or [])]} for task in tasks]
    prompts = [{"messages": task.messages, "reference": "x"} for task in tasks]
    seen: list[int] = []

    def record(report: StepReport) -> bool:
        seen.append(report.step)
        return True

    for plan, rows in [
        (SftPlan(steps=2, batch_size=2, learning_rate=1e-3, **PLAN_COMMON), chat),
        (
            RlPlan(
                steps=2,
                batch_size=2,
                learning_rate=1e-3,
                group_size=2,
                max_tokens=2,
                temperature=1.0,
                kl_beta=0.1,
                grader={"type": "exact"},  # type: ignore[arg-type]
                **PLAN_COMMON,
            ),
            prompts,
        ),
    ]:
        session = open_session(LoraOptions(seed=0))
        inputs = RecipeInputs(
            training=session,
            tokenizer=resident.tokenizer,
            reference=resident,
            rows=rows,
            seed=1,
            start_step=1,
            on_step=record,
            grader_for=GraderSpec.model_validate,
        )
        reports = METHODS.run(plan, inputs)
        assert [report.step for report in reports] == [2] and session.step == 1
    assert seen == [2, 2]


def test_a_row_the_template_refuses_names_its_line(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    rows = [good, {"messages": [{"role": "robot", "content": "hi"}]}]
    inputs = RecipeInputs(
        training=open_session(LoraOptions(seed=0)), tokenizer=resident.tokenizer, reference=resident, rows=rows, seed=0
    )
    with pytest.raises(InvalidRequest, match="^line 2: messages"):
        METHODS.run(SftPlan(steps=1, batch_size=1, learning_rate=1e-3, **PLAN_COMMON), inputs)


@pytest.mark.slow
def test_sft_raises_heldout_exact_match_of_a_real_model(smollm2: ResidentBase) -> None:
    """SmolLM2-135M-Instruct on the built-in strict-format task: 0 of 16 held-out answers in
    the format before, about a third after 8 SFT steps of 8 examples (LoRA r16)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    base = smollm2
    session = base.create_session(LoraOptions(seed=0))
    try:
        heldout = load_builtin("format", "heldout", 16, seed=0)

        def exact_match() -> float:
            # Every held-out prompt in one batched decode, as an eval run samples them.
            greedy = SamplingParams(max_tokens=12, temperature=0.0)
            requests = [SampleRequest(render_prompt(base.tokenizer, task.messages), greedy, 1) for task in heldout]
            samples = [sample for (sample,) in session.sample_batch(requests)]
            passed = sum(
                task.grade(base.tokenizer.decode(sample.tokens, skip_special_tokens=True)).passed
                for task, sample in zip(heldout, samples, strict=True)
            )
            return passed / len(heldout)

        before = exact_match()
        train = [
            render_chat(base.tokenizer, [*t.messages, *(t.solution or [])])
            for t in load_builtin("format", "train", 64, seed=0)
        ]
        run_sft(session, train, SftConfig(steps=8, batch_size=8, learning_rate=4e-4))
        after = exact_match()
    finally:
        base.close(session.session_id)
        torch.set_num_threads(threads)
    assert before <= 1 / 16 and after >= 4 / 16, (before, after)
