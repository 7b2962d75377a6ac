"""Episodes of an agent harness on a deployment, and their rewards.

A deployment whose capture records tokens (`PATCH /v1/deployments/{id}/capture` with
`tokens: true`) records every turn of the episodes its clients mark (`X-Mint-Episode`), token
for token; an episode is read back as one trajectory, and rewarded after the fact by the
harness, a grader's caller or a person (viewer keys too, as for feedback). Online RL jobs
(`method: online_rl`) train the deployment's adapter from its rewarded episodes.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from mint.api.deps import CurrentPrincipal, QuotasDep, SessionDep, SettingsDep
from mint.api.pagination import Limit, page_from
from mint.schemas.common import ID_PATTERN, Page
from mint.schemas.episodes import EPISODE_KEY_PATTERN, EpisodePublic, EpisodeReward
from mint.services.evals import episode_grades
from mint.services.serving import episodes

router = APIRouter(tags=["episodes"])

EpisodeId = Annotated[
    str,
    Path(max_length=128, pattern=EPISODE_KEY_PATTERN, description="The client's key for the episode (X-Mint-Episode)."),
]
EpisodeAfter = Annotated[
    str | None,
    Query(max_length=128, pattern=EPISODE_KEY_PATTERN, description="Cursor: the last key of the previous page."),
]


@router.get("/v1/episodes", response_model=Page[EpisodePublic])
def list_episodes(
    session: SessionDep,
    principal: CurrentPrincipal,
    deployment: Annotated[
        str, Query(min_length=1, max_length=200, pattern=ID_PATTERN, description="The deployment's name or id.")
    ],
    rewarded: Annotated[bool | None, Query(description="Only rewarded episodes (true) or open ones (false).")] = None,
    task: Annotated[
        str | None, Query(max_length=128, pattern=EPISODE_KEY_PATTERN, description="Only the episodes of this task.")
    ] = None,
    after: EpisodeAfter = None,
    limit: Limit = 20,
) -> Page[EpisodePublic]:
    """A deployment's recorded episodes, newest first: each one's reward, tokens and the versions
    that sampled it, without its turns (read one for them)."""
    result = episodes.list_episodes(
        session, principal.organization_id, deployment, rewarded=rewarded, task=task, after=after, limit=limit
    )
    turns = episodes.turns_of(session, [row.id for row in result.rows])
    shown = [episodes.episode_public(row, turns[row.id], whole=False) for row in result.rows]
    return page_from(shown, result.has_more, EpisodePublic)


@router.get("/v1/episodes/{episode_id}", response_model=EpisodePublic)
def get_episode(episode_id: EpisodeId, session: SessionDep, principal: CurrentPrincipal) -> EpisodePublic:
    """One episode as a trajectory: its turns in order, token-exact (prompt ids, sampled ids,
    logprobs, the version that sampled each), the messages the harness added between them (tool
    results), the whole conversation, and its reward."""
    episode = episodes.get_episode(session, principal.organization_id, episode_id)
    turns = episodes.turns_of(session, [episode.id])[episode.id]
    return episodes.episode_public(episode, turns, whole=True)


@router.post("/v1/episodes/{episode_id}/reward", response_model=EpisodePublic)
def reward_episode(
    episode_id: EpisodeId,
    body: EpisodeReward,
    session: SessionDep,
    settings: SettingsDep,
    principal: CurrentPrincipal,
    quotas: QuotasDep,
) -> EpisodePublic:
    """Reward a finished episode: a score (any finite float, [0, 1] by convention), or a grader
    of the registry with its reference (a judge's included: it asks the model its config names),
    run on what the model and the harness added; optionally one score per turn, a label and a
    comment. A later reward replaces it. Any key of the organization, viewers included. Online
    RL trains on an episode once it is rewarded, within its job's `reward_timeout_s` of the
    episode's last turn."""
    if body.grader is not None:
        episode = episode_grades.grade_episode(
            session,
            principal,
            episode_id,
            body,
            quotas=quotas,
            shared_token=settings.shared_node_token,
            allow_private=settings.webhook_allow_private_networks,
        )
    else:
        episode = episodes.reward_episode(session, principal, episode_id, body, quotas=quotas)
    return episodes.episode_public(episode, episodes.turns_of(session, [episode.id])[episode.id], whole=False)
