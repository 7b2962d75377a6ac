"""Online RL from a deployment's live episodes: train on what the deployment's users' agents did,
importance-corrected against the logprobs the serving engine recorded, and hand the deployment
a new version every few steps.

    run_online_rl(session, feed, OnlineRlConfig(steps=100, episodes_per_step=32),
                  start_version="support-bot@3", publish=publish)

An agent harness talks to a deployment; each of its turns is recorded token-exact (`LiveTurn`:
the prompt ids the engine rendered, the ids it sampled, their logprobs, the model ref that
sampled them), and a reward arrives later for the whole episode (`LiveEpisode`). The recipe
knows nothing of where episodes are kept: it asks an `EpisodeFeed` for the rewarded episodes
it has not trained on yet, and calls `publish(steps_done)` to register and serve the policy's
current weights, which returns the new version's model ref.

Each step:

- Take up to `episodes_per_step` episodes from the feed. An episode any of whose turns was
  sampled by weights more than `max_steps_off_policy` updates older than the policy, or by a
  version this run does not know, is dropped and counted (`episodes_stale`); if none is left,
  ask the feed again. If the feed answers with nothing (no episode came in its wait), the run
  ends there and returns the steps reported so far: the job decides whether that is a success
  (a quiet deployment) or a failure. The steps trained since the last published version are then
  unpublished; the policy still holds them, so the job may publish them itself.
- Turn each episode into data (`episode_segments`): consecutive turns whose next prompt starts
  with the previous prompt and the ids sampled after it are one `mint.trainer.episodes.Episode`,
  the rest of the next prompt (tool results, the user's next message) being the observation
  between two turns; a turn whose prompt does not extend the sequence so far (the harness cut
  or rewrote its history) starts a new one, with the episode's advantage. Each becomes a datum
  by `Episode.datum`: the advantage on the sampled positions only, and as `logprobs` (and
  `sampler_logprobs`) the logprobs the engine recorded, so that the loss's importance ratio
  exp(logp_policy - logp_recorded) corrects for the weights having moved since they sampled.
- Advantages, by `baseline`:
  `group`: episodes of the step sharing a task key form a group, normalised as `run_rl` does
  (`group_advantages`); an episode alone in its group, or without a task key, has no signal.
  `task_mean`: an episode's reward less the mean reward of its task over every episode trained
  on before this step (for a task not seen before, the mean of its episodes in this step),
  divided by the root mean square of these differences over the step (+ eps). The root mean
  square, not the standard deviation: it is the spread about the baseline rather than about
  the step's mean, so a step whose episodes all scored 1 against a running mean of 0.5 gets
  advantages of +1, where a division by the step's standard deviation (0) would blow them up.
  It puts the advantages on `group`'s scale, so `kl_beta` weighs the same under both (the
  loss itself is a mean over tokens either way). An episode without a task key has no
  signal. The running means then take the step's episodes; they live in the run (a resumed
  job starts them afresh).
- forward_backward with the policy loss, `optim_step`, and after every `publish_every`-th step
  (counted from 0, so a resumed run keeps the cadence) and after the last step, `publish`. The
  published ref is known from then on as the policy's version after that many steps; the
  version the deployment served when the job began (`start_version`) counts as the policy's
  version after `start_step` steps.

Every step reports what `run_rl` reports (reward, reward_std, groups_with_signal,
samples_with_signal, tokens, entropy, turns, episode_tokens, off_policy_steps, loss,
clip_fraction, kl with a reference, grad_norm), and `episodes`, `episodes_stale` and
`published` (1.0 on a step after which a version was published, else 0.0). A few of its episodes
are shown in the report as "episode <id>" with their reward (the recipe has no tokenizer to
show their text). After `max_steps_without_signal` steps in a row without signal, the run
stops with `NoRewardSignal`, as `run_rl` does.

The recipe does not declare a training loop (`TrainingSession.looping`): it waits on the feed,
which would hold up the passes of the other sessions on its base. No torch here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal, Protocol

from mint.errors import InvalidRequest
from mint.schemas.plans import OnlineRlPlan
from mint.trainer.episodes import Episode, Turn
from mint.trainer.recipes.common import OnStep, RecipeInputs, Scorer, StepReport, Trainer, keep_going
from mint.trainer.recipes.graded_samples import GradedSample, shown_indices
from mint.trainer.recipes.rl import (
    ADVANTAGE_EPS,
    NoRewardSignal,
    group_advantages,
    no_signal_message,
    policy_update,
)
from mint.trainer.recipes.rollout_sources import PolicyVersions
from mint.trainer.types import Datum

__all__ = [
    "EpisodeFeed",
    "LiveEpisode",
    "LiveTurn",
    "OnlineRlConfig",
    "TaskMeans",
    "episode_segments",
    "run_online_rl",
    "task_mean_advantages",
]

# The key of the base's weights among the policy's versions: a turn sampled with every adapter
# off has `adapter_version` None (and so does a job warm-started from the base), and samplers
# stamp "base" (`SampledSequence.adapter_version`). A model ref is never "base" ("name@N").
BASE_VERSION = "base"


@dataclass(frozen=True)
class LiveTurn:
    """One turn of a live episode, as the serving engine recorded it."""

    prompt_tokens: list[int]  # the whole prompt as the serving engine rendered it for this turn
    tokens: list[int]  # the ids it sampled (the stop token included when one was sampled)
    logprobs: list[float]  # the sampler's logprob of each sampled id (model's own, temperature 1)
    adapter_version: str | None  # the model ref that sampled it, e.g. "support-bot@3"; None: the base

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.logprobs):
            raise ValueError(
                f"a live turn has {len(self.tokens)} sampled ids but {len(self.logprobs)} logprobs; "
                "the engine records one logprob per sampled id"
            )
        if not self.prompt_tokens:
            raise ValueError("a live turn has an empty prompt; the engine renders at least the chat template")


@dataclass(frozen=True)
class LiveEpisode:
    """One episode of a deployment's traffic, with the reward it was given."""

    id: str
    task: str | None  # task key: episodes sharing it form a group
    reward: float
    turns: list[LiveTurn]


