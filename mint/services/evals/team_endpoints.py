"""Calling an endpoint a team hosts and registered with Mint (`/v1/reward_endpoints`): a reward
server the `remote` grader asks, or an environment server whose episodes eval runs and RL jobs
play (`mint.services.evals.remote_environments`).

One call is one JSON body POSTed to the endpoint named (looked up by name or id in the
organization at each call, so a changed URL or a rotated secret counts at once), signed as
webhooks are (Standard Webhooks headers; the `webhook-id` is new per call and the same on its
retries, so a receiver can drop a repeat or answer it again). Like a webhook delivery
(`mint.services.webhooks.egress`), the host is resolved once and checked, the connection goes to
the address checked, no redirect is followed, and at most the caller's bound of the answer is
read; unlike one, the caller waits for the answer, so the whole call (its retries included)
ends within its `timeout_s`.

A 5xx, a 429 or a connection error is tried again after a doubling wait (from RETRY_WAIT_S), up
to `retries`, while the deadline leaves time; any other 4xx is the endpoint refusing the request
and is not retried. Anything but a 200 raises `EndpointFailed` saying what went wrong.
"""

from __future__ import annotations

import time
from typing import Self

from sqlalchemy.orm import Session

from mint.config import Settings
from mint.services.evals.reward_endpoints import find_endpoint
from mint.services.webhooks import egress
from mint.services.webhooks.delivery import signed_headers
from mint.storage.db import session_scope
from mint.storage.tables import new_id

# The wait before the first retry, doubling per retry.
RETRY_WAIT_S = 0.2
# The start of an answer quoted in a failure's message.
EXCERPT_CHARS = 200


class EndpointFailed(Exception):
    """The endpoint gave no usable answer; the message says why (timeout, HTTP status, size...)."""


def excerpt(body: bytes) -> str:
    """The start of an answer, quoted, for a failure's message."""
    text = body[:EXCERPT_CHARS].decode("utf-8", errors="replace")
    return repr(text + ("..." if len(body) > EXCERPT_CHARS else ""))


class TeamEndpoints:
    """One organization's registered endpoints, called by name.

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
    def of(cls, settings: Settings, organization_id: str) -> Self:
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
            raise EndpointFailed(
                f"this organization has no endpoint {ref!r} (deleted?); register it with POST /v1/reward_endpoints"
            )
        return endpoint

    def post(
        self, ref: str, body: str, *, timeout_s: float, retries: int, answer_bytes: int, refusal_hint: str
    ) -> bytes:
        """The body of the endpoint's 200 answer to `body`, at most `answer_bytes` long; `refusal_hint`
        ends the message of a 4xx (what the endpoint should have answered)."""
        url, secret = self._endpoint(ref)
        request_id = new_id("rwreq")
        deadline = time.monotonic() + timeout_s
        timed_out = f"timeout: no answer within the timeout_s of {timeout_s:g} s"
        for attempt in range(retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise EndpointFailed(timed_out + (f" ({attempt} attempts)" if attempt > 1 else ""))
            try:
                destination = egress.resolve(url, allow_private=self.allow_private)
                answer = egress.send(
                    destination,
                    method="POST",
                    headers=signed_headers(secret, request_id, body),
                    body=body.encode(),
                    deadline_s=left,
                    answer_bytes=answer_bytes + 1,  # one byte more tells an answer over the bound
                )
            except egress.DeadlinePassed:
                raise EndpointFailed(timed_out + (f" ({attempt + 1} attempts)" if attempt else "")) from None
            except egress.ConnectionFailed as exc:
                failure = f"connection failed: {exc}"
            except egress.EgressError as exc:  # not public, or not resolvable: another try would not help
                raise EndpointFailed(str(exc)) from None
            else:
                status = answer.status_code
                if status == 200:
                    return answer.body_prefix
                failure = f"the endpoint answered HTTP {status}: {excerpt(answer.body_prefix)}"
                if status != 429 and status < 500:
                    raise EndpointFailed(f"{failure} (not retried: {refusal_hint})")
            if attempt == retries:
                break
            wait_s = RETRY_WAIT_S * 2**attempt
            if time.monotonic() + wait_s >= deadline:
                raise EndpointFailed(f"{failure}; no time was left within timeout_s {timeout_s:g} s to retry")
            time.sleep(wait_s)
        tries = f"{retries + 1} attempts" if retries else "1 attempt, retries 0"
        raise EndpointFailed(f"{failure} (after {tries})")
