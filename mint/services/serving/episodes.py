"""Episodes: the turns of an agent's task on a deployment, recorded token-exact, and the reward
given to the whole afterwards. Online RL (`mint.services.jobs.live_episodes`) trains from them.

A client marks the requests of one episode (`X-Mint-Episode`, `X-Mint-Task`, or the request
field `episode`). A deployment whose capture has `tokens` on records every turn of a marked
episode its rate chooses (the choice is made per episode, from its key, so an episode is kept
whole or not at all): the messages the harness sent, the prompt ids as the engine rendered
them, the ids it sampled and their logprobs (the model's own, at temperature 1), the version
that sampled them and the assistant message. Turns are written by the API's capture writer,
like captures, so recording never fails or slows a request beyond one batched commit; the
answer of a recorded turn is sent once its row is committed, so the harness may reward the
episode as soon as it has the last answer.

A reward (`POST /v1/episodes/{key}/reward`) is a score, optionally one per turn, a label and a
comment; any key of the organization may give it (viewers too, as for feedback), and a later
one replaces it. Turns and rewards count against the organization's capture storage quota, and
an episode is deleted with its turns once its deployment's capture retention passes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from mint.errors import InvalidRequest, NotFound
from mint.schemas.episodes import EpisodeMark, EpisodePublic, EpisodeReward, EpisodeTurnPublic
from mint.services.billing.quotas import QuotaDefaults, hold
from mint.services.catalog import get_deployment
from mint.services.principal import Principal
from mint.services.serving.captures import STORAGE_QUOTA, CaptureTarget, expire_kept, json_bytes
from mint.storage.queries import PageResult, children_of, paginate
from mint.storage.tables import Episode, EpisodeTurn, as_utc, utcnow


def episode_row_id(organization_id: str, key: str) -> str:
    """The row id of the organization's episode `key` (keys are the clients', unique per organization)."""
    return "ep_" + hashlib.sha256(f"{organization_id}\n{key}".encode()).hexdigest()[:32]


def records_episode(target: CaptureTarget | None, mark: EpisodeMark | None) -> bool:
    """Whether a request marked `mark` to a deployment capturing as `target` has its turn recorded:
    the deployment records tokens, and its rate chooses the episode (by its key, so every turn
    of an episode is chosen alike)."""
    if target is None or mark is None or not target.tokens:
        return False
    if target.rate >= 1:
        return True
    share = int(hashlib.sha256(mark.id.encode()).hexdigest()[:8], 16) / 2**32
    return share < target.rate


@dataclass(frozen=True)
class EpisodeTurnRecord:
    """One recorded turn, as the API saw it, waiting for the capture writer."""

    id: str
    organization_id: str
    target: CaptureTarget
    mark: EpisodeMark
    revision: int
    model_ref: str
    request: dict[str, Any]
    response: dict[str, Any]
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    latency_ms: float
    created_at: datetime

    @cached_property
    def stored_bytes(self) -> int:
        """What its row counts against the organization's capture storage quota."""
        return (
            json_bytes(self.request)
            + json_bytes(self.response)
            + json_bytes(self.prompt_token_ids)
            + json_bytes(self.token_ids)
            + json_bytes(self.logprobs)
        )

    def write(self, session: Session) -> None:
        """Add the turn, and its episode's row when this is its first turn (another API replica
        may add that row at the same moment: the loser reads the winner's)."""
        episode_id = episode_row_id(self.organization_id, self.mark.id)
        episode = session.get(Episode, episode_id)
        if episode is None:
            try:
                with session.begin_nested():
                    episode = Episode(
                        id=episode_id,
                        organization_id=self.organization_id,
                        deployment_id=self.target.deployment_id,
                        key=self.mark.id,
                        task=self.mark.task,
                        turn_count=0,
                        stored_bytes=0,
                        created_at=self.created_at,
                        last_turn_at=self.created_at,
                        expires_at=self.created_at + timedelta(days=self.target.retention_days),
                    )
                    session.add(episode)
            except IntegrityError:
                episode = session.get(Episode, episode_id)
                assert episode is not None
        episode.turn_count += 1
        episode.stored_bytes += self.stored_bytes
        episode.last_turn_at = max(as_utc(episode.last_turn_at), self.created_at)
        session.add(
            EpisodeTurn(
                id=self.id,
                organization_id=self.organization_id,
                episode_id=episode_id,
                revision=self.revision,
                model_ref=self.model_ref,
                request=self.request,
                response=self.response,
                prompt_token_ids=self.prompt_token_ids,
                token_ids=self.token_ids,
                logprobs=self.logprobs,
                latency_ms=self.latency_ms,
                stored_bytes=self.stored_bytes,
                created_at=self.created_at,
            )
        )
        session.flush()


# ---- reading -------------------------------------------------------------------------------------


def get_episode(session: Session, organization_id: str, key: str) -> Episode:
    """The organization's episode `key`; NotFound says what records one."""
    episode = session.get(Episode, episode_row_id(organization_id, key))
    if episode is None:
        raise NotFound(
            f"no episode {key!r}: an episode is recorded when its requests carry the header X-Mint-Episode "
            "(or the field `episode`) and go to a deployment whose capture records tokens and chooses it "
            '(PATCH /v1/deployments/{id}/capture {"rate": 1, "tokens": true}); an answer says whether its turn '
            "was recorded in its X-Mint-Episode-Recorded header. Episodes are deleted once the deployment's "
            "retention passes",
            param="episode_id",
        )
    return episode


def turns_of(session: Session, episode_ids: list[str]) -> dict[str, list[EpisodeTurn]]:
    """Each episode's turns, in the order they were served."""
    return children_of(session, EpisodeTurn, EpisodeTurn.episode_id, episode_ids)


