"""Reinforcement learning in the GRPO style: groups of samples per prompt, rewards from the
closed grader registry, group-normalised advantages, a policy-gradient loss of the registry
(`importance_sampling` by default; `ppo`, `cispo`, `dro`, `gspo`, `stable_reinforce`), and an
optional KL penalty towards the base.

    run_rl(session, prompts, RlConfig(steps=10, group_size=8), tokenizer=tokenizer)

A prompt with an environment (`RlPrompt.environment`: a benchmark's scripted tools, or a
Python environment registered by name) makes each sample an episode of several turns
(`mint.trainer.episodes`): the policy's sampled ids, then the environment's observation as
the chat template's delta, and so on, trained as one sequence of the exact ids sampled, with
the advantage on the sampled tokens only. Its reward is what the environment gave over the
episode plus the grader's score of the messages it added (either may be absent).

Each step, for each of `prompts_per_step` prompts: sample `group_size` completions with the
session itself (its logprobs are computed exactly as `forward` computes them, so the
importance ratio starts at 1; all groups of a step decode as one batch per turn), grade each
with the prompt's grader (the same graders that score benchmarks, reading the completion's
text as `mint.chat.completion_text` gives it: without the stop token), and give every token of a
completion the advantage (reward - group mean) / (group std + eps). A group whose rewards are
all equal carries no signal and is left out. With `kl_beta > 0`, each token's advantage is lowered by
kl_beta * (logp_sample - logp_base), which keeps the policy near the base. A fine-tuning job
runs it from its `RlPlan` through `run_rl_plan`.

Every step reports what shows whether RL can learn: the reward's mean and spread, the share of
groups with signal, KL to the base, the sampler's entropy, the share of tokens whose importance
ratio left the clip band, and the tokens sampled. RL without signal does not learn: after
`max_steps_without_signal` steps in a row where no group had signal, the run stops with
`NoRewardSignal`, which says what to change, instead of "succeeding" with an unchanged adapter.

With `max_steps_off_policy = k > 0` (asynchronous RL), a copy of the policy samples up to k steps
ahead while the policy trains, its weights refreshed in memory; every sample's adapter version
is checked to be at most k updates old (`mint.trainer.recipes.rollout_sources`), and the
`off_policy_steps` metric reports the mean staleness.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from mint.chat.completion_text import sampled_text
from mint.chat.render import render_prompt
from mint.errors import InvalidRequest, MintError
from mint.schemas.plans import DEFAULT_MAX_TURNS, RlPlan
from mint.trainer.data import batch_plan, mean_over_tokens
from mint.trainer.episodes import Env, Episode, EpisodeGroups, EpisodeLimits, Turn, play
from mint.trainer.recipes.common import (
    DEFAULT_RL_MAX_STEPS_WITHOUT_SIGNAL,
    Grader,
    OnStep,
    RecipeInputs,
    Scorer,
    StepReport,
    Trainer,
    keep_going,
    render_rows,
)
from mint.trainer.recipes.graded_samples import (
    GradedSample,
    describe_outputs,
    explain,
    graded_text,
    shown_indices,
)
from mint.trainer.recipes.rollout_sources import PolicyVersions, RolloutSource, StaleSampler, rollout_source
from mint.trainer.types import AdamParams, Datum, SampledSequence, SampleRequest, close_environment

__all__ = ["NoRewardSignal", "RlConfig", "RlPrompt", "StaleSampler", "run_rl", "run_rl_plan"]

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ADVANTAGE_EPS = 1e-6
# A token's importance ratio exp(logp_train - logp_sample) outside [1 - CLIP_BAND, 1 + CLIP_BAND]
# counts in `clip_fraction` (PPO's default band): how far the sampler and the trainer disagree.
CLIP_BAND = 0.2


class NoRewardSignal(MintError):
    """An RL run whose groups carried no reward signal for too many steps in a row."""

    type = "no_reward_signal"


@dataclass(frozen=True)
class RlPrompt:
    """A prompt (already rendered with the chat template), its reference and its grader; with
    an `environment` (what makes a fresh one per episode), each sample is a multi-turn episode
    that starts from the environment's initial observation."""

    prompt_tokens: list[int]
    reference: Any
    grader: Grader | None
    environment: Callable[[], Env] | None = None


