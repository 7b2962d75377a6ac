"""Online RL (`mint.trainer.recipes.online_rl`) on tiny-glm-moe, from episodes the session itself
sampled: the deployment is a second adapter on the same base holding the published weights
(`sampler_copy`), the feed a list. Rewards alternate within a group (1, 0, 1, 0), so that every
group has signal whatever the tiny base samples: these tests check the mechanics (what is
trained, against which logprobs, what is dropped, when versions are published), not learning."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest

from mint.chat.render import render_prompt
from mint.trainer.recipes.common import StepReport
from mint.trainer.recipes.online_rl import (
    LiveEpisode,
    LiveTurn,
    OnlineRlConfig,
    TaskMeans,
    episode_segments,
    run_online_rl,
    task_mean_advantages,
)
from mint.trainer.recipes.rl import NoRewardSignal
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import AdamParams, Datum, ForwardOutput, LoraOptions, SampleRequest, SamplingParams

pytestmark = pytest.mark.backend_free

MAX_TOKENS = 3  # the tiny base never stops early: every turn samples exactly this many ids

Batch = list[LiveEpisode] | Callable[[int], list[LiveEpisode]]


class ListFeed:
    """An `EpisodeFeed` backed by a list: each call hands out the next batch (a list, or a function
    of the step that samples it when asked, as live traffic would), then [] once the list is spent."""

    def __init__(self, batches: Sequence[Batch]) -> None:
        self.batches = list(batches)
        self.asked: list[tuple[int, int]] = []

    def next_episodes(self, step: int, count: int) -> list[LiveEpisode]:
        self.asked.append((step, count))
        if not self.batches:
            return []
        batch = self.batches.pop(0)
        episodes = batch(step) if callable(batch) else batch
        assert len(episodes) <= count
        return episodes


class Deployment:
    """The serving side, in memory: an adapter on the base that holds the published weights, and
    the model ref of each version, known by the digest its samples are stamped with."""

    def __init__(self, policy: TrainingSession, sampler: TrainingSession, start_ref: str) -> None:
        self.policy, self.sampler = policy, sampler
        self.refs = {sampler.version: start_ref}
        self.published: list[tuple[int, str]] = []

    def publish(self, steps_done: int) -> str:
        self.policy.copy_weights_to(self.sampler)
        ref = f"bot@{steps_done}"
        self.refs[self.sampler.version] = ref
        self.published.append((steps_done, ref))
        return ref

    def episodes(self, prompts: dict[str, list[int]], per_task: int, seed: int) -> list[LiveEpisode]:
        """`per_task` one-turn episodes of each task, sampled by the served weights, rewards 1, 0, 1, 0..."""
        return sampled_episodes(self.sampler, prompts, per_task, seed, lambda version: self.refs[str(version)])


def sampled_episodes(
    sampler: TrainingSession,
    prompts: dict[str, list[int]],
    per_task: int,
    seed: int,
    ref: Callable[[str | None], str | None],
) -> list[LiveEpisode]:
    requests = [
        SampleRequest(prompt, SamplingParams(max_tokens=MAX_TOKENS, seed=seed + i), per_task)
        for i, prompt in enumerate(prompts.values())
    ]
    episodes = []
    for (task, prompt), samples in zip(prompts.items(), sampler.sample_batch(requests), strict=True):
        for index, sample in enumerate(samples):
            turn = LiveTurn(list(prompt), sample.tokens, sample.logprobs, ref(sample.adapter_version))
            episodes.append(LiveEpisode(f"{task}-{seed}-{index}", task, float(index % 2 == 0), [turn]))
    return episodes


class Recording:
    """The policy, remembering what each forward_backward was given and the logprobs it computed."""

    def __init__(self, session: TrainingSession) -> None:
        self.session = session
        self.calls: list[tuple[list[Datum], ForwardOutput]] = []

    def forward_backward(
        self, data: Sequence[Datum], loss_fn: str, loss_fn_config: dict[str, float] | None = None
    ) -> ForwardOutput:
        result = self.session.forward_backward(data, loss_fn, loss_fn_config)
        self.calls.append((list(data), result))
        return result

    def optim_step(self, adam: AdamParams | None = None) -> dict[str, float]:
        return self.session.optim_step(adam)


def prompt(resident: ResidentBase, text: str) -> list[int]:
    return render_prompt(resident.tokenizer, [{"role": "user", "content": text}])


def floats(datum: Datum, key: str) -> list[float]:
    return [float(value) for value in datum.loss_fn_inputs[key]]  # type: ignore[arg-type]  # a 1-D input


def sampled_positions(datum: Datum) -> list[int]:
    return [t for t, weight in enumerate(floats(datum, "weights")) if weight > 0]


def at(values: Sequence[Any], positions: Sequence[int]) -> list[Any]:
    return [values[t] for t in positions]


def test_a_run_trains_on_the_feed_and_publishes_every_n_steps(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    """publish_every 2 over 3 steps: published after steps 2 and 3 (the last); step 2's episodes
    were sampled by the start version, one update old; step 3's by the version of step 2."""
    policy = open_session(LoraOptions(seed=0))
    prompts = {"greet": prompt(resident, "hi"), "thank": prompt(resident, "thanks")}
    with policy.sampler_copy() as sampler:
        deployment = Deployment(policy, sampler, "bot@0")
        feed = ListFeed([lambda step: deployment.episodes(prompts, 4, seed=step * 100)] * 3)
        config = OnlineRlConfig(
            steps=3, episodes_per_step=8, learning_rate=5e-3, publish_every=2, max_steps_off_policy=1
        )
        reports = run_online_rl(
            policy, feed, config, start_version="bot@0", publish=deployment.publish, reference=resident
        )
    assert deployment.published == [(2, "bot@2"), (3, "bot@3")]
    assert feed.asked == [(0, 8), (1, 8), (2, 8)]
    assert [report.step for report in reports] == [1, 2, 3]
    assert [report.metrics["published"] for report in reports] == [0.0, 1.0, 1.0]
    assert [report.metrics["off_policy_steps"] for report in reports] == [0.0, 1.0, 0.0]
    for report in reports:
        metrics = report.metrics
        assert {
            "reward",
            "reward_std",
            "groups_with_signal",
            "samples_with_signal",
            "tokens",
            "entropy",
            "turns",
            "episode_tokens",
            "episodes",
            "episodes_stale",
            "loss",
            "clip_fraction",
            "kl",
            "grad_norm",
        } <= set(metrics), metrics
        assert metrics["episodes"] == 8 and metrics["episodes_stale"] == 0
        assert metrics["groups_with_signal"] == 1 and metrics["samples_with_signal"] == 8
        assert metrics["reward"] == 0.5 and metrics["turns"] == 1
        assert metrics["tokens"] == 8 * MAX_TOKENS and metrics["entropy"] > 0 and metrics["grad_norm"] > 0
        assert len(report.samples) == 4 and report.samples[0]["text"].startswith("episode greet-")
    # The first step trains on what the very weights sampled: no ratio leaves the band, and a
    # fresh adapter is the base.
    assert reports[0].metrics["clip_fraction"] == 0.0 and abs(reports[0].metrics["kl"]) < 1e-4