class EpisodeFeed(Protocol):
    def next_episodes(self, step: int, count: int) -> list[LiveEpisode]:
        """Up to `count` rewarded episodes not yet trained on (blocks until enough have arrived or
        its wait ends; an empty list means none came in time)."""
        ...


@dataclass(frozen=True)
class OnlineRlConfig:
    steps: int
    episodes_per_step: int
    learning_rate: float = 1e-4
    loss_fn: str = "importance_sampling"
    loss_fn_config: dict[str, float] | None = None
    kl_beta: float = 0.0
    grad_clip_norm: float = 1.0
    # group: episodes sharing a task key in the step; task_mean: running mean reward per task key
    # over all episodes trained on so far (the step's own mean for a task never seen).
    baseline: Literal["group", "task_mean"] = "group"
    # Episodes whose turns were sampled by a version more than this many updates old (or by a
    # version unknown to the run) are dropped and counted.
    max_steps_off_policy: int = 2
    publish_every: int = 1  # steps between published versions
    max_steps_without_signal: int = 8


def _version_key(version: str | None) -> str:
    return BASE_VERSION if version is None else version


def episode_segments(episode: LiveEpisode) -> list[Episode]:
    """The episode's turns as training sequences: a turn whose prompt starts with the sequence so
    far (the previous prompt, the ids sampled after it, and any earlier observations) extends it,
    the rest of its prompt becoming the previous turn's observation; any other turn starts a new
    sequence from its own prompt. Each turn's recorded logprobs are its `logprobs` and its
    `sampler_logprobs`. A turn that sampled nothing is skipped."""
    segments: list[Episode] = []
    for live in episode.turns:
        if not live.tokens:
            continue
        turn = Turn(
            list(live.tokens),
            list(live.logprobs),
            {"role": "assistant"},
            [],
            0.0,
            sampler_logprobs=list(live.logprobs),
            adapter_version=live.adapter_version,
        )
        if segments:
            current = segments[-1]
            sequence = current.tokens
            if live.prompt_tokens[: len(sequence)] == sequence:
                observation = list(live.prompt_tokens[len(sequence) :])
                current.turns[-1] = replace(current.turns[-1], observation_tokens=observation)
                current.turns.append(turn)
                continue
        segments.append(Episode([], None, list(live.prompt_tokens), [turn]))
    return segments