@dataclass(frozen=True)
class RlConfig:
    steps: int
    prompts_per_step: int = 4
    group_size: int = 8
    max_tokens: int = 32
    temperature: float = 1.0
    learning_rate: float = 1e-4
    loss_fn: str = "importance_sampling"
    loss_fn_config: dict[str, float] | None = None
    kl_beta: float = 0.0
    grad_clip_norm: float = 1.0
    seed: int = 0
    max_steps_without_signal: int = DEFAULT_RL_MAX_STEPS_WITHOUT_SIGNAL
    max_turns: int = DEFAULT_MAX_TURNS
    # 0: each step samples with the policy it trains. k > 0: a sampler copy samples up to k steps
    # ahead while the policy trains (`mint.trainer.recipes.rollout_sources`).
    max_steps_off_policy: int = 0


class Policy(Trainer, Scorer, Protocol):
    def sample_batch(self, requests: Sequence[SampleRequest]) -> list[list[SampledSequence]]: ...

    @property
    def version(self) -> str: ...


def group_advantages(rewards_G: Sequence[float]) -> list[float]:
    """(r - mean) / (std + eps); all zeros when the group's rewards are all equal."""
    mean = statistics.fmean(rewards_G)
    std = statistics.pstdev(rewards_G)
    if std == 0:
        return [0.0] * len(rewards_G)
    return [(reward - mean) / (std + ADVANTAGE_EPS) for reward in rewards_G]


def single_turn(prompt_tokens: Sequence[int], sample: SampledSequence) -> Episode:
    """A completion of a prompt without environment, as a one-turn episode."""
    turn = Turn(
        list(sample.tokens),
        list(sample.logprobs),
        {"role": "assistant"},
        [],
        0.0,
        sampler_logprobs=sample.sampler_logprobs,
        adapter_version=sample.adapter_version,
    )
    return Episode([], None, list(prompt_tokens), [turn])


def completion_datum(prompt_tokens: Sequence[int], sample: SampledSequence, advantage: float) -> Datum:
    """prompt + completion as one datum; loss inputs are zero on the prompt's positions."""
    return single_turn(prompt_tokens, sample).datum(advantage)


def kl_to_base(data: list[Datum], reference: Scorer, kl_beta: float) -> tuple[list[Datum], float]:
    """The mean of logp_sample - logp_base over the sampled tokens with signal (an estimate of
    KL(policy || base)); with `kl_beta > 0`, each such token's advantage is also lowered by
    kl_beta * (logp_sample - logp_base)."""
    base = reference.forward(data).logprobs
    penalised, kl_total, counted = [], 0.0, 0
    for datum, base_T in zip(data, base, strict=True):
        sampled_T = datum.loss_fn_inputs["logprobs"]
        advantages_T = list(datum.loss_fn_inputs["advantages"])
        for t, advantage in enumerate(advantages_T):
            if advantage != 0:
                kl = sampled_T[t] - base_T[t]
                advantages_T[t] = advantage - kl_beta * kl
                kl_total, counted = kl_total + kl, counted + 1
        penalised.append(
            Datum(model_input=datum.model_input, loss_fn_inputs={**datum.loss_fn_inputs, "advantages": advantages_T})
        )
    return (penalised if kl_beta > 0 else data), kl_total / max(counted, 1)


def clip_fraction(data: Sequence[Datum], trained_logprobs: Sequence[Sequence[float]]) -> float:
    """The share of tokens with signal whose ratio exp(logp_train - logp_sample) is outside
    [1 - CLIP_BAND, 1 + CLIP_BAND]: near 0 on-policy; growing when sampler and trainer drift."""
    outside, counted = 0, 0
    for datum, trained_T in zip(data, trained_logprobs, strict=True):
        sampled_T = datum.loss_fn_inputs["logprobs"]
        for t, advantage in enumerate(datum.loss_fn_inputs["advantages"]):
            if advantage != 0:
                ratio = math.exp(trained_T[t] - sampled_T[t])
                outside += not (1 - CLIP_BAND <= ratio <= 1 + CLIP_BAND)
                counted += 1
    return outside / counted if counted else 0.0