def test_stale_and_unknown_versions_are_dropped_and_a_recent_one_is_importance_corrected(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    """max_steps_off_policy 1, a version a step. Steps 1 and 2 train on what the current version
    sampled and hold back a second group each; step 3 is offered the group sampled by bot@0 (two
    updates old: dropped), the one sampled by bot@1 (one update old: trained) and an episode of an
    unknown version (dropped). The kept episodes train with their recorded logprobs as the loss's
    `logprobs`, which the policy, one update further on, no longer agrees with: the ratio is not 1."""
    session = open_session(LoraOptions(seed=0))
    policy = Recording(session)
    now, later = prompt(resident, "hi"), prompt(resident, "bye")
    held: dict[int, list[LiveEpisode]] = {}
    with session.sampler_copy() as sampler:
        deployment = Deployment(session, sampler, "bot@0")

        def sample_and_hold(step: int) -> list[LiveEpisode]:
            held[step] = deployment.episodes({"later": later}, 4, seed=step * 100 + 50)
            return deployment.episodes({"now": now}, 4, seed=step * 100)

        def late(step: int) -> list[LiveEpisode]:
            stranger = held[1][0]
            unknown = replace(
                stranger,
                id="elsewhere",
                turns=[replace(turn, adapter_version="other-bot@9") for turn in stranger.turns],
            )
            return [*held[0], *held[1], unknown]

        feed = ListFeed([sample_and_hold, sample_and_hold, late])
        config = OnlineRlConfig(steps=3, episodes_per_step=9, learning_rate=2e-2, max_steps_off_policy=1)
        reports = run_online_rl(policy, feed, config, start_version="bot@0", publish=deployment.publish)
    assert deployment.published == [(1, "bot@1"), (2, "bot@2"), (3, "bot@3")]
    assert {turn.adapter_version for episode in held[0] for turn in episode.turns} == {"bot@0"}
    assert {turn.adapter_version for episode in held[1] for turn in episode.turns} == {"bot@1"}
    last = reports[-1].metrics
    assert last["episodes"] == 4 and last["episodes_stale"] == 5 and last["off_policy_steps"] == 1.0
    assert [report.metrics["episodes_stale"] for report in reports[:2]] == [0.0, 0.0]

    data, result = policy.calls[-1]
    assert len(data) == 4
    for episode, datum, trained in zip(held[1], data, result.logprobs, strict=True):
        (turn,) = episode.turns
        assert datum.model_input == [*turn.prompt_tokens, *turn.tokens][:-1]
        positions = sampled_positions(datum)
        assert at(datum.loss_fn_inputs["target_tokens"], positions) == turn.tokens
        assert at(datum.loss_fn_inputs["logprobs"], positions) == turn.logprobs
        assert at(datum.loss_fn_inputs["sampler_logprobs"], positions) == turn.logprobs
        drift = max(abs(a - b) for a, b in zip(at(trained, positions), turn.logprobs, strict=True))
        assert drift > 1e-3, drift
    # On policy (steps 1 and 2 trained on what the current version sampled) the ratio is 1.
    for data, result in policy.calls[:2]:
        for datum, trained in zip(data, result.logprobs, strict=True):
            positions = sampled_positions(datum)
            assert at(trained, positions) == pytest.approx(at(datum.loss_fn_inputs["logprobs"], positions), abs=1e-4)


def test_turns_whose_prompts_extend_each_other_make_one_datum(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    """Turn 2's prompt is turn 1's prompt, its sampled ids and an observation: one datum whose
    trained positions are exactly the ids sampled in both turns, the observation context only.
    Turn 3's prompt starts afresh: a second datum, with the same advantage."""
    session = open_session(LoraOptions(seed=0))
    first = prompt(resident, "hi")
    observation = prompt(resident, "the tool says 4")
    (s1,), (s3,) = session.sample_batch(
        [
            SampleRequest(first, SamplingParams(max_tokens=MAX_TOKENS, seed=1)),
            SampleRequest(prompt(resident, "start over"), SamplingParams(max_tokens=MAX_TOKENS, seed=3)),
        ]
    )
    second = [*first, *s1.tokens, *observation]
    (s2,) = session.sample_batch([SampleRequest(second, SamplingParams(max_tokens=MAX_TOKENS, seed=2))])[0]
    turns = [
        LiveTurn(first, s1.tokens, s1.logprobs, "bot@0"),
        LiveTurn(second, s2.tokens, s2.logprobs, "bot@0"),
        LiveTurn(prompt(resident, "start over"), s3.tokens, s3.logprobs, "bot@0"),
    ]
    episode = LiveEpisode("e1", "task", 1.0, turns)

    merged, fresh = (segment.datum(0.5) for segment in episode_segments(episode))
    assert merged.model_input == [*second, *s2.tokens][:-1]
    positions = sampled_positions(merged)
    assert at(merged.loss_fn_inputs["target_tokens"], positions) == [*s1.tokens, *s2.tokens]
    assert at(merged.loss_fn_inputs["logprobs"], positions) == [*s1.logprobs, *s2.logprobs]
    assert at(merged.loss_fn_inputs["advantages"], positions) == [0.5] * (2 * MAX_TOKENS)
    assert sum(floats(merged, "advantages")) == 0.5 * 2 * MAX_TOKENS  # the observation is context only
    assert fresh.model_input == [*turns[2].prompt_tokens, *s3.tokens][:-1]
    assert at(fresh.loss_fn_inputs["target_tokens"], sampled_positions(fresh)) == s3.tokens

    # In a run: that episode and a one-turn one of the same task make three data, the first two
    # with the episode's advantage.
    other = LiveEpisode("e2", "task", 0.0, [turns[2]])
    policy = Recording(session)
    (report,) = run_online_rl(
        policy,
        ListFeed([[episode, other]]),
        OnlineRlConfig(steps=1, episodes_per_step=2, learning_rate=5e-3),
        start_version="bot@0",
        publish=lambda steps_done: f"bot@{steps_done}",
    )
    (data, _), *_ = policy.calls
    assert [datum.model_input for datum in data] == [merged.model_input, fresh.model_input, fresh.model_input]
    signs = [sum(floats(datum, "advantages")) > 0 for datum in data]
    assert signs == [True, True, False]
    assert report.metrics["turns"] == 2 and report.metrics["tokens"] == 4 * MAX_TOKENS


def test_a_run_without_signal_stops_and_says_what_to_do(
    open_session: Callable[..., TrainingSession], resident: ResidentBase
) -> None:
    """Episodes without a task key have nothing to be compared with: no signal, and after
    max_steps_without_signal such steps the run stops, each step reported first."""
    session = open_session(LoraOptions(seed=0))
    episodes = [
        replace(episode, task=None)
        for episode in sampled_episodes(session, {"t": prompt(resident, "hi")}, 4, 0, lambda _: None)
    ]
    seen: list[StepReport] = []
    with pytest.raises(NoRewardSignal) as stopped:
        run_online_rl(
            session,
            ListFeed([episodes] * 5),
            OnlineRlConfig(steps=5, episodes_per_step=4, max_steps_without_signal=2),
            start_version=None,  # the base sampled them, and the job starts from it
            publish=lambda steps_done: f"bot@{steps_done}",
            on_step=seen.append,
        )
    assert [report.step for report in seen] == [1, 2]
    assert all(report.metrics["groups_with_signal"] == 0 and "loss" not in report.metrics for report in seen)
    assert stopped.value.type == "no_reward_signal"
    assert stopped.value.message.startswith("no reward signal for 2 steps in a row: no episode carried a task key")


def test_an_empty_feed_ends_the_run(open_session: Callable[..., TrainingSession], resident: ResidentBase) -> None:
    """Step 1 trains (task_mean baseline: a new task is compared with its own mean); step 2 is
    offered only episodes of an unknown version, asks again, and gets nothing: the run ends with
    the one step, its version published, the unfinished step unreported."""
    session = open_session(LoraOptions(seed=0))
    episodes = sampled_episodes(session, {"t": prompt(resident, "hi")}, 4, 0, lambda _: "bot@0")
    unknown = [
        replace(episode, turns=[replace(turn, adapter_version="nobody@1") for turn in episode.turns])
        for episode in episodes
    ]
    feed = ListFeed([episodes, unknown])
    published: list[int] = []

    def publish(steps_done: int) -> str:
        published.append(steps_done)
        return f"bot@{steps_done}"

    reports = run_online_rl(
        session,
        feed,
        OnlineRlConfig(steps=3, episodes_per_step=4, learning_rate=5e-3, baseline="task_mean"),
        start_version="bot@0",
        publish=publish,
    )
    assert [report.step for report in reports] == [1]
    assert reports[0].metrics["samples_with_signal"] == 4 and "loss" in reports[0].metrics
    assert feed.asked == [(0, 4), (1, 4), (1, 4)]
    assert published == [1]


def test_task_mean_advantages_compare_with_the_running_mean() -> None:
    means = TaskMeans()
    # Never seen: each task is compared with its own mean in the step; no task, no signal.
    first = task_mean_advantages(["a", "a", "b", None], [1.0, 0.0, 0.3, 1.0], means)
    # Differences 0.5, -0.5 and 0, whose root mean square is sqrt(1/6).
    assert first == pytest.approx([1.5**0.5, -(1.5**0.5), 0.0, 0.0], abs=1e-5)
    means.add(["a", "a", "b", None], [1.0, 0.0, 0.3, 1.0])
    # All of a step scoring 1 against a running mean of 0.5: +1 each, not a division by a zero std.
    assert task_mean_advantages(["a", "a"], [1.0, 1.0], means) == pytest.approx([1.0, 1.0], abs=1e-5)
    # An episode scoring exactly its task's running mean has no signal, without rounding.
    assert task_mean_advantages(["b", "b"], [0.3, 0.3], means) == [0.0, 0.0]
