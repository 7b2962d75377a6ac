"""Multi-turn episodes for RL: a policy acts in an environment over several turns, and the
episode becomes one training datum made of the exact token ids that were sampled.

An environment has the shape of the tinker-cookbook's `Env`, in chat messages rather than
tokens (so one environment serves any base's chat template):

    env.tools                          # the tools it offers (OpenAI format), or None
    env.initial_observation()          # -> the conversation the policy starts from (messages)
    env.step(assistant_message)        # -> (observation messages, reward, done)

`run_episodes` plays `group_size` episodes of one environment source:

    tokens = render_prompt(initial observation)          # rendered once
    turn:  sampled = policy.sample_batch(...)            # appended as they are, never re-tokenized
           message = the assistant message read from their text (for the environment only)
           observation, reward, done = env.step(message)
           tokens += render_continuation(observation)    # the template's delta after the turn's
                                                         # end-of-turn token
    until done, `max_turns`, a turn cut at `max_tokens`, or the context is full.

`EpisodeGroups` plays the episodes of many groups (an RL step's prompts) in rounds: each round,
the next turn of every live episode is one request of one `sample_batch` call, so a whole step
decodes as one batch per turn.

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

from mint.chat.completion_text import sampled_text
from mint.chat.render import render_continuation, render_prompt
from mint.errors import InvalidRequest
from mint.trainer.types import Datum, SampledSequence, SampleRequest, SamplingParams, close_environment

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
    """What plays episodes: many requests sampled in one batch, one list of samples per request."""

    def sample_batch(self, requests: Sequence[SampleRequest]) -> list[list[SampledSequence]]: ...


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
    # The adapter version that sampled the turn (`SampledSequence.adapter_version`).
    adapter_version: str | None = None


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

    def sampling(self, seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature, seed=seed)


def assistant_message(tokenizer: PreTrainedTokenizerBase, sample: SampledSequence) -> dict[str, Any]:
    """The assistant message a turn's sample reads as: its text without the token that stopped it
    (`mint.chat.completion_text`), trimmed as a message's content is."""
    return {"role": "assistant", "content": sampled_text(tokenizer, sample).strip()}


class _Play:
    """One episode on its way: the conversation and token ids so far, and the request of its next
    turn (None once it is over)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, env: Env, episode: Episode, limits: EpisodeLimits, seed: int
    ) -> None:
        self.tokenizer, self.env, self.episode, self.limits, self.seed = tokenizer, env, episode, limits, seed
        self.conversation = list(episode.messages)
        self.tokens = list(episode.prompt_tokens)
        self.observation_tokens: list[int] = []  # the delta the pending next turn is sampled after
        self.next: SampleRequest | None = None

    def take(self, sample: SampledSequence) -> None:
        """Play a sampled turn: give the environment its action, record the turn, and prepare the
        next turn's request unless the episode ends here."""
        if self.episode.turns:  # the sample continues the conversation after the last observation
            self.episode.turns[-1] = replace(self.episode.turns[-1], observation_tokens=self.observation_tokens)
            self.tokens += self.observation_tokens
        self.next = None
        turn_number = len(self.episode.turns) + 1
        message = assistant_message(self.tokenizer, sample)
        observation, reward, done = self.env.step(message)
        observation = [dict(item) for item in observation]
        turn = Turn(
            list(sample.tokens),
            list(sample.logprobs),
            message,
            observation,
            float(reward),
            sampler_logprobs=sample.sampler_logprobs,
            adapter_version=sample.adapter_version,
        )
        self.episode.turns.append(turn)
        self.tokens += turn.tokens
        self.conversation.append(message)
        stop = _stop_reason(done, turn_number, self.limits, sample)
        if stop is not None:
            self._stop(stop)
            return
        continuation = render_continuation(self.tokenizer, self.conversation, observation, self.episode.tools)
        if turn.tokens[-1] != continuation.end_of_turn:
            self._stop("end_of_sequence")
            return
        self.conversation += observation
        self.observation_tokens = continuation.tokens
        self.next = SampleRequest([*self.tokens, *continuation.tokens], self.limits.sampling(self.seed + turn_number))

    def refused(self) -> None:
        """The policy refused the next turn: the conversation no longer fits the base's context."""
        self._stop("context")
        self.next = None

    def _stop(self, reason: StopReason) -> None:
        self.episode.stop_reason = reason
        if reason != "done":
            close_environment(self.env)


