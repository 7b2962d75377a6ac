"""Calling a reward endpoint: `GradeContext.reward` for the `remote` grader, in eval runs, RL
jobs and episode rewards.

One output is one `reward.request` of one item, POSTed to the endpoint the grader names through
`mint.services.evals.team_endpoints` (signed, egress-checked, retried within the grader's
`timeout_s` and `retries`), reading at most MAX_REWARD_ANSWER_BYTES of the answer. Anything but
a 200 whose body is
`{"rewards": [one finite number], "details": [str | null]?}` raises `RewardUnavailable` saying
what went wrong, which the grader turns into a grade of 0 with that detail.

An RL job's graders reach the endpoints through `ContextGrader` (`graders_for`), bound to
each prompt row by the recipe.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from mint.config import Settings
from mint.evals.graders import GradeContext, GraderSpec, RewardUnavailable, grade
from mint.evals.graders.spec import penalized
from mint.schemas.reward_endpoints import MAX_REWARD_ANSWER_BYTES, REWARD_REQUEST_TYPE
from mint.services.evals.team_endpoints import EndpointFailed, TeamEndpoints, excerpt

# The grades an RL grader remembers, so that explaining a sample it just scored asks no endpoint again.
REMEMBERED_GRADES = 256


def read_answer(body: bytes, count: int) -> list[tuple[float, str | None]]:
    """The rewards (and details) of a 200 answer to `count` items; RewardUnavailable says what is wrong."""
    if len(body) > MAX_REWARD_ANSWER_BYTES:
        raise RewardUnavailable(
            f"oversized answer: more than {MAX_REWARD_ANSWER_BYTES} bytes (the protocol's bound is 1 MiB)"
        )
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise RewardUnavailable(f"malformed answer: not JSON ({exc}): {excerpt(body)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rewards"), list):
        raise RewardUnavailable(f'malformed answer: expected {{"rewards": [number, ...]}}, got {excerpt(body)}')
    rewards: list[Any] = data["rewards"]
    if len(rewards) != count:
        raise RewardUnavailable(f"wrong count: {len(rewards)} rewards for {count} item(s); send one per item, in order")
    details: Any = data.get("details")
    if details is not None and not (
        isinstance(details, list)
        and len(details) == count
        and all(detail is None or isinstance(detail, str) for detail in details)
    ):
        raise RewardUnavailable(f'malformed answer: "details" must be a list of {count} strings or nulls')
    answered: list[tuple[float, str | None]] = []
    for index, reward in enumerate(rewards):
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise RewardUnavailable(f"malformed answer: rewards[{index}] is {reward!r}, not a number")
        if not math.isfinite(reward):
            raise RewardUnavailable(f"non-finite reward: rewards[{index}] is {reward!r}; send a finite number")
        answered.append((float(reward), details[index] if details is not None else None))
    return answered


class RemoteRewards(TeamEndpoints):
    """`GradeContext.reward` for one organization: asks its reward endpoint for an item's reward."""

    def __call__(self, ref: str, item: Mapping[str, Any], timeout_s: float, retries: int) -> tuple[float, str | None]:
        try:
            body = json.dumps({"type": REWARD_REQUEST_TYPE, "items": [item]}, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise RewardUnavailable(f"the item cannot be sent as JSON: {exc}") from None
        try:
            answer = self.post(
                ref,
                body,
                timeout_s=timeout_s,
                retries=retries,
                answer_bytes=MAX_REWARD_ANSWER_BYTES,
                refusal_hint="a reward endpoint answers 200 with its rewards",
            )
        except EndpointFailed as exc:
            raise RewardUnavailable(str(exc)) from None
        ((reward, detail),) = read_answer(answer, 1)
        return reward, detail


def _output_key(output: Any) -> str:
    return json.dumps(output, sort_keys=True, default=str)


class ContextGrader:
    """A grader spec with what its graders may call (`context`: reward endpoints, for an RL job),
    as the RL recipe uses a grader (`mint.trainer.recipes.common.Grader`).

    The recipe binds it to each prompt row (`for_row`), so that a `remote` grader sends the
    row's messages, `data_source`, `extra_info` and `columns`. It remembers the details of
    the grades it gave lately, so that `explain` (a step's shown samples) does not ask the
    endpoint a second time.
    """

    def __init__(self, spec: GraderSpec, context: GradeContext) -> None:
        self.spec, self.context = spec, context
        self._details: OrderedDict[str, str] = OrderedDict()

    def for_row(self, row: Mapping[str, Any]) -> ContextGrader:
        """This grader for the samples of one prompt row."""
        metadata = row.get("metadata")
        task_id = metadata.get("task_id") if isinstance(metadata, Mapping) else None
        prompt = row.get("messages") or []
        return ContextGrader(self.spec, self.context.about(prompt, row, task_id if isinstance(task_id, str) else None))

    def reward(self, output: Any, reference: Any, *, steps: int = 1, tokens: int = 0) -> float:
        graded = grade(self.spec, output, reference, context=self.context)
        self._details[_output_key(output)] = graded.detail
        while len(self._details) > REMEMBERED_GRADES:
            self._details.popitem(last=False)
        return penalized(graded.score, self.spec.penalties, steps, tokens)

    def explain(self, output: Any, reference: Any) -> str:
        known = self._details.get(_output_key(output))
        if known is not None:
            return known
        return grade(self.spec, output, reference, context=self.context).detail


def graders_for(settings: Settings, organization_id: str) -> Callable[[dict[str, Any]], ContextGrader]:
    """An RL job's `grader_for`: each grader spec of its plan (or of a mined row) as a
    `ContextGrader` that calls the organization's reward endpoints."""
    context = GradeContext(reward=RemoteRewards.of(settings, organization_id))

    def grader_for(data: dict[str, Any]) -> ContextGrader:
        return ContextGrader(GraderSpec.model_validate(data), context)

    return grader_for
