"""Every sample carries the version of the weights that generated it, and RL refuses a step
whose sampler served other weights than the policy's: updates reach the sampler in memory."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from mint.chat.render import render_prompt
from mint.errors import InvalidRequest
from mint.evals.builtin import Task, load_builtin
from mint.evals.graders import GraderSpec
from mint.trainer.recipes.rl import RlConfig, RlPrompt, StaleSampler, run_rl
from mint.trainer.recipes.rollout_sources import Ahead, PolicyVersions
from mint.trainer.sampling_passes import BASE_VERSION
from mint.trainer.session import ResidentBase
from mint.trainer.training_session import TrainingSession
from mint.trainer.types import AdamParams, Datum, ForwardOutput, LoraOptions, SampledSequence, SampleRequest

pytestmark = pytest.mark.backend_free

PARAMS = {"max_tokens": 3, "temperature": 1.0, "seed": 5}


def _request(resident: ResidentBase) -> SampleRequest:
    from mint.trainer.types import SamplingParams

    tokens = render_prompt(resident.tokenizer, [{"role": "user", "content": "Say hi"}])
    return SampleRequest(tokens, SamplingParams(**PARAMS), 2)


def test_samples_carry_the_version_of_the_weights_that_generated_them(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], sft: Callable[..., Datum]
) -> None:
    session = open_session(LoraOptions(seed=0))
    twin = open_session(LoraOptions(seed=0))
    before = session.version
    assert twin.version == before  # the same bytes, the same version
    assert {s.adapter_version for s in session.sample_batch([_request(resident)])[0]} == {before}
    assert {s.adapter_version for s in resident.sample_batch(None, [_request(resident)])[0]} == {BASE_VERSION}

    session.forward_backward([sft([17, 932, 4401, 88, 1203, 7, 311])], "cross_entropy")
    session.optim_step(AdamParams(learning_rate=1e-2))
    after = session.version
    assert after != before and twin.version == before
    assert {s.adapter_version for s in session.sample_batch([_request(resident)])[0]} == {after}
    # Loading other weights in memory makes the twin the same version again.
    twin.load_adapter_weights({name: p.detach().clone() for name, p in session.named_parameters().items()})
    assert twin.version == after


class SnapshotPolicy:
    """Trains `live`; samples from `sampler`, a second adapter that gets `live`'s weights in
    memory after each update when `hot_updates`, and never otherwise (a stale sampler)."""

    def __init__(self, live: TrainingSession, sampler: TrainingSession, *, hot_updates: bool) -> None:
        self.live, self.sampler, self.hot_updates = live, sampler, hot_updates

    @property
    def version(self) -> str:
        return self.live.version

    def sample_batch(self, requests: Sequence[SampleRequest]) -> list[list[SampledSequence]]:
        return self.sampler.sample_batch(requests)

    def forward(self, data: Sequence[Datum], loss_fn: str | None = None, config: object = None) -> ForwardOutput:
        return self.live.forward(data, loss_fn)

    def forward_backward(self, data: Sequence[Datum], loss_fn: str, loss_fn_config: object = None) -> ForwardOutput:
        return self.live.forward_backward(data, loss_fn)

    def optim_step(self, adam: AdamParams | None = None) -> dict[str, float]:
        metrics = self.live.optim_step(adam)
        if self.hot_updates:
            self.sampler.load_adapter_weights({n: p.detach().clone() for n, p in self.live.named_parameters().items()})
        return metrics


@pytest.mark.parametrize("hot_updates", [True, False])
def test_rl_fails_loudly_when_its_sampler_keeps_serving_an_old_version(
    resident: ResidentBase, open_session: Callable[..., TrainingSession], hot_updates: bool
) -> None:
    grader = GraderSpec(type="regex", config={"pattern": "^[A-Z]", "mode": "search"})
    tasks: list[Task] = load_builtin("format", "train", 4, seed=0)
    prompts = [RlPrompt(render_prompt(resident.tokenizer, task.messages), None, grader) for task in tasks]
    live, sampler = open_session(LoraOptions(seed=0)), open_session(LoraOptions(seed=0))
    policy = SnapshotPolicy(live, sampler, hot_updates=hot_updates)
    config = RlConfig(steps=3, prompts_per_step=2, group_size=8, max_tokens=3, learning_rate=5e-3)
    if hot_updates:
        assert len(run_rl(policy, prompts, config, tokenizer=resident.tokenizer)) == 3
        assert policy.sampler.version == policy.live.version
        return
    with pytest.raises(StaleSampler) as stale:
        run_rl(policy, prompts, config, tokenizer=resident.tokenizer)
    assert stale.value.type == "stale_sampler"
    assert stale.value.message.startswith("RL step 2 sampled with adapter version(s) ['"), stale.value.message
    assert "the sampler serves stale weights" in stale.value.message


def test_off_policy_rl_samples_ahead_with_a_copy_refreshed_in_memory(
    resident: ResidentBase, open_session: Callable[..., TrainingSession]
) -> None:
    """max_steps_off_policy=1: a copy of the policy samples the next step while the policy trains;
    every step's samples are at most one update old, and the copy is closed at the end."""
    grader = GraderSpec(type="regex", config={"pattern": "^[A-Z]", "mode": "search"})
    tasks: list[Task] = load_builtin("format", "train", 4, seed=0)
    prompts = [RlPrompt(render_prompt(resident.tokenizer, task.messages), None, grader) for task in tasks]
    policy = open_session(LoraOptions(seed=0))
    start = policy.version
    sessions = len(resident.sessions)
    config = RlConfig(
        steps=4, prompts_per_step=2, group_size=8, max_tokens=3, learning_rate=5e-3, max_steps_off_policy=1
    )
    reports = run_rl(policy, prompts, config, tokenizer=resident.tokenizer)
    assert [report.step for report in reports] == [1, 2, 3, 4]
    assert reports[0].metrics["off_policy_steps"] == 0  # nothing to lag behind before the first update
    assert all(0 <= report.metrics["off_policy_steps"] <= 1 for report in reports)
    assert policy.version != start and policy.step == 4
    assert len(resident.sessions) == sessions  # the sampler copy is gone


