"""Multi-turn episodes for RL: a policy acts in an environment over several turns, and the
episode becomes one training datum made of the exact token ids that were sampled.

An environment has the shape of the tinker-cookbook's `Env`, in chat messages rather than
tokens (so one environment serves any base's chat template):

    env.tools                          # the tools it offers (OpenAI format), or None
    env.initial_observation()          # -> the conversation the policy starts from (messages)
    env.step(assistant_message)        # -> (observation messages, reward, done)

`run_episodes` plays `group_size` episodes of one environment source:

    tokens = render_prompt(initial observation)          # rendered once
    turn:  sampled = policy.sample(tokens)               # appended as they are, never re-tokenized
           message = the assistant message read from their text (for the environment only)
           observation, reward, done = env.step(message)
           tokens += render_continuation(observation)    # the template's delta after the turn's
                                                         # end-of-turn token
    until done, `max_turns`, a turn cut at `max_tokens`, or the context is full.

Text is read from the sampled ids only to give the environment its action; the ids trained on
are the ids sampled. The delta starts after a special token (ChatML's `<|im_end|>`), a
boundary of tokenization, so appending it never changes how earlier turns tokenize. A turn
that ends without the template's end-of-turn token (cut at `max_tokens`, or another
end-of-sequence token) ends the episode, since no observation can follow it faithfully.

`Episode.datum(advantage)` is the whole sequence with the sampled logprobs and the advantage
on the sampled positions only: the prompt and every observation are context, never targets.
No torch here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from mint.chat.render import render_continuation, render_prompt
from mint.errors import InvalidRequest
from mint.trainer.types import Datum, SampledSequence, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Turns one episode may take: an RL plan's `max_turns` is at most this.
MAX_TURNS = 32

StopReason = Literal["done", "max_turns", "max_tokens", "end_of_sequence", "context"]


class Env(Protocol):
    """An environment the policy acts in, one episode per instance."""

    @property
    def tools(self) -> Sequence[Mapping[str, Any]] | None: ...

    def initial_observation(self) -> Sequence[Mapping[str, Any]]: ...

    def step(self, action: Mapping[str, Any]) -> tuple[Sequence[Mapping[str, Any]], float, bool]: ...


class Sampler(Protocol):
    def sample(
        self, prompt_tokens: Sequence[int], params: SamplingParams, num_samples: int = 1
    ) -> list[SampledSequence]: ...


@dataclass(frozen=True)
class Turn:
    """One assistant turn: the ids sampled with their logprobs, the message read from them,
    what the environment answered and rewarded, and the observation's tokens appended after
    the turn (empty when the episode ended with it)."""

    tokens: list[int]
    logprobs: list[float]
    message: dict[str, Any]
    observation: list[dict[str, Any]]
    reward: float
    observation_tokens: list[int] = field(default_factory=list)
    # Each sampled token's logprob under the distribution it was drawn from, when the sampler
    # recorded it (what stable_reinforce weighs against).
    sampler_logprobs: list[float] | None = None


@dataclass
class Episode:
    """One episode: the rendered prompt, its turns and why it stopped."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt_tokens: list[int]
    turns: list[Turn] = field(default_factory=list)
    stop_reason: StopReason = "done"

    @property
    def tokens(self) -> list[int]:
        """prompt + (sampled ids + observation delta) per turn: the sequence the datum trains on."""
        tokens = list(self.prompt_tokens)
        for turn in self.turns:
            tokens += turn.tokens + turn.observation_tokens
        return tokens

    @property
    def sampled_tokens(self) -> int:
        return sum(len(turn.tokens) for turn in self.turns)

    @property
    def environment_reward(self) -> float:
        return sum(turn.reward for turn in self.turns)

    @property
    def added(self) -> list[dict[str, Any]]:
        """The messages the policy and the environment added (what graders read)."""
        return [message for turn in self.turns for message in (turn.message, *turn.observation)]

    def datum(self, advantage: float) -> Datum:
        """The whole sequence; sampled logprobs and `advantage` on sampled positions, 0 elsewhere.

        `weights` mark the sampled positions (dro's penalty covers only them); `sampler_logprobs`,
        when every turn's sampler recorded them, are what stable_reinforce weighs against."""
        tokens = self.tokens
        positions = len(tokens) - 1
        logprobs, advantages, weights = [0.0] * positions, [0.0] * positions, [0.0] * positions
        recorded = all(turn.sampler_logprobs is not None for turn in self.turns)
        sampler = [0.0] * positions
        position = len(self.prompt_tokens) - 1  # the position that predicts the first sampled token
        for turn in self.turns:
            for offset, logprob in enumerate(turn.logprobs):
                logprobs[position + offset] = logprob
                advantages[position + offset] = advantage
                weights[position + offset] = 1.0
                if recorded:
                    sampler[position + offset] = turn.sampler_logprobs[offset]  # type: ignore[index]
            position += len(turn.tokens) + len(turn.observation_tokens)
        inputs: dict[str, list[int] | list[float]] = {
            "target_tokens": tokens[1:],
            "logprobs": logprobs,
            "advantages": advantages,
            "weights": weights,
        }
        if recorded:
            inputs["sampler_logprobs"] = sampler
        return Datum(model_input=tokens[:-1], loss_fn_inputs=inputs)


