"""Calling a reward endpoint: `GradeContext.reward` for the `remote` grader, in eval runs, RL
jobs and episode rewards.

One output is one `reward.request` of one item, POSTed to the endpoint the grader names (looked
up by name or id in the organization at each call, so a changed URL or a rotated secret counts
at once), signed as webhooks are (Standard Webhooks headers; the `webhook-id` is new per
request and the same on its retries, so a receiver can drop a repeat). Like a webhook delivery
(`mint.services.webhooks.egress`), the host is resolved once and checked, the connection goes to
the address checked, no redirect is followed, and at most MAX_REWARD_ANSWER_BYTES of the answer is
read; unlike one, the caller waits for the answer, so the whole call (its retries included)
ends within the grader's `timeout_s`.

A 5xx, a 429 or a connection error is tried again after a doubling wait (from RETRY_WAIT_S), up
to the grader's `retries`, while the deadline leaves time; any other 4xx is the endpoint
refusing the request and is not retried. Anything but a 200 whose body is
`{"rewards": [one finite number], "details": [str | null]?}` raises `RewardUnavailable` saying
what went wrong, which the grader turns into a grade of 0 with that detail.

An RL job's graders reach the endpoints through `ContextGrader` (`graders_for`), bound to
each prompt row by the recipe.
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.orm import Session

from mint.config import Settings
from mint.evals.graders import GradeContext, GraderSpec, RewardUnavailable, grade
from mint.evals.graders.spec import penalized
from mint.schemas.reward_endpoints import MAX_REWARD_ANSWER_BYTES, REWARD_REQUEST_TYPE
from mint.services.evals.reward_endpoints import find_endpoint
from mint.services.webhooks import egress
from mint.services.webhooks.delivery import signed_headers
from mint.storage.db import session_scope
from mint.storage.tables import new_id

# The wait before the first retry, doubling per retry.
RETRY_WAIT_S = 0.2
# The start of an answer quoted in a failure's message.
EXCERPT_CHARS = 200
# The grades an RL grader remembers, so that explaining a sample it just scored asks no endpoint again.
REMEMBERED_GRADES = 256


def _excerpt(body: bytes) -> str:
    text = body[:EXCERPT_CHARS].decode("utf-8", errors="replace")
    return repr(text + ("..." if len(body) > EXCERPT_CHARS else ""))


def read_answer(body: bytes, count: int) -> list[tuple[float, str | None]]:
    """The rewards (and details) of a 200 answer to `count` items; RewardUnavailable says what is wrong."""
    if len(body) > MAX_REWARD_ANSWER_BYTES:
        raise RewardUnavailable(
            f"oversized answer: more than {MAX_REWARD_ANSWER_BYTES} bytes (the protocol's bound is 1 MiB)"
        )
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise RewardUnavailable(f"malformed answer: not JSON ({exc}): {_excerpt(body)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rewards"), list):
        raise RewardUnavailable(f'malformed answer: expected {{"rewards": [number, ...]}}, got {_excerpt(body)}')
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


class RemoteRewards:
    """`GradeContext.reward` for one organization: asks its reward endpoint for an item's reward.

    `session`, where given, is the one the endpoint is read with (an API request's); else each
    call reads the endpoint in a short session of its own on `database` (a worker's), closed
    before the POST so that no database connection waits on a slow endpoint. `allow_private`
    is the webhooks' egress setting (`MINT_WEBHOOK_ALLOW_PRIVATE_NETWORKS`).
    """

    def __init__(
        self, organization_id: str, *, allow_private: bool, database: str | None = None, session: Session | None = None
    ) -> None:
        assert (database is None) != (session is None), "give the database or the session to read endpoints with"
        self.organization_id, self.allow_private = organization_id, allow_private
        self.database, self.session = database, session

    @classmethod
    def of(cls, settings: Settings, organization_id: str) -> RemoteRewards:
        """The organization's endpoints as a worker calls them, on the settings' database and egress policy."""
        return cls(organization_id, allow_private=settings.webhook_allow_private_networks, database=settings.database)

    def _endpoint(self, ref: str) -> tuple[str, str]:
        if self.session is not None:
            found = find_endpoint(self.session, self.organization_id, ref)
            endpoint = (found.url, found.secret) if found is not None else None
        else:
            assert self.database is not None
            with session_scope(self.database) as session:
                found = find_endpoint(session, self.organization_id, ref)
                endpoint = (found.url, found.secret) if found is not None else None
        if endpoint is None:
            raise RewardUnavailable(
                "this organization has no such reward endpoint (deleted?); create it with POST /v1/reward_endpoints"
            )
        return endpoint

    def __call__(self, ref: str, item: Mapping[str, Any], timeout_s: float, retries: int) -> tuple[float, str | None]:
        url, secret = self._endpoint(ref)
        try:
            body = json.dumps({"type": REWARD_REQUEST_TYPE, "items": [item]}, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise RewardUnavailable(f"the item cannot be sent as JSON: {exc}") from None
        request_id = new_id("rwreq")
        deadline = time.monotonic() + timeout_s
        timed_out = f"timeout: no answer within the grader's timeout_s of {timeout_s:g} s"
        for attempt in range(retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RewardUnavailable(timed_out + (f" ({attempt} attempts)" if attempt > 1 else ""))
            try:
                destination = egress.resolve(url, allow_private=self.allow_private)
                answer = egress.send(
                    destination,
                    method="POST",
                    headers=signed_headers(secret, request_id, body),
                    body=body.encode(),
                    deadline_s=left,
                    answer_bytes=MAX_REWARD_ANSWER_BYTES + 1,  # one byte more tells an answer over the bound
                )
            except egress.DeadlinePassed:
                raise RewardUnavailable(timed_out + (f" ({attempt + 1} attempts)" if attempt else "")) from None
            except egress.ConnectionFailed as exc:
                failure = f"connection failed: {exc}"
            except egress.EgressError as exc:  # not public, or not resolvable: another try would not help
                raise RewardUnavailable(str(exc)) from None
            else:
                status = answer.status_code
                if status == 200:
                    ((reward, detail),) = read_answer(answer.body_prefix, 1)
                    return reward, detail
                failure = f"the endpoint answered HTTP {status}: {_excerpt(answer.body_prefix)}"
                if status != 429 and status < 500:
                    raise RewardUnavailable(f"{failure} (not retried: a reward endpoint answers 200 with its rewards)")
            if attempt == retries:
                break
            wait_s = RETRY_WAIT_S * 2**attempt
            if time.monotonic() + wait_s >= deadline:
                raise RewardUnavailable(f"{failure}; no time was left within timeout_s {timeout_s:g} s to retry")
            time.sleep(wait_s)
        tries = f"{retries + 1} attempts" if retries else "1 attempt, retries 0"
        raise RewardUnavailable(f"{failure} (after {tries})")


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