class TaskMeans:
    """The running mean reward of each task key over the episodes trained on so far (exact sums,
    so that an episode scoring its task's mean has an advantage of exactly 0)."""

    def __init__(self) -> None:
        self._totals: dict[str, tuple[Fraction, int]] = {}

    def mean(self, task: str) -> Fraction | None:
        seen = self._totals.get(task)
        return None if seen is None else seen[0] / seen[1]

    def add(self, tasks: Sequence[str | None], rewards: Sequence[float]) -> None:
        for task, reward in zip(tasks, rewards, strict=True):
            if task is not None:
                total, count = self._totals.get(task, (Fraction(0), 0))
                self._totals[task] = (total + Fraction(reward), count + 1)


def task_mean_advantages(tasks: Sequence[str | None], rewards: Sequence[float], means: TaskMeans) -> list[float]:
    """Each episode's reward less its task's running mean (the step's own mean of the task for a
    task not in `means`), divided by the root mean square of these differences over the step's
    episodes with a task (+ eps); 0 for an episode without a task, and all 0 when every
    difference is 0."""
    step_means: dict[str, Fraction] = {}
    for key in {task for task in tasks if task is not None}:
        own = [Fraction(reward) for task, reward in zip(tasks, rewards, strict=True) if task == key]
        step_means[key] = sum(own, Fraction(0)) / len(own)
    differences: list[float | None] = []
    for task, reward in zip(tasks, rewards, strict=True):
        if task is None:
            differences.append(None)
            continue
        baseline = means.mean(task)
        differences.append(float(Fraction(reward) - (step_means[task] if baseline is None else baseline)))
    counted = [difference for difference in differences if difference is not None]
    if not any(counted):
        return [0.0] * len(rewards)
    rms = math.sqrt(statistics.fmean(difference * difference for difference in counted))
    return [0.0 if difference is None else difference / (rms + ADVANTAGE_EPS) for difference in differences]


def _groups(episodes: Sequence[LiveEpisode]) -> list[list[int]]:
    """The step's groups, as indices into `episodes`: one per task key in order of appearance, and
    one per episode without a task."""
    by_task: dict[str, list[int]] = {}
    groups: list[list[int]] = []
    for index, episode in enumerate(episodes):
        if episode.task is None:
            groups.append([index])
        elif episode.task in by_task:
            by_task[episode.task].append(index)
        else:
            by_task[episode.task] = [index]
            groups.append(by_task[episode.task])
    return groups


def _advantages(
    episodes: Sequence[LiveEpisode], groups: Sequence[list[int]], baseline: str, means: TaskMeans
) -> list[float]:
    rewards = [episode.reward for episode in episodes]
    if baseline == "task_mean":
        return task_mean_advantages([episode.task for episode in episodes], rewards, means)
    advantages = [0.0] * len(episodes)
    for group in groups:
        if len(group) > 1:
            for index, advantage in zip(group, group_advantages([rewards[i] for i in group]), strict=True):
                advantages[index] = advantage
    return advantages


def _usable_episodes(
    feed: EpisodeFeed, step: int, config: OnlineRlConfig, versions: PolicyVersions
) -> tuple[list[LiveEpisode], list[int], int] | None:
    """The step's episodes that fresh weights sampled, each of their turns' lags (updates between
    the weights that sampled it and the policy), and how many episodes were dropped as stale;
    asks the feed again while every episode it gave was stale. None when it gives nothing."""
    stale = 0
    while True:
        offered = feed.next_episodes(step, config.episodes_per_step)
        if not offered:
            return None
        kept: list[LiveEpisode] = []
        lags: list[int] = []
        for episode in offered:
            episode_lags = [versions.updates_since(_version_key(turn.adapter_version), step) for turn in episode.turns]
            # (No lag is negative: `earlier_versions` after `start_step` are left out, as weights
            # this run never had; the check only guards that.)
            if all(lag is not None and 0 <= lag <= config.max_steps_off_policy for lag in episode_lags):
                kept.append(episode)
                lags += [lag for lag in episode_lags if lag is not None]
            else:
                stale += 1
        if kept:
            return kept, lags, stale