def test_the_sampler_runs_ahead_by_at_most_max_steps_off_policy() -> None:
    """`Ahead` samples step s only once the policy has taken s - k updates, and before the policy
    has trained the steps in between: sampling overlaps training."""
    sampled_after: dict[int, int] = {}
    trained = [0]
    step_one_sampled = threading.Event()

    def sample_step(sampler: str, step: int) -> str:
        sampled_after[step] = trained[0]
        if step == 1:
            step_one_sampled.set()
        return f"{sampler}:{step}"

    refreshed: list[int] = []
    ahead = Ahead("copy", lambda: refreshed.append(trained[0]), sample_step, range(0, 4), max_steps_off_policy=1)
    ahead.start()
    try:
        assert ahead.rollouts(0) == "copy:0"
        assert step_one_sampled.wait(timeout=60)  # sampled while step 0 has not trained yet
        for step in range(1, 4):
            trained[0] = step
            ahead.trained(step)
            assert ahead.rollouts(step) == f"copy:{step}"
    finally:
        ahead.stop()
    assert sampled_after[0] == sampled_after[1] == 0
    assert all(step - sampled_after[step] <= 1 for step in range(4))
    assert len(refreshed) == 4  # the copy took the policy's newest weights before each step


def test_a_sample_older_than_allowed_is_refused_naming_the_bound() -> None:
    versions = PolicyVersions("v0", 0)
    versions.record("v1", 1)
    versions.record("v2", 2)
    assert versions.lag(2, ["v2", "v1", "v1"], max_steps_off_policy=1) == pytest.approx(2 / 3)
    with pytest.raises(StaleSampler) as stale:
        versions.lag(2, ["v2", "v0"], max_steps_off_policy=1)
    assert "['v0']" in stale.value.message and "up to 1 updates before it" in stale.value.message
    with pytest.raises(StaleSampler):
        versions.lag(2, ["elsewhere"], max_steps_off_policy=8)  # weights the policy never had


def test_an_error_while_sampling_ahead_reaches_the_training_thread() -> None:
    def sample_step(sampler: str, step: int) -> str:
        if step == 1:
            raise InvalidRequest("prompt too long")
        return "ok"

    ahead = Ahead("copy", lambda: None, sample_step, range(0, 3), max_steps_off_policy=2)
    ahead.start()
    try:
        assert ahead.rollouts(0) == "ok"
        with pytest.raises(InvalidRequest, match="prompt too long"):
            ahead.rollouts(1)
    finally:
        ahead.stop()
