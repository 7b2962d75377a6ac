"""Episodes: an agent's task on a deployment, recorded turn by turn token-exact, and the reward
given to it afterwards; what online RL (`client.jobs.create_online`) trains from.

The harness marks each request of an episode (with the `openai` client:
`extra_headers={"X-Mint-Episode": key, "X-Mint-Task": task}`), a deployment whose capture
records tokens keeps its turns, and the harness (or a person, with a viewer key) rewards it:

    client.deployments.set_capture("agent-prod", rate=1.0, tokens=True)
    ...                                              # the harness's traffic
    client.episodes.reward("ep-17", 1.0, label="solved")
    for episode in client.episodes.list("agent-prod", rewarded=False):
        print(episode.id, episode.steps, episode.models)
    turns = client.episodes.get("ep-17").turns      # token ids, logprobs, the version of each turn

Keys are the client's own (`[A-Za-z0-9][A-Za-z0-9_.:-]*`); another organization's are never seen.
"""

from __future__ import annotations

import builtins
from typing import Any
from urllib.parse import quote

from mint.schemas.common import Page
from mint.schemas.episodes import EpisodePublic, EpisodeReward
from mint.sdk._http import AsyncHTTP, Call, SyncHTTP, parse_model, request_body
from mint.sdk.pagination import AsyncPager, PageCall, SyncPager


def _path(key: str) -> str:
    # Keys are the client's: quoted, so that no key can name another route.
    return f"/v1/episodes/{quote(key, safe='')}"


def list_episodes(deployment: str, rewarded: bool | None, task: str | None, limit: int) -> PageCall:
    return lambda after: Call(
        "GET",
        "/v1/episodes",
        parse_model(Page[EpisodePublic]),
        {"deployment": deployment, "rewarded": rewarded, "task": task, "after": after, "limit": limit},
    )


def get_episode(key: str) -> Call[EpisodePublic]:
    return Call("GET", _path(key), parse_model(EpisodePublic))


def post_reward(key: str, fields: dict[str, Any]) -> Call[EpisodePublic]:
    body = request_body(EpisodeReward, **fields)
    return Call("POST", f"{_path(key)}/reward", parse_model(EpisodePublic), json=body)


def reward_fields(
    score: float | None,
    turn_scores: list[float] | None,
    label: str | None,
    comment: str | None,
    grader: str | dict[str, Any] | None,
    reference: Any,
) -> dict[str, Any]:
    """The reward's body: a score, or a grader (by name or as `{"type", "config"}`) and its reference."""
    return {
        "score": score,
        "grader": {"type": grader} if isinstance(grader, str) else grader,
        "reference": reference,
        "turn_scores": turn_scores,
        "label": label,
        "comment": comment,
    }


class Episodes:
    """`/v1/episodes`: the recorded episodes of deployments, and their rewards."""

    def __init__(self, http: SyncHTTP) -> None:
        self._http = http

    def list(
        self, deployment: str, *, rewarded: bool | None = None, task: str | None = None, limit: int = 20
    ) -> SyncPager[EpisodePublic]:
        """A deployment's (name or id) episodes, newest first, without their turns: only the
        rewarded ones (`rewarded=True`), the open ones (`False`), or those of one `task`."""
        return SyncPager(self._http, list_episodes(deployment, rewarded, task, limit))

    def get(self, key: str) -> EpisodePublic:
        """One episode with its turns in order (prompt ids, sampled ids, logprobs, the version
        that sampled each, the messages the harness added) and its whole conversation."""
        return self._http.send(get_episode(key))

    def reward(
        self,
        key: str,
        score: float | None = None,
        *,
        turn_scores: builtins.list[float] | None = None,
        label: str | None = None,
        comment: str | None = None,
        grader: str | dict[str, Any] | None = None,
        reference: Any = None,
    ) -> EpisodePublic:
        """Reward a finished episode (viewer keys may): a `score` (any finite float, [0, 1] by
        convention), or a `grader` of the registry run on the episode against `reference`;
        optionally one score per turn, a `label` and a `comment`. A later reward replaces it."""
        fields = reward_fields(score, turn_scores, label, comment, grader, reference)
        return self._http.send(post_reward(key, fields))


class AsyncEpisodes:
    """The twin of `Episodes`, for asyncio."""

    def __init__(self, http: AsyncHTTP) -> None:
        self._http = http

    def list(
        self, deployment: str, *, rewarded: bool | None = None, task: str | None = None, limit: int = 20
    ) -> AsyncPager[EpisodePublic]:
        return AsyncPager(self._http, list_episodes(deployment, rewarded, task, limit))

    async def get(self, key: str) -> EpisodePublic:
        return await self._http.send(get_episode(key))

    async def reward(
        self,
        key: str,
        score: float | None = None,
        *,
        turn_scores: builtins.list[float] | None = None,
        label: str | None = None,
        comment: str | None = None,
        grader: str | dict[str, Any] | None = None,
        reference: Any = None,
    ) -> EpisodePublic:
        fields = reward_fields(score, turn_scores, label, comment, grader, reference)
        return await self._http.send(post_reward(key, fields))