def _no_signal(steps: int, episodes: Sequence[LiveEpisode], groups: Sequence[list[int]], config: OnlineRlConfig) -> str:
    """Why a run without signal stopped, and what to change."""
    tail = "; max_steps_without_signal sets how many such steps a job allows"
    if all(episode.task is None for episode in episodes):
        return (
            f"no reward signal for {steps} steps in a row: no episode carried a task key, and the {config.baseline} "
            "baseline compares an episode only with others of its task, so RL had nothing to learn from and "
            "stopped. Give the harness's episodes task keys (the same key for the same task)" + tail
        )
    if config.baseline == "group" and all(len(group) < 2 for group in groups):
        return (
            f"no reward signal for {steps} steps in a row: no two episodes of a step shared a task key, so the "
            "group baseline had nothing to compare them with and RL stopped. Raise episodes_per_step so that "
            "several episodes of one task arrive in a step, or use the task_mean baseline, which compares each "
            "episode with its task's running mean" + tail
        )
    largest = max(len(group) for group in groups)
    return no_signal_message(steps, largest, statistics.fmean(episode.reward for episode in episodes))


def run_online_rl(
    policy: Trainer,
    feed: EpisodeFeed,
    config: OnlineRlConfig,
    *,
    start_version: str | None,
    publish: Callable[[int], str],
    reference: Scorer | None = None,
    start_step: int = 0,
    on_step: OnStep | None = None,
    earlier_versions: Mapping[str, int] | None = None,
) -> list[StepReport]:
    """Train from `start_step` to `config.steps` on the feed's episodes; see the module's docstring.

    `start_version`: the model ref the deployment served when the job began, which the policy was
    warm-started from (None: the base); it is the policy's version after `start_step` steps.
    `publish(steps_done)` registers and serves the policy's current weights and returns the new
    version's model ref. `earlier_versions`: refs published before `start_step` (by the run this
    one resumes) with the steps after which each was current, so that their episodes are
    trained on rather than dropped as unknown. `reference` (the base) is needed for
    `kl_beta > 0` and gives the `kl` metric whenever it is passed.

    Returns the reports of the steps taken: all of them, or fewer when the feed gave no episode
    in its wait or `on_step` returned False. Raises `NoRewardSignal` after
    `config.max_steps_without_signal` steps in a row without signal (each reported first)."""
    if config.kl_beta > 0 and reference is None:
        raise ValueError("kl_beta > 0 needs a reference scorer (the base model)")
    if config.episodes_per_step < 1:
        raise InvalidRequest("episodes_per_step must be at least 1", param="episodes_per_step")
    if config.publish_every < 1:
        raise InvalidRequest("publish_every must be at least 1", param="publish_every")
    if config.max_steps_off_policy < config.publish_every - 1:
        raise InvalidRequest(
            f"publish_every {config.publish_every} leaves the deployment serving weights up to "
            f"{config.publish_every - 1} updates old, more than max_steps_off_policy {config.max_steps_off_policy} "
            "allows: every episode would be dropped as stale at some steps. Raise max_steps_off_policy to at least "
            "publish_every - 1",
            param="max_steps_off_policy",
        )
    versions = PolicyVersions(_version_key(start_version), start_step)
    for ref, steps_done in (earlier_versions or {}).items():
        if steps_done <= start_step and ref != start_version:
            versions.record(_version_key(ref), steps_done)
    means = TaskMeans()
    reports: list[StepReport] = []
    steps_without_signal = 0
    for step in range(start_step, config.steps):
        taken = _usable_episodes(feed, step, config, versions)
        if taken is None:
            return reports  # nothing came in the feed's wait: the job decides what that means
        episodes, lags, stale = taken
        groups = _groups(episodes)
        advantages = _advantages(episodes, groups, config.baseline, means)
        data: list[Datum] = []
        sampled_tokens, sampled_logprob_sum, episode_tokens = 0, 0.0, []
        for episode, advantage in zip(episodes, advantages, strict=True):
            segments = episode_segments(episode)
            sampled_tokens += sum(segment.sampled_tokens for segment in segments)
            sampled_logprob_sum += sum(sum(turn.logprobs) for turn in episode.turns)
            episode_tokens.append(sum(len(segment.tokens) for segment in segments))
            if advantage != 0:
                data += [segment.datum(advantage) for segment in segments]
        rewards = [episode.reward for episode in episodes]
        metrics = {
            "reward": statistics.fmean(rewards),
            "reward_std": statistics.pstdev(rewards),
            "groups_with_signal": sum(any(advantages[i] for i in group) for group in groups) / len(groups),
            "samples_with_signal": float(sum(advantage != 0 for advantage in advantages)),
            "tokens": float(sampled_tokens),
            # The sampled tokens' mean negative logprob: a one-sample estimate of the policy's entropy.
            "entropy": -sampled_logprob_sum / max(sampled_tokens, 1),
            "turns": statistics.fmean(len(episode.turns) for episode in episodes),
            "episode_tokens": statistics.fmean(episode_tokens),
            # How many updates behind the policy the weights that sampled the turns were, on average.
            "off_policy_steps": statistics.fmean(lags) if lags else 0.0,
            "episodes": float(len(episodes)),
            "episodes_stale": float(stale),
        }
        lr = config.learning_rate
        optim = policy_update(policy, data, config, reference, metrics)
        metrics["grad_norm"] = optim["grad_norm:mean"]
        means.add([episode.task for episode in episodes], rewards)
        steps_done = step + 1
        published = steps_done % config.publish_every == 0 or steps_done == config.steps
        if published:
            versions.record(_version_key(publish(steps_done)), steps_done)
        metrics["published"] = float(published)
        shown = [
            _shown(episodes[groups[group][index]]) for group, index in shown_indices([len(group) for group in groups])
        ]
        report = StepReport(step=steps_done, learning_rate=lr, metrics=metrics, samples=shown)
        reports.append(report)
        if not keep_going(on_step, report):
            break
        steps_without_signal = 0 if data else steps_without_signal + 1
        if steps_without_signal >= config.max_steps_without_signal:
            raise NoRewardSignal(_no_signal(steps_without_signal, episodes, groups, config))
    return reports