@dataclass(frozen=True)
class EpisodeLimits:
    """Turns per episode, tokens per turn, and how to sample."""

    max_turns: int
    max_tokens: int
    temperature: float


def assistant_message(tokenizer: PreTrainedTokenizerBase, tokens: Sequence[int]) -> dict[str, Any]:
    """The assistant message a turn's ids read as (its text, special tokens dropped)."""
    return {"role": "assistant", "content": tokenizer.decode(list(tokens), skip_special_tokens=True).strip()}


def run_episodes(
    policy: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    make_env: Callable[[], Env],
    group_size: int,
    limits: EpisodeLimits,
    seed: int,
) -> list[Episode]:
    """`group_size` episodes, each in a fresh environment from `make_env`. The first turn of a
    group whose prompts agree is sampled in one call; later turns one episode at a time."""
    envs = [make_env() for _ in range(group_size)]
    episodes = []
    for env in envs:
        messages = [dict(message) for message in env.initial_observation()]
        tools = [dict(tool) for tool in env.tools] if env.tools else None
        episodes.append(Episode(messages, tools, render_prompt(tokenizer, messages, tools)))
    first = [episode.prompt_tokens for episode in episodes]
    params = SamplingParams(max_tokens=limits.max_tokens, temperature=limits.temperature, seed=seed)
    if all(tokens == first[0] for tokens in first):
        samples = policy.sample(first[0], params, num_samples=group_size)
    else:
        samples = [policy.sample(tokens, params, num_samples=1)[0] for tokens in first]
    for index, (env, episode, sample) in enumerate(zip(envs, episodes, samples, strict=True)):
        _play(policy, tokenizer, env, episode, sample, limits, seed=seed + 7919 * (index + 1))
    return episodes


def _play(
    policy: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    env: Env,
    episode: Episode,
    sample: SampledSequence,
    limits: EpisodeLimits,
    seed: int,
) -> None:
    """Play one episode on from its first sampled turn."""
    conversation = list(episode.messages)
    tokens = list(episode.prompt_tokens)
    for turn_number in range(1, limits.max_turns + 1):
        message = assistant_message(tokenizer, sample.tokens)
        observation, reward, done = env.step(message)
        observation = [dict(item) for item in observation]
        turn = Turn(
            list(sample.tokens),
            list(sample.logprobs),
            message,
            observation,
            float(reward),
            sampler_logprobs=sample.sampler_logprobs,
        )
        episode.turns.append(turn)
        tokens += turn.tokens
        conversation.append(message)
        stop = _stop_reason(done, turn_number, limits, sample)
        if stop is not None:
            episode.stop_reason = stop
            return
        continuation = render_continuation(tokenizer, conversation, observation, episode.tools)
        if turn.tokens[-1] != continuation.end_of_turn:
            episode.stop_reason = "end_of_sequence"
            return
        conversation += observation
        params = SamplingParams(max_tokens=limits.max_tokens, temperature=limits.temperature, seed=seed + turn_number)
        try:
            sample = policy.sample([*tokens, *continuation.tokens], params, num_samples=1)[0]
        except InvalidRequest:  # the conversation no longer fits the base's context
            episode.stop_reason = "context"
            return
        episode.turns[-1] = replace(turn, observation_tokens=continuation.tokens)
        tokens += continuation.tokens


def _stop_reason(done: bool, turn_number: int, limits: EpisodeLimits, sample: SampledSequence) -> StopReason | None:
    """Why the episode ends after this turn, or None when it goes on."""
    if done:
        return "done"
    if turn_number == limits.max_turns:
        return "max_turns"
    if sample.stop_reason == "length" or not sample.tokens:
        return "max_tokens"
    return None
