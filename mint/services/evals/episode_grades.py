"""A grader run on a finished episode, its score the episode's reward: any grader of the
registry, on what the model and the harness added after the first prompt (as it reads an eval
trajectory), against the reference the caller gives. A `remote` grader asks the organization's
reward endpoint (`mint.services.evals.remote_rewards`). A `judge` grader asks the model its config
names (a base, an adapter version or a deployment of the organization) through that model's
serving nodes, greedily, as an eval run's judge does; nothing the caller sends runs as code.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from mint.errors import InvalidRequest, MintError, ServiceUnavailable
from mint.evals.graders import GradeContext, GraderSpec, grade
from mint.schemas.episodes import MAX_COMMENT, EpisodeReward
from mint.schemas.node import NodeChoiceLine, NodeCompletion
from mint.services.billing.quotas import QuotaDefaults
from mint.services.evals.remote_rewards import RemoteRewards
from mint.services.evals.reward_endpoints import check_graders
from mint.services.principal import Principal
from mint.services.serving import episodes
from mint.services.serving.inference import plan_for
from mint.services.serving.node_client import complete
from mint.services.serving.nodes import nodes_for
from mint.storage.tables import Episode

JUDGE_MAX_TOKENS = 256


class _Judge:
    """`GradeContext.judge` for one grading: the model a judge grader names, asked on its nodes."""

    def __init__(self, session: Session, organization_id: str, shared_token: str | None) -> None:
        self.session, self.organization_id, self.shared_token = session, organization_id, shared_token

    def __call__(self, prompt: str, model: str | None) -> str:
        if model is None:
            raise InvalidRequest(
                "a judge grader of an episode names its model in config.model (a base, adapter@version or deployment)",
                param="grader",
            )
        plan = plan_for(self.session, self.organization_id, model)
        request = NodeCompletion(
            messages=[{"role": "user", "content": prompt}],
            adapter=plan.adapter,
            mixture=plan.mixture,
            max_tokens=JUDGE_MAX_TOKENS,
            temperature=0.0,
            seed=0,
        )
        failures: list[str] = []
        for node in nodes_for(self.session, plan.base_model, plan.affinity, self.shared_token, share=plan.share):
            try:
                lines = complete(node, request)
            except MintError as exc:
                failures.append(exc.message)
                continue
            return "".join(NodeChoiceLine.model_validate(line).text for line in lines[1:])
        raise ServiceUnavailable(
            f"no serving node of {plan.base_model!r} answered for the judge {model!r}"
            + (f": {failures[-1]}" if failures else " (none is running: start `mint serve --base ...`)")
        )


def grade_episode(
    session: Session,
    principal: Principal,
    key: str,
    body: EpisodeReward,
    *,
    quotas: QuotaDefaults,
    shared_token: str | None,
    allow_private: bool = False,
) -> Episode:
    """Reward episode `key` with the score `body.grader` gives it against `body.reference`. A
    `remote` grader sends the episode's first prompt and what came after it to the organization's
    reward endpoint (`allow_private`: the webhooks' egress setting)."""
    assert body.grader is not None
    spec = GraderSpec.model_validate(body.grader)
    check_graders(session, principal.organization_id, [spec], param="grader")
    episode = episodes.get_episode(session, principal.organization_id, key)
    turns = episodes.turns_of(session, [episode.id])[episode.id]
    public = episodes.episode_public(episode, turns, whole=True)
    output: Any = episodes.trajectory_output(public)
    prompt = public.turns[0].added_messages if public.turns else []
    context = GradeContext(
        judge=_Judge(session, principal.organization_id, shared_token),
        reward=RemoteRewards(principal.organization_id, allow_private=allow_private, session=session),
    ).about(prompt, {}, episode.task)
    graded = grade(spec, output, body.reference, context=context)
    scored = body.model_copy(
        update={"score": graded.score, "grader": None, "comment": body.comment or (graded.detail[:MAX_COMMENT] or None)}
    )
    return episodes.reward_episode(
        session, principal, key, scored, quotas=quotas, episode=episode, by=f"{spec.type} grader"
    )