def _shown(episode: LiveEpisode) -> dict[str, object]:
    """An episode as a step's report shows it: its id (the text is not the recipe's to read) and reward."""
    versions = sorted({_version_key(turn.adapter_version) for turn in episode.turns})
    detail = f"task {episode.task!r}" if episode.task is not None else "no task"
    return GradedSample(
        f"episode {episode.id}", episode.reward, None, f"{detail}; sampled by {', '.join(versions)}"
    ).record()


def run_online_rl_plan(plan: OnlineRlPlan, inputs: RecipeInputs) -> list[StepReport]:
    """A job's online RL plan on its deployment's live episodes (`inputs.live`, the job's)."""
    if inputs.live is None:
        raise InvalidRequest("an online RL plan trains from a deployment's episodes, and this job gave none")
    config = OnlineRlConfig(
        steps=plan.steps,
        episodes_per_step=plan.batch_size,
        learning_rate=plan.learning_rate,
        loss_fn=plan.loss_fn,
        loss_fn_config=dict(plan.loss_fn_config),
        kl_beta=plan.kl_beta,
        baseline=plan.baseline,
        max_steps_off_policy=plan.max_steps_off_policy,
        publish_every=plan.publish_every,
        max_steps_without_signal=plan.max_steps_without_signal or inputs.rl_max_steps_without_signal,
    )
    return run_online_rl(
        inputs.training,
        inputs.live.feed,
        config,
        start_version=inputs.live.start_version,
        publish=inputs.live.publish,
        reference=inputs.reference if plan.kl_beta > 0 else None,
        start_step=inputs.start_step,
        on_step=inputs.on_step,
        earlier_versions=inputs.live.earlier_versions,
    )