class UpdateConfig(Protocol):
    """What a policy-gradient update needs of a recipe's config."""

    @property
    def learning_rate(self) -> float: ...
    @property
    def loss_fn(self) -> str: ...
    @property
    def loss_fn_config(self) -> dict[str, float] | None: ...
    @property
    def kl_beta(self) -> float: ...
    @property
    def grad_clip_norm(self) -> float: ...


def policy_update(
    policy: Trainer, data: list[Datum], config: UpdateConfig, reference: Scorer | None, metrics: dict[str, float]
) -> dict[str, float]:
    """One optimizer step on a step's data with signal (none: the optimizer still steps, as
    every step counts): the KL to the base when `reference` is given (penalised with
    `kl_beta`), the loss over the mean of tokens, its `loss` and `clip_fraction` put in `metrics`.
    Returns the optimizer's metrics."""
    if data:
        if reference is not None:
            data, metrics["kl"] = kl_to_base(data, reference, config.kl_beta)
        result = policy.forward_backward(mean_over_tokens(data, "advantages"), config.loss_fn, config.loss_fn_config)
        metrics["loss"] = result.metrics["loss:sum"]
        metrics["clip_fraction"] = clip_fraction(data, result.logprobs)
    return policy.optim_step(AdamParams(learning_rate=config.learning_rate, grad_clip_norm=config.grad_clip_norm))


def no_signal_message(steps: int, group_size: int, mean_reward: float, graded: Sequence[GradedSample] = ()) -> str:
    """What happened and what to do, for a run stopped by `NoRewardSignal`; `graded` (a few of
    the last step's samples) shows what the grader was given."""
    if mean_reward <= 0:
        seen = "every sample scored 0" + (describe_outputs(graded) or ": the grader never gave this model a reward")
    elif mean_reward >= 1:
        seen = "every sample scored full marks: there is nothing left to learn"
    else:
        seen = f"all {group_size} samples of each prompt scored the same (mean reward {mean_reward:.3g})"
    return (
        f"no reward signal for {steps} steps in a row: {seen}, so RL had nothing to learn from and stopped. "
        "Warm-start from an adapter trained by SFT on the same task (e.g. on mined failures), use a grader "
        "that gives partial credit, or raise group_size or temperature; max_steps_without_signal sets how "
        "many such steps a job allows"
    )


def _graded(prompt: RlPrompt, episode: Episode, output: Any) -> float:
    """The grader's reward of an episode's output, its penalties charged for the episode's turns and tokens."""
    if prompt.grader is None:
        return 0.0
    return prompt.grader.reward(output, prompt.reference, steps=len(episode.turns), tokens=episode.sampled_tokens)


@dataclass(frozen=True)
class GroupRollout:
    """One prompt's group in a step: its episodes, their rewards, and what the grader read of each."""

    prompt: RlPrompt
    episodes: list[Episode]
    rewards: list[float]
    outputs: list[Any]

    def graded(self, index: int) -> GradedSample:
        """Sample `index` as its grader saw it, with the grader's reason."""
        output = self.outputs[index]
        detail = explain(self.prompt.grader, output, self.prompt.reference) if self.prompt.grader else ""
        return GradedSample(graded_text(output), self.rewards[index], self.prompt.reference, detail)