class EpisodeGroups:
    """Groups of `group_size` episodes, one group per environment source, played together: each
    round asks for the next turn of every live episode of every group (`requests`) and plays
    the answers (`take`), so that a policy samples a whole round in one batch.

    A group's first turn is one request of `group_size` samples when its episodes' prompts
    agree (one prefill), else one request per episode, under the group's seed; later turns of
    episode `i` use `seed + 7919 * (i + 1) + turn`. Seeds depend only on the group's seed and
    the episode, never on what else is in the round.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None,
        sources: Sequence[tuple[Callable[[], Env], int]],
        group_size: int,
        limits: EpisodeLimits,
    ) -> None:
        self.limits = limits
        self._seeds = [seed for _, seed in sources]
        self._groups: list[list[_Play]] = []
        for make_env, seed in sources:
            if tokenizer is None:
                raise ValueError("prompts with an environment need the tokenizer, to render observations")
            plays = []
            for index in range(group_size):
                env = make_env()
                messages = [dict(message) for message in env.initial_observation()]
                tools = [dict(tool) for tool in env.tools] if env.tools else None
                episode = Episode(messages, tools, render_prompt(tokenizer, messages, tools))
                plays.append(_Play(tokenizer, env, episode, limits, seed=seed + 7919 * (index + 1)))
            self._groups.append(plays)
        self._asked: list[list[_Play]] = []  # per request of the round: the episodes its samples go to
        self.started = False

    @property
    def episodes(self) -> list[list[Episode]]:
        """Each group's episodes, in order."""
        return [[play.episode for play in plays] for plays in self._groups]

    def requests(self) -> list[SampleRequest]:
        """The round's requests: every group's first turn, then every live episode's next turn; [] when all are over."""
        requests: list[SampleRequest] = []
        self._asked = []
        if not self.started:
            for seed, plays in zip(self._seeds, self._groups, strict=True):
                params = self.limits.sampling(seed)
                prompts = [play.episode.prompt_tokens for play in plays]
                if all(prompt == prompts[0] for prompt in prompts):
                    requests.append(SampleRequest(prompts[0], params, len(plays)))
                    self._asked.append(plays)
                else:
                    requests += [SampleRequest(prompt, params) for prompt in prompts]
                    self._asked += [[play] for play in plays]
            return requests
        for plays in self._groups:
            for play in plays:
                if play.next is not None:
                    requests.append(play.next)
                    self._asked.append([play])
        return requests

    def take(self, outcomes: Sequence[list[SampledSequence] | InvalidRequest]) -> None:
        """Play the round's answers, one per request of `requests` in order: its samples, or the
        policy's refusal of a later turn (the episode ends with stop reason `context`)."""
        for plays, outcome in zip(self._asked, outcomes, strict=True):
            if isinstance(outcome, InvalidRequest):
                if not self.started:
                    raise outcome  # a first prompt the base cannot run: the caller's to fix
                plays[0].refused()
                continue
            for play, sample in zip(plays, outcome, strict=True):
                play.take(sample)
        self.started = True


def sample_each(policy: Sampler, requests: Sequence[SampleRequest]) -> list[list[SampledSequence] | InvalidRequest]:
    """Every request's samples, in one batch; if the policy refuses the batch, each request alone,
    so that only a request it cannot run (a conversation that outgrew the context) is refused."""
    try:
        return list(policy.sample_batch(requests))
    except InvalidRequest:
        if len(requests) == 1:
            raise
    outcomes: list[list[SampledSequence] | InvalidRequest] = []
    for request in requests:
        try:
            outcomes.append(policy.sample_batch([request])[0])
        except InvalidRequest as exc:
            outcomes.append(exc)
    return outcomes


def play(policy: Sampler, groups: EpisodeGroups) -> None:
    """Play every episode of `groups` to its end, each round of turns sampled in one batch. A
    first prompt the policy refuses raises; a later turn it refuses ends only its episode."""
    while requests := groups.requests():
        if groups.started:
            groups.take(sample_each(policy, requests))
        else:
            groups.take(policy.sample_batch(requests))


def run_episodes(
    policy: Sampler,
    tokenizer: PreTrainedTokenizerBase,
    make_env: Callable[[], Env],
    group_size: int,
    limits: EpisodeLimits,
    seed: int,
) -> list[Episode]:
    """`group_size` episodes, each in a fresh environment from `make_env`: one group of `EpisodeGroups`."""
    groups = EpisodeGroups(tokenizer, [(make_env, seed)], group_size, limits)
    play(policy, groups)
    return groups.episodes[0]


def _stop_reason(done: bool, turn_number: int, limits: EpisodeLimits, sample: SampledSequence) -> StopReason | None:
    """Why the episode ends after this turn, or None when it goes on."""
    if done:
        return "done"
    if turn_number == limits.max_turns:
        return "max_turns"
    if sample.stop_reason == "length" or not sample.tokens:
        return "max_tokens"
    return None