def list_episodes(
    session: Session,
    organization_id: str,
    deployment: str,
    *,
    rewarded: bool | None,
    task: str | None,
    after: str | None,
    limit: int,
) -> PageResult[Episode]:
    """A deployment's episodes, newest first; only those rewarded (or not), or of one task."""
    found = get_deployment(session, organization_id, deployment)
    query = select(Episode).where(Episode.deployment_id == found.id)
    if rewarded is not None:
        query = query.where(Episode.reward.is_not(None) if rewarded else Episode.reward.is_(None))
    if task is not None:
        query = query.where(Episode.task == task)
    if after is not None:  # the page cursor is the client's key; paginate reads row ids
        after = episode_row_id(organization_id, after)
    return paginate(session, query, Episode, after=after, limit=limit)


def _added(previous: EpisodeTurn | None, turn: EpisodeTurn) -> list[Any]:
    """The messages `turn`'s request added to the conversation of `previous` (its request and
    its answer): the tool results and replies the harness sent back. A harness that rewrote the
    earlier conversation added all of its messages."""
    messages = list(turn.request.get("messages") or [])
    if previous is None:
        return messages
    before = [*(previous.request.get("messages") or []), previous.response.get("message")]
    seen = len(before)
    if len(messages) >= seen and [m.get("role") for m in messages[:seen]] == [(m or {}).get("role") for m in before]:
        return messages[seen:]
    return messages


def trajectory_output(public: EpisodePublic) -> list[Any]:
    """What the model and the harness added after the episode's first prompt, in order: what a
    grader reads of an episode, as it reads an eval trajectory."""
    turns = public.turns or []
    if not turns:
        return []
    added: list[Any] = []
    for index, turn in enumerate(turns):
        if index:
            added += turn.added_messages
        if turn.message is not None:
            added.append(turn.message)
    return added


def episode_public(episode: Episode, turns: list[EpisodeTurn] | None, *, whole: bool) -> EpisodePublic:
    """An episode as the API shows it; `whole` (read alone) adds its turns and conversation."""
    turns = turns or []
    models: list[str] = []
    for turn in turns:
        if turn.model_ref not in models:
            models.append(turn.model_ref)
    public = EpisodePublic(
        id=episode.key,
        deployment_id=episode.deployment_id,
        task=episode.task,
        status="rewarded" if episode.reward is not None else "open",
        reward=episode.reward,
        turn_scores=episode.turn_scores,
        label=episode.label,
        comment=episode.comment,
        rewarded_by=episode.rewarded_by,
        rewarded_at=episode.rewarded_at,
        steps=episode.turn_count,
        tokens_in=sum(len(turn.prompt_token_ids) for turn in turns),
        tokens_out=sum(len(turn.token_ids) for turn in turns),
        latency_ms=sum(turn.latency_ms for turn in turns),
        models=models,
        created_at=episode.created_at,
        last_turn_at=episode.last_turn_at,
        expires_at=episode.expires_at,
    )
    if not whole:
        return public
    shown = []
    previous = None
    for index, turn in enumerate(turns):
        shown.append(
            EpisodeTurnPublic(
                id=turn.id,
                index=index,
                model=turn.model_ref,
                revision=turn.revision,
                added_messages=_added(previous, turn),
                message=turn.response.get("message"),
                finish_reason=turn.response.get("finish_reason"),
                prompt_token_ids=turn.prompt_token_ids,
                token_ids=turn.token_ids,
                logprobs=turn.logprobs,
                latency_ms=turn.latency_ms,
                created_at=turn.created_at,
            )
        )
        previous = turn
    messages: list[Any] = []
    for entry in shown:
        messages += entry.added_messages
        if entry.message is not None:
            messages.append(entry.message)
    return public.model_copy(update={"turns": shown, "messages": messages})


# ---- rewards -------------------------------------------------------------------------------------


def reward_episode(
    session: Session,
    principal: Principal,
    key: str,
    body: EpisodeReward,
    *,
    quotas: QuotaDefaults,
    episode: Episode | None = None,
    by: str | None = None,
) -> Episode:
    """Record an episode's reward (any key of its organization, viewers too); a later reward
    replaces it. Per-turn scores must be one per recorded turn; the reward counts against the
    organization's capture storage quota (429 past it). A grader's reward comes with its score
    in `body` and the grader named in `by`."""
    assert body.score is not None, "a grader's reward is computed first (mint.services.evals.episode_grades)"
    episode = episode or get_episode(session, principal.organization_id, key)
    if body.turn_scores is not None and len(body.turn_scores) != episode.turn_count:
        raise InvalidRequest(
            f"turn_scores gives {len(body.turn_scores)} scores, and episode {key!r} has {episode.turn_count} "
            "recorded turns: give one score per turn, in order, or none",
            param="turn_scores",
        )
    size = json_bytes(body.model_dump(mode="json", include={"score", "turn_scores", "label", "comment"}))
    given = {"score": episode.reward, "turn_scores": episode.turn_scores, "label": episode.label}
    before = json_bytes(given | {"comment": episode.comment}) if episode.reward is not None else 0
    hold(session, episode.organization_id, STORAGE_QUOTA, quotas, adding=max(0, size - before))
    episode.reward = body.score
    episode.turn_scores = body.turn_scores
    episode.label = body.label
    episode.comment = body.comment
    episode.rewarded_by = principal.name if by is None else f"{principal.name} ({by})"
    episode.rewarded_at = utcnow()
    episode.stored_bytes += size - before
    session.flush()
    return episode


def expire_episodes(session: Session, *, now: datetime | None = None, batch: int = 500) -> list[str]:
    """Delete up to `batch` episodes past their retention, with their turns."""
    return expire_kept(session, Episode, EpisodeTurn, EpisodeTurn.episode_id, now=now, batch=batch)