def _rollouts(
    policy: Policy,
    groups: Sequence[tuple[RlPrompt, int]],
    config: RlConfig,
    tokenizer: PreTrainedTokenizerBase,
) -> list[GroupRollout]:
    """One step's groups, each a (prompt, seed): `group_size` episodes of each prompt and their
    rewards (environment + grader), in order.

    The whole step samples together: the completions of prompts without an environment and
    the first turns of every episode in one `sample_batch` call, then each later turn of every
    live episode in one call per round (`mint.trainer.episodes.EpisodeGroups`). A completion is
    graded as its text without the token that stopped it (`mint.chat.completion_text`).
    """
    limits = EpisodeLimits(max_turns=config.max_turns, max_tokens=config.max_tokens, temperature=config.temperature)
    acting = [(prompt.environment, seed) for prompt, seed in groups if prompt.environment is not None]
    episode_groups = EpisodeGroups(tokenizer, acting, config.group_size, limits)
    completions = [
        SampleRequest(prompt.prompt_tokens, limits.sampling(seed), config.group_size)
        for prompt, seed in groups
        if prompt.environment is None
    ]
    first_round = policy.sample_batch([*completions, *episode_groups.requests()])
    episode_groups.take(first_round[len(completions) :])
    play(policy, episode_groups)

    completed = iter(first_round[: len(completions)])
    acted = iter(episode_groups.episodes)
    results = []
    for prompt, _ in groups:
        outputs: list[Any]
        if prompt.environment is None:
            samples = next(completed)
            episodes = [single_turn(prompt.prompt_tokens, sample) for sample in samples]
            outputs = [sampled_text(tokenizer, sample) for sample in samples]
        else:
            episodes = next(acted)
            outputs = [episode.added for episode in episodes]
        rewards = [
            episode.environment_reward + _graded(prompt, episode, output)
            for episode, output in zip(episodes, outputs, strict=True)
        ]
        results.append(GroupRollout(prompt, episodes, rewards, outputs))
    return results


def run_rl(
    policy: Policy,
    prompts: Sequence[RlPrompt],
    config: RlConfig,
    *,
    tokenizer: PreTrainedTokenizerBase,
    reference: Scorer | None = None,
    start_step: int = 0,
    on_step: OnStep | None = None,
) -> list[StepReport]:
    """Train from `start_step` to `config.steps`; `reference` (the base) is needed for `kl_beta > 0`
    and gives the `kl` metric whenever it is passed; `tokenizer` turns completions into the text
    graded and renders the turns of prompts with an environment. Raises `NoRewardSignal` after
    `config.max_steps_without_signal` steps in a row without signal (each reported first)."""
    if config.kl_beta > 0 and reference is None:
        raise ValueError("kl_beta > 0 needs a reference scorer (the base model)")
    plan = batch_plan(len(prompts), batch_size=config.prompts_per_step, steps=config.steps, seed=config.seed)

    def sample_step(sampler: Policy, step: int) -> list[GroupRollout]:
        groups = [
            (prompts[index], config.seed * 1_000_003 + step * 1_009 + slot) for slot, index in enumerate(plan[step])
        ]
        return _rollouts(sampler, groups, config, tokenizer)

    # An on-policy run declares its loop, so that RL runs of several sessions on one base share
    # passes; an off-policy one waits on its sampler thread, so it does not hold the others up.
    looping = getattr(policy, "looping", nullcontext) if config.max_steps_off_policy == 0 else nullcontext
    steps = range(start_step, config.steps)
    with looping(), rollout_source(policy, sample_step, steps, config.max_steps_off_policy) as source:
        return _rl_steps(policy, source, config, reference, steps, on_step)


def _rl_steps(
    policy: Policy,
    source: RolloutSource[list[GroupRollout]],
    config: RlConfig,
    reference: Scorer | None,
    steps: range,
    on_step: OnStep | None,
) -> list[StepReport]:
    reports = []
    steps_without_signal = 0
    versions = PolicyVersions(policy.version, steps.start)
    for step in steps:
        data: list[Datum] = []
        rewards: list[float] = []
        turns: list[int] = []
        episode_tokens: list[int] = []
        groups_with_signal, sampled_tokens, sampled_logprob_sum = 0, 0, 0.0
        step_rollouts = source.rollouts(step)
        seen = [turn.adapter_version for group in step_rollouts for e in group.episodes for turn in e.turns]
        lag = versions.lag(step, seen, config.max_steps_off_policy)
        for group in step_rollouts:
            episodes, rewards_G = group.episodes, group.rewards
            rewards += rewards_G
            advantages_G = group_advantages(rewards_G)
            groups_with_signal += any(advantages_G)
            for episode, advantage in zip(episodes, advantages_G, strict=True):
                sampled_tokens += episode.sampled_tokens
                sampled_logprob_sum += sum(sum(turn.logprobs) for turn in episode.turns)
                turns.append(len(episode.turns))
                episode_tokens.append(len(episode.tokens))
                if advantage != 0:
                    data.append(episode.datum(advantage))
        metrics = {
            "reward": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
            "groups_with_signal": groups_with_signal / len(step_rollouts),
            "samples_with_signal": float(len(data)),
            "tokens": float(sampled_tokens),
            # The sampled tokens' mean negative logprob: a one-sample estimate of the policy's entropy.
            "entropy": -sampled_logprob_sum / max(sampled_tokens, 1),
            # Per episode: assistant turns taken, and the whole sequence's tokens (prompt and observations too).
            "turns": statistics.fmean(turns),
            "episode_tokens": statistics.fmean(episode_tokens),
            # How many updates behind the policy the sampled turns' weights were, on average.
            "off_policy_steps": lag,
        }
        lr = config.learning_rate
        optim = policy_update(policy, data, config, reference, metrics)
        versions.record(policy.version, step + 1)
        source.trained(step + 1)
        metrics["grad_norm"] = optim["grad_norm:mean"]
        shown = [
            step_rollouts[group].graded(index)
            for group, index in shown_indices([len(group.episodes) for group in step_rollouts])
        ]
        report = StepReport(
            step=step + 1, learning_rate=lr, metrics=metrics, samples=[sample.record() for sample in shown]
        )
        reports.append(report)
        if not keep_going(on_step, report):
            break
        steps_without_signal = 0 if data else steps_without_signal + 1
        if steps_without_signal >= config.max_steps_without_signal:
            raise NoRewardSignal(no_signal_message(steps_without_signal, config.group_size, metrics["reward"], shown))
    return reports


def _rl_prompt(inputs: RecipeInputs, plan: RlPlan, grader: Grader | None, row: Mapping[str, Any]) -> RlPrompt:
    own = (row.get("metadata") or {}).get("grader")
    if own is not None:  # a mined prompt scores its samples with its task's own grader, as the benchmark did
        grader = inputs.grader_for(own)
    bind = getattr(grader, "for_row", None)
    if bind is not None:  # a grader that reads the prompt too (a remote one): bound to this row
        grader = bind(row)
    environment = inputs.environment_for(row, plan.environment.model_dump() if plan.environment else None)
    if environment is None:
        if grader is None:
            raise InvalidRequest(
                "this row has no environment to reward it and the job has no grader; give the job a grader, "
                "or the row an environment",
                param="environment",
            )
        tokens = render_prompt(inputs.tokenizer, row["messages"], row.get("tools"))
    else:
        first = environment()  # its prompt is rendered now, so that a row the template refuses names its line
        try:
            tokens = render_prompt(inputs.tokenizer, first.initial_observation(), first.tools)
        finally:
            close_environment(first)
    return RlPrompt(prompt_tokens=tokens, reference=row.get("reference"), grader=grader, environment=environment)


def run_rl_plan(plan: RlPlan, inputs: RecipeInputs) -> list[StepReport]:
    """A job's RL plan on its prompt rows (`messages`, optional `tools`, `reference` and `environment`)."""
    grader = inputs.grader_for(plan.grader.model_dump()) if plan.grader else None  # the closed registry's check
    tokenizer = inputs.tokenizer
    prompts = render_rows(inputs.rows, lambda row: _rl_prompt(inputs, plan, grader, row))
    config = RlConfig(
        steps=plan.steps,
        prompts_per_step=plan.batch_size,
        group_size=plan.group_size,
        max_tokens=plan.max_tokens,
        temperature=plan.temperature,
        learning_rate=plan.learning_rate,
        kl_beta=plan.kl_beta,
        loss_fn=plan.loss_fn,
        loss_fn_config=dict(plan.loss_fn_config),
        seed=inputs.seed,
        max_steps_without_signal=plan.max_steps_without_signal or inputs.rl_max_steps_without_signal,
        max_turns=plan.max_turns,
        max_steps_off_policy=plan.max_steps_off_policy,
    )
    return run_rl(
        inputs.training,
        prompts,
        config,
        reference=inputs.reference,
        start_step=inputs.start_step,
        on_step=inputs.on_step,
        tokenizer=tokenizer,
    )
